"""A lab description's weakened controls: one list (gpupool.render.lab_controls), printed by
`gpupool validate` as warnings and reported by the policy pack as advisory violations; empty
for production; every lab switch in the roles, the gate and the renderers is on it."""

from __future__ import annotations

import json
import re

import pytest

from gpupool import cli
from gpupool.render import lab_controls, slurm
from gpupool.render.lab_controls import weakened
from gpupool.spec import loader
from policies.catalog import POLICIES
from policies.core import Level
from tests._policy import recorded, violations
from tests.conftest import ROOT, mutate, raw_stack

POLICY = "hygiene-lab-weakened-controls"


def _lab(ops: list[dict] | None = None):  # type: ignore[no-untyped-def]
    return loader.parse(mutate(raw_stack("lab"), ops or []), "lab")


def test_production_weakens_nothing() -> None:
    assert weakened(loader.load_stack("example", ROOT)) == []


def test_the_lab_lists_what_it_weakens() -> None:
    controls = [w.control for w in weakened(_lab())]
    assert controls == ["slurm-job-confinement", "fixture-gpus", "gate-gpu-checks",
                        "gate-storage-checks", "ssh-root-login", "burst-through-relay",
                        "lab-keys-in-checkout", "controller-login", "health-actions-recorded",
                        "version-floors"]
    confinement, gpus = weakened(_lab())[:2]
    assert "ProctrackType=proctrack/linuxproc instead of proctrack/cgroup" in confinement.detail
    assert gpus.detail.startswith("20 GPUs are FIXTURE")  # 5 nodes' worth, from gres.conf
    floors = weakened(_lab())[-1]
    assert floors.where == "software.slurm" and "CVE-2025-43904" in floors.detail
    assert "pin 22.05.8-4+deb12u3 or later" in floors.detail


def test_entries_from_the_description_hold_only_where_it_says_so() -> None:
    lab = _lab([{"set": "pool.controller_login", "value": False},
                {"set": "nodes.lab-ctl.roles", "value": ["controller"]},
                {"set": "health.reboot", "value": "act"},
                {"set": "software.slurm", "value": "22.05.8-4+deb12u3"}])
    controls = {w.control for w in weakened(lab)}
    assert not controls & {"controller-login", "health-actions-recorded", "version-floors"}
    assert "slurm-job-confinement" in controls


def test_every_lab_switch_is_on_the_list() -> None:
    """A new lab branch in a role's defaults, a gate suite or the Slurm renderer fails here
    until an entry names its file."""
    named = " ".join(w.where for w in weakened(_lab()))
    switches = {str(p.relative_to(ROOT)) for p in (ROOT / "roles").glob("*/defaults/main.yml")
                if re.search(r"environment == 'lab'", p.read_text())}
    switches |= {str(p.relative_to(ROOT))
                 for p in (ROOT / "gpupool" / "gate" / "suites").glob("*.py")
                 if "expect.lab" in p.read_text()}
    assert switches >= {"roles/hardening/defaults/main.yml", "roles/slurm/defaults/main.yml",
                        "gpupool/gate/suites/test_gpu.py"}
    # The slurm role's database buffer size is sizing, not a control.
    for path in sorted(switches):
        text = (ROOT / path).read_text()
        if path == "roles/slurm/defaults/main.yml":
            assert "slurm_burst_mode" in named and "slurm_db_buffer_pool_size" in text
        assert path in named, f"{path} switches on the lab; name what it weakens"
    for key in lab_controls.SLURM_CONFINEMENT:
        assert slurm.TUNING["lab"].get(key) != slurm.TUNING["production"].get(key), key
    lab = _lab()
    assert slurm.cgroup_conf(lab) != slurm.cgroup_conf(loader.load_stack("example", ROOT))
    assert "AutoDetect=nvml" not in slurm.gres_conf(lab)


def test_every_named_file_exists() -> None:
    for w in weakened(_lab()):
        for path in re.findall(r"[\w./-]+\.(?:py|yml)", w.where):
            assert (ROOT / path).is_file(), (w.control, path)


def test_validate_warns_and_stays_valid(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", "--stack", "lab", "--json"]) == cli.EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is True and report["problems"] == []
    assert report["warnings"] == [{"rule": "lab-weakens", **w.as_dict()}
                                  for w in weakened(loader.load_stack("lab", ROOT))]
    assert cli.main(["validate", "--stack", "lab"]) == cli.EXIT_OK
    text = capsys.readouterr().out
    assert "weakens 10 control(s)" in text and "fixture-gpus" in text
    assert cli.main(["validate", "--stack", "example", "--json"]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out)["warnings"] == []


@pytest.mark.parametrize("stack", ["lab", "example"])
def test_the_policy_pack_reports_the_same_list_as_advisories(stack: str) -> None:
    assert POLICIES[POLICY].level is Level.ADVISORY
    desc = loader.load_stack(stack, ROOT)
    found = [v for v in violations(recorded(stack), stack) if v.policy == POLICY]
    assert sorted(v.message for v in found) == sorted(f"lab weakens {w}" for w in weakened(desc))
    assert all(v.level == "advisory" and v.resource == "stack" for v in found)
    assert bool(found) == (stack == "lab")
