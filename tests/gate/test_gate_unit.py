"""The gate's parsers, action map and verdict logic, and the gate run locally on this
(GPU-less) machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpupool.gate import probes, runner
from gpupool.gate.actions import Action, worst, xid_action
from gpupool.gate.expect import node_expect
from gpupool.gate.nvidia import (
    parse_dcgm_diag,
    parse_dcgm_health,
    parse_nvlink_status,
    parse_query,
    parse_xids,
)
from gpupool.gate.plugin import verdict
from gpupool.render import ansible_yaml, inventory
from gpupool.spec import loader
from tests.conftest import GPUPOOL, ROOT, mutate, raw_stack

FIXTURES = Path(__file__).parent / "fixtures"


def test_parse_query_fixture() -> None:
    gpus = parse_query((FIXTURES / "nvidia-smi-query-h100.csv").read_text())
    assert [g.index for g in gpus] == [0, 1, 2]
    assert gpus[0].memory_mib == 81559 and gpus[0].driver == "570.195.03"
    assert gpus[0].bad_throttle == []  # 0x1 is GPU idle: normal
    assert gpus[1].bad_throttle == ["hw_thermal_slowdown"]
    assert gpus[1].uncorrected_ecc == 2 and gpus[1].remap_pending is True
    assert (gpus[1].pcie_width, gpus[1].pcie_width_max) == (8, 16)
    assert gpus[2].ecc_enabled is False and gpus[2].uncorrected_ecc is None
    assert gpus[2].persistence is False


def test_parse_query_recorded_on_h200() -> None:
    # Recorded on the lent H200 host: retired pages are [N/A] on Hopper (it remaps rows).
    [gpu] = parse_query((FIXTURES / "nvidia-smi-query-h200.recorded.csv").read_text())
    assert (gpu.name, gpu.memory_mib, gpu.driver) == ("NVIDIA H200", 143771, "580.159.04")
    assert gpu.retired_pending is None and gpu.remap_pending is False
    assert gpu.persistence and gpu.ecc_enabled and gpu.uncorrected_ecc == 0
    assert (gpu.pcie_gen, gpu.pcie_width, gpu.pcie_width_max) == (5, 16, 16)
    assert gpu.bad_throttle == [] and gpu.temperature_c == 29


def test_gate_command_needs_only_the_gate_packages() -> None:
    # A GPU node runs `python -m gpupool gate --local` with pydantic, yaml, rich, pytest and
    # testinfra only: the gate must not pull in the control host's libraries.
    code = ("import sys; from gpupool import cli; cli.build_parser('gate'); "
            "heavy = {'pulumi', 'matplotlib', 'boto3', 'ansible', 'jsonschema'} "
            "& set(sys.modules); "
            "assert not heavy, heavy; assert 'gate' in cli.COMMANDS")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    help_ = subprocess.run([*GPUPOOL, "--help"],
                           check=True, cwd=ROOT, capture_output=True, text=True).stdout
    assert all(c in help_ for c in ("gate", "plan", "audit", "lab", "replay"))


def test_gate_checks_share_ansibles_ssh_connections(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Each check is one SSH command: without a shared ControlPath each paid a handshake.
    from testinfra.utils.ansible_runner import AnsibleRunner  # noqa: PLC0415

    desc = loader.load_stack("lab", ROOT)
    inv = tmp_path / "inventory.yml"
    inv.write_text(ansible_yaml.dump(inventory.build(desc, {"ansible_user": "root"})))
    monkeypatch.chdir(tmp_path)  # not the repository: the gate names its ansible.cfg itself
    for key in ("ANSIBLE_CONFIG", "PATH"):
        monkeypatch.setenv(key, runner.suite_env()[key])
    host = AnsibleRunner(str(inv)).get_host("lab-gpu1")
    cmd, args = host.backend._build_ssh_command("true")
    line = " ".join(cmd) % tuple(args)
    assert f"ControlPath={runner.CONTROL_PATH_DIR}/%C" in line, line
    address = desc.nodes["lab-gpu1"].addresses["management"]
    assert "ControlMaster=auto" in line and line.endswith(f"{address} true")


def test_parse_query_rejects_wrong_shape() -> None:
    with pytest.raises(ValueError, match="expected 17 fields"):
        parse_query("0, NVIDIA H100\n")


def test_parse_nvlink_fixture() -> None:
    links = parse_nvlink_status((FIXTURES / "nvlink-status.txt").read_text())
    assert links == {0: {0: True, 1: True}, 1: {0: True, 1: False}}


def test_parse_dcgm_diag_fixture() -> None:
    results = parse_dcgm_diag((FIXTURES / "dcgmi-diag-r1.json").read_text())
    assert results["Persistence Mode"] == "Fail"
    assert results["Environmental Variables"] == "Warn"
    assert results["Denylist"] == "Pass"
    assert results["Page Retirement/Row Remap"] == "Skip"


def test_xids_map_to_actions() -> None:
    xids = parse_xids((FIXTURES / "kernel-xid.log").read_text())
    assert xids == [("0000:3b:00", 13), ("0000:86:00", 79)]
    assert [xid_action(c) for _, c in xids] == [Action.MONITOR, Action.REBOOT]
    assert worst([xid_action(c) for _, c in xids]) is Action.REBOOT
    assert xid_action(95) is Action.ISOLATE
    assert xid_action(9999) is Action.ISOLATE  # unknown: keep it out until triaged


def test_verdict() -> None:
    ok = {"status": "pass"}
    assert verdict([ok, {"status": "skip"}], 0) == "pass"
    assert verdict([ok, {"status": "fail"}, {"status": "error"}], 1) == "fail"
    assert verdict([ok, {"status": "error"}], 1) == "could-not-run"
    assert verdict([], 0) == "could-not-run"
    assert verdict([ok], 2) == "could-not-run"


def test_expectations_come_from_the_description() -> None:
    desc = loader.load_stack("example", ROOT)
    e = node_expect(desc, "h100-a1")
    assert e.gpu is not None
    assert (e.gpu.count, e.gpu.product, e.gpu.nvswitch) == (8, "NVIDIA H100 80GB HBM3", True)
    assert e.software["nvidia_driver"] == desc.software.nvidia_driver
    assert {m.path for m in e.mounts} == {"/scratch", "/datasets", "/checkpoints"}
    assert node_expect(desc, "mgmt1").gpu is None
    lab = loader.load_stack("lab", ROOT)
    probes = {p.id: p.allowed for p in node_expect(lab, "lab-gpu1").probes}
    assert probes["lab-gpu2/training:8081"] is True  # training<->training: all protocols
    assert probes["lab-ctl/storage:2049"] is True  # training -> storage NFS
    assert probes["lab-ctl/management:6817"] is True  # slurmctld on management
    assert probes["lab-ctl/storage:8081"] is False  # nothing declared


def _gate_local(description: Path, node: str, out: Path) -> tuple[int, dict]:
    proc = subprocess.run([*GPUPOOL, "gate", node, "--local", "--file", str(description),
                           "--suite", "gpu", "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=120, check=False)
    return proc.returncode, json.loads(proc.stdout)["reports"][0]


def test_gpu_suite_skips_without_gpu_in_the_lab(tmp_path: Path) -> None:
    rc, report = _gate_local(loader.description_path("lab", ROOT), "lab-gpu1", tmp_path)
    assert rc == 0 and report["verdict"] == "pass"
    assert report["checks"] and all(c["status"] == "skip" for c in report["checks"])
    assert {c["message"].split(" (")[0] for c in report["checks"]} == {"no NVIDIA GPU"}
    assert json.loads((tmp_path / "lab-gpu1.json").read_text())["node"] == "lab-gpu1"


def test_gpu_node_without_driver_fails_in_production(tmp_path: Path) -> None:
    # Same node, declared as production: a GPU node with no driver must not pass.
    # (with Debian's fixed Slurm: production refuses the lab's 22.05.8, spec/floors.py)
    data = mutate(raw_stack("lab"), [{"set": "pool.environment", "value": "production"},
                                     {"set": "software.slurm", "value": "22.05.8-4+deb12u3"}])
    src = tmp_path / "prod.yaml"
    src.write_text(yaml.safe_dump(data))
    rc, report = _gate_local(src, "lab-gpu1", tmp_path / "out")
    assert rc == 1 and report["verdict"] == "fail"
    assert report["failed"] == ["gpu.driver_loaded"]
    assert report["action"] == "reboot"


def _software_expectations(*args: str, out: Path) -> tuple[int, dict[str, str], str]:
    proc = subprocess.run([*GPUPOOL, "gate", "lab-gpu1", "--local", "--stack", "lab",
                           "--suite", "software", "--out", str(out), "--json", *args],
                          capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)
    if proc.returncode == 2:
        return 2, {}, proc.stderr
    checks = json.loads(proc.stdout)["reports"][0]["checks"]
    return proc.returncode, {c["id"]: c["expected"]["version"] for c in checks
                             if c["id"].startswith("software.locked_version_held")}, ""


def test_gate_lock_overrides_the_expected_versions(tmp_path: Path) -> None:
    """A rollback gates nodes on the previous lock: --lock replaces the description's
    version for that component only."""
    lock = loader.load_stack("lab", ROOT).software
    _, plain, _ = _software_expectations(out=tmp_path / "a")
    _, over, _ = _software_expectations("--lock", "nvidia_driver=535.261.03",
                                        "--lock", "dcgm=3.3.8", out=tmp_path / "b")
    driver, dcgm = ("software.locked_version_held[nvidia_driver]",
                    "software.locked_version_held[dcgm]")
    assert plain[driver] == lock.nvidia_driver and plain[dcgm] == lock.dcgm
    assert (over[driver], over[dcgm]) == ("535.261.03", "3.3.8")
    assert {k: v for k, v in over.items() if k not in (driver, dcgm)} == \
        {k: v for k, v in plain.items() if k not in (driver, dcgm)}


@pytest.mark.parametrize(("lock", "says"), [
    ("nvidia_driver", "expected COMPONENT=VERSION"),
    ("blocklist=1.0", "expected COMPONENT=VERSION"),
    ("kernel=6.1", "expected COMPONENT=VERSION"),
    ("nvidia_driver=535 .1", "String should match pattern"),
    ("nvidia_driver=535.1;reboot", "String should match pattern"),
])
def test_gate_lock_refuses_what_is_not_a_component_version(tmp_path: Path, lock: str,
                                                           says: str) -> None:
    rc, _, stderr = _software_expectations("--lock", lock, out=tmp_path)
    assert rc == 2 and says in " ".join(stderr.split()), stderr
    assert "Traceback" not in stderr


def test_printed_expectations_carry_the_lock_and_refuse_a_bad_one() -> None:
    """--print-expect shows what the gate would check, so a --lock applies there too, and
    one that is not a component's version is refused there as well, not ignored."""
    def printed(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*GPUPOOL, "gate", "lab-gpu1", "--stack", "lab", "--print-expect",
                               *args], capture_output=True, text=True, timeout=60, check=False,
                              cwd=ROOT)
    over = printed("--lock", "nvidia_driver=535.261.03")
    assert over.returncode == 0, over.stderr
    software = json.loads(over.stdout)["lab-gpu1"]["software"]
    assert software["nvidia_driver"] == "535.261.03"
    assert software["dcgm"] == loader.load_stack("lab", ROOT).software.dcgm
    bad = printed("--lock", "nvidia_driver")
    assert bad.returncode == 2 and "expected COMPONENT=VERSION" in bad.stderr, bad.stderr


def test_printed_probes_are_the_suites_and_only_where_the_tier_reads_them() -> None:
    """--print-probes gives role admission the commands the network suite would run on each
    peer (gpupool/gate/probes.py), and none at a tier whose checks read no probe."""
    def printed(tier: str) -> dict[str, dict[str, str]]:
        proc = subprocess.run([*GPUPOOL, "gate", "lab-gpu1", "lab-gpu2", "--stack", "lab",
                               "--print-probes", f"--tier={tier}"], capture_output=True,
                              text=True, timeout=60, check=False, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)
    desc = loader.load_stack("lab", ROOT)
    assert printed("quick") == {"lab-gpu1": {}, "lab-gpu2": {}}
    for tier in ("standard", "burn-in"):
        got = printed(tier)
        assert got == {n: probes.commands(node_expect(desc, n)) for n in ("lab-gpu1", "lab-gpu2")}
        assert all(got[n] for n in got)
        assert all(peer != n for n in got for peer in got[n])  # never from the node itself
    both = subprocess.run([*GPUPOOL, "gate", "--stack", "lab", "--print-expect",
                           "--print-probes"], capture_output=True, text=True, timeout=60,
                          check=False, cwd=ROOT)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr, both.stderr


def test_a_misspelt_suite_is_refused_not_an_empty_pass(tmp_path: Path) -> None:
    proc = subprocess.run([*GPUPOOL, "gate", "lab-gpu1", "--local", "--stack", "lab",
                           "--suite", "sytem", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=60, check=False, cwd=ROOT)
    assert proc.returncode == 2 and "invalid choice: 'sytem'" in proc.stderr, proc.stderr
    assert set(runner.SUITE_NAMES) == {"system", "software", "gpu", "slurm", "storage",
                                       "network"}


def test_parse_dcgm_health_record() -> None:
    record = parse_dcgm_health('{"status": "fail", "exit_code": 2, "checked_at": '
                               '"2026-12-02T19:24:51Z", "detail": "GPU 3: PCIe replays"}')
    assert record.status == "fail" and record.detail == "GPU 3: PCIe replays"
    assert record.checked_at.isoformat() == "2026-12-02T19:24:51+00:00"


@pytest.mark.parametrize("text", ["", "[]", '{"status": "pass"}', '{"status": "odd", '
                                  '"checked_at": "2026-12-02T19:24:51Z"}',
                                  '{"status": "pass", "checked_at": "yesterday"}'])
def test_parse_dcgm_health_refuses_what_the_timer_does_not_write(text: str) -> None:
    with pytest.raises(ValueError, match="not a DCGM health record"):
        parse_dcgm_health(text)
