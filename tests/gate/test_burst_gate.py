"""A burst node's gate at boot (gpupool/gate/boot.py): its expectation from the facts its
user-data writes, handed to the suites as JSON, and the one-line drain reason; run for real
on this GPU-less machine, where it must not pass."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.gate import boot
from gpupool.gate.expect import FactsError, NodeExpect, burst_expect, node_expect
from gpupool.render.cloud import launch
from gpupool.spec import loader, os_release
from gpupool.spec.catalog import GPU_MODELS, INSTANCE_TYPES
from gpupool.spec.model import NodeRole
from tests.conftest import ROOT
from tests.test_pool_defaults import resolve


def _facts(stack: str = "lab") -> dict:
    desc = loader.load_stack(stack, ROOT)
    name, group = next(iter(desc.burst_groups.items()))
    return json.loads(json.dumps(launch.burst_facts(desc, name, group)))


@pytest.mark.parametrize("stack", ["lab", "example"])
def test_a_burst_node_expects_its_types_gpus_the_lock_and_the_teams(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    name, group = next(iter(desc.burst_groups.items()))
    e = burst_expect(_facts(stack), "n1")
    itype = INSTANCE_TYPES[group.instance_types[0]]
    assert e.gpu is not None
    assert (e.gpu.model, e.gpu.count, e.gpu.memory_gib) == (itype.gpu_model, itype.gpus,
                                                            itype.gpu_memory_gib)
    assert e.gpu.product == GPU_MODELS[itype.gpu_model].product
    assert e.software == os_release.versions(desc, os_release.burst_release(desc))
    assert e.teams == tuple(sorted(desc.teams)) and e.node_class == name
    assert (e.probes, e.addresses) == ((), {})
    assert e.ids == desc.ids.model_dump(mode="json")
    # The tiers, as an on-prem compute node of the pool expects them.
    compute = next(n for n, node in desc.nodes.items() if node.roles == [NodeRole.COMPUTE])
    assert e.mounts and set(e.mounts) == set(node_expect(desc, compute).mounts)


@pytest.mark.parametrize("expect", [lambda: burst_expect(_facts(), "n1"),
                                    lambda: node_expect(loader.load_stack("lab", ROOT),
                                                        "lab-gpu1")])
def test_an_expectation_survives_its_json(expect) -> None:  # type: ignore[no-untyped-def]
    e = expect()
    assert NodeExpect.from_json(e.to_json()) == e


@pytest.mark.parametrize(("key", "value"), [
    ("instance_type", "x9.huge"), ("instance_type", 3), ("software", ["535"]),
    ("teams", "vision"), ("teams", [1]), ("environment", None), ("burst_group", None),
    ("ids", []), ("ids", {"users": {"alice": "20001"}}), ("ids", {"groups": {}}),
    ("ids", {"users": {"alice": True}}), ("mounts", []), ("mounts", {"Bad Tier": {}}),
    ("mounts", {"scratch": {"path": "/scratch; reboot", "fstype": "local"}}),
    ("mounts", {"scratch": {"path": "/scratch", "fstype": "ext9"}}),
    ("mounts", {"scratch": {"path": "/scratch", "fstype": "nfs", "options": ["a b"]}}),
    ("mounts", {"scratch": {"path": "/scratch", "fstype": "local", "extra": 1}})])
def test_facts_that_are_not_the_user_datas_are_refused(key: str, value: object) -> None:
    facts = {**_facts(), key: value}
    with pytest.raises(FactsError, match=key.replace("_", "[_ ]")):
        burst_expect(facts, "n1")


@pytest.mark.parametrize("stack", ["lab", "example"])
def test_a_burst_node_expects_the_release_its_image_was_built_on(stack: str) -> None:
    """The facts name the burst release (the controllers', the image's parent AMI's), and
    the expectation carries it to the suites' OS check, through its JSON too."""
    desc = loader.load_stack(stack, ROOT)
    release = os_release.burst_release(desc).value
    facts = _facts(stack)
    assert facts["os"] == release
    assert launch.ami_name(desc) == f"debian-{facts['os'].removeprefix('debian-')}-amd64-*"
    e = burst_expect(facts, "n1")
    assert e.os == release
    assert NodeExpect.from_json(e.to_json()).os == release


def test_facts_of_an_older_user_data_without_a_release_keep_the_supported_list() -> None:
    """A launch template from before the key wrote no `os`: the node is gated as before,
    on the supported releases alone, and nothing else of its expectation changes."""
    facts = _facts()
    del facts["os"]
    e = burst_expect(facts, "n1")
    assert e.os == ""
    assert e == dataclasses.replace(burst_expect(_facts(), "n1"), os="")


@pytest.mark.parametrize("value", [
    None, 13, 12.0, True, ["debian-13"], {"debian": "13"},  # not a string
    "debian-11", "debian-14", "ubuntu-22.04", "Debian-13", "debian13", "13", "",  # unknown
    "debian-13 ", " debian-13", "debian-13\n", "debian-13; reboot", "$(reboot)",
    "`reboot`", "debian-13' || true #", "debian-13\u0000", "x" * 10_000])
def test_a_release_that_is_not_one_gpupool_knows_is_refused(value: object) -> None:
    with pytest.raises(FactsError, match=r"^burst facts: os must be ") as caught:
        burst_expect({**_facts(), "os": value}, "n1")
    # One line, bounded, the value quoted: the boot's drain reason is built from it.
    message = str(caught.value)
    assert "\n" not in message and len(message) < 200
    if isinstance(value, str):
        assert "one of debian-12, debian-13" in message


def test_the_gate_dir_is_the_roles() -> None:
    """One place on the node: where role acceptance_gate unpacks the gate, where the burst
    boot and role admission run it from."""
    pytest.importorskip("ansible")
    gate_dir = resolve("acceptance_gate", "acceptance_gate_dir")
    assert f"{gate_dir}/lib" == launch.GATE_LIB
    assert resolve("admission", "admission_gate_dir") == gate_dir


def _boot(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpupool.gate.boot", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)


@pytest.mark.parametrize(("facts", "node", "why"), [
    (None, "n1", "No such file"), ("{not json", "n1", "Expecting property name"),
    ('{"instance_type": "g6.12xlarge"}', "n1", "software must be a dict"),
    ("{}", "N1; reboot", "invalid node name")])
def test_a_gate_that_cannot_run_says_why_in_one_line(tmp_path: Path, facts: str | None,
                                                     node: str, why: str) -> None:
    path = tmp_path / "burst.json"
    if facts is not None:
        path.write_text(facts)
    done = _boot(tmp_path, str(path), node, str(tmp_path / "out"))
    assert done.returncode == 3
    [line] = done.stdout.splitlines()
    assert line.startswith("gpupool gate could not run: ") and why in line
    assert len(line) <= boot.REASON_MAX


def test_this_gpu_less_machine_does_not_pass_as_a_burst_node(tmp_path: Path) -> None:
    path = tmp_path / "burst.json"
    path.write_text(json.dumps({**_facts(), "environment": "production"}))
    done = _boot(tmp_path, str(path), "l4-burst-1", str(tmp_path / "out"))
    report = json.loads((tmp_path / "out/l4-burst-1.json").read_text())
    assert done.returncode == 1 and report["verdict"] == "fail", done.stdout + done.stderr
    assert "gpu.driver_loaded" in report["failed"]
    assert done.stdout == boot.reason(report) + "\n"
    assert done.stdout.startswith("gpupool gate failed: ")
    assert len(done.stdout.strip()) <= boot.REASON_MAX
    # The expectation the suites read is kept beside the report.
    saved = NodeExpect.from_json((tmp_path / "out/l4-burst-1.expect.json").read_text())
    assert saved == burst_expect(json.loads(path.read_text()), "l4-burst-1")
    # A burst node's host firewall is checked as an on-prem node's: this machine carries
    # no image's ruleset.
    firewall = next(c for c in report["checks"] if c["id"] == "system.firewall_default_drop")
    assert firewall["status"] == "fail" and firewall["id"] in report["failed"]
