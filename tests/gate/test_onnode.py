"""The gate role admission runs on the node (gpupool/gate/onnode.py): its expectation on
stdin, its report on stdout as one JSON object whatever the input, the verdict as its exit
status; run for real on this GPU-less machine, where a lab node's expectation must not pass."""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.gate import onnode, probes
from gpupool.gate.expect import NodeExpect, node_expect
from gpupool.spec import loader
from tests.conftest import ROOT

NODE = "lab-gpu1"


def _expect(node: str = NODE) -> dict:
    """The node's entry of `gpupool gate --print-expect`."""
    return dataclasses.asdict(node_expect(loader.load_stack("lab", ROOT), node))


def _input(node: str = NODE, **more: object) -> str:
    """What role admission hands the node on stdin."""
    return json.dumps({"expect": _expect(node), **more})


def _run(stdin: str, *args: str) -> tuple[int, dict]:
    out = io.StringIO()
    real = sys.stdout
    sys.stdout = out
    try:
        code = onnode.main(list(args), stdin=io.StringIO(stdin))
    finally:
        sys.stdout = real
    return code, json.loads(out.getvalue())


@pytest.mark.parametrize(("stdin", "args", "why"), [
    ("{not json", (NODE, "quick", "/tmp/r"), "not gpupool's"),
    ('{"expect": {"node": "lab-gpu1"}}', (NODE, "quick", "/tmp/r"), "not gpupool's"),
    (json.dumps(_expect()), (NODE, "quick", "/tmp/r"), "not gpupool's"),
    (_input(extra=1), (NODE, "quick", "/tmp/r"), "not gpupool's"),
    ("[]", (NODE, "quick", "/tmp/r"), "not gpupool's"),
    ("", (NODE, "quick", "/tmp/r"), "not gpupool's"),
    (_input("lab-gpu2"), (NODE, "quick", "/tmp/r"), "is for 'lab-gpu2'"),
    (_input(probes=["lab-ctl"]), (NODE, "quick", "/tmp/r"), "probes must map"),
    (_input(probes={"lab-ctl": 0}), (NODE, "quick", "/tmp/r"), "probes must map"),
    (_input(), ("lab-gpu1; reboot", "quick", "/tmp/r"), "invalid node name"),
    (_input(), (NODE, "burn in", "/tmp/r"), "unknown tier"),
    (_input(), (NODE, "quick", "relative/dir"), "plain absolute path"),
    (_input(), (NODE, "quick", "/var/lib/../../etc"), "plain absolute path"),
    (_input(), (NODE, "quick", "/tmp/r\n/etc"), "plain absolute path")])
def test_input_it_cannot_use_is_a_could_not_run_report(stdin: str, args: tuple[str, ...],
                                                       why: str) -> None:
    code, report = _run(stdin, *args)
    assert code == 3
    assert report["verdict"] == "could-not-run" and why in report["error"], report
    assert report["failed"] == [] and len(report["error"]) <= 300


def test_a_report_directory_it_cannot_write_is_a_could_not_run_report(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    code, report = _run(_input(), NODE, "quick", str(blocked / "reports"))
    assert code == 3 and report["verdict"] == "could-not-run"
    assert "NotADirectoryError" in report["error"] or "FileExistsError" in report["error"]


def test_without_three_arguments_it_prints_the_usage() -> None:
    done = subprocess.run([sys.executable, "-m", "gpupool.gate.onnode", NODE], input="",
                          capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 2 and done.stderr.startswith("usage:") and not done.stdout


def _onnode(out: Path, tier: str, stdin: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    done = subprocess.run([sys.executable, "-m", "gpupool.gate.onnode", NODE, tier, str(out)],
                          input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=300,
                          check=False)
    return done, json.loads(done.stdout)


def test_this_gpu_less_machine_does_not_pass_as_a_lab_gpu_node(tmp_path: Path) -> None:
    """The whole path, as role admission runs it: a real gate on this machine with a lab GPU
    node's expectation fails it, and the report on stdout is the one kept on disk, beside
    the expectation it was checked against."""
    out = tmp_path / "reports"
    done, report = _onnode(out, "quick", _input(probes={}))
    assert done.returncode == 1 and report["verdict"] == "fail", done.stdout + done.stderr
    assert report["node"] == NODE and report["tier"] == "quick"
    assert "software.locked_version_held[nvidia_driver]" in report["failed"]
    assert report == json.loads((out / f"{NODE}.json").read_text())
    saved = NodeExpect.from_json((out / f"{NODE}.expect.json").read_text())
    assert saved == NodeExpect.from_json(json.dumps(_expect()))
    assert json.loads((out / f"{NODE}.probes.json").read_text()) == {}


def test_the_firewall_checks_read_the_peers_output(tmp_path: Path) -> None:
    """At the standard tier the suite reads the probes the role ran on the peers: a flow the
    node should let in that timed out is blocked, an undeclared one that connected leaks;
    a peer that printed nothing errors the checks instead of passing them."""
    expect = NodeExpect.from_json(json.dumps(_expect()))
    commands = probes.commands(expect)
    allowed = next(p for p in expect.probes if p.allowed)
    denied = next(p for p in expect.probes if not p.allowed)

    def output(peer: str) -> str:
        """Every declared flow connects and every other one times out, but the two above."""
        return "\n".join(f"{p.address}:{p.port} "
                         f"{'0' if p.allowed != (p in (allowed, denied)) else '124'}"
                         for p in expect.probes if p.peer == peer)

    _, report = _onnode(tmp_path / "a", "standard", _input(
        probes={peer: output(peer) for peer in commands}))
    checks = {c["id"]: c for c in report["checks"]}
    assert checks["network.declared_flows_open"]["status"] == "fail"
    assert allowed.id in str(checks["network.declared_flows_open"])
    assert checks["network.undeclared_flows_closed"]["status"] == "fail"
    assert denied.id in str(checks["network.undeclared_flows_closed"])

    def right(peer: str) -> str:
        return "\n".join(f"{p.address}:{p.port} {'0' if p.allowed else '124'}"
                         for p in expect.probes if p.peer == peer)

    _, report = _onnode(tmp_path / "c", "standard", _input(
        probes={peer: right(peer) for peer in commands}))
    checks = {c["id"]: c for c in report["checks"]}
    for check in ("network.declared_flows_open", "network.undeclared_flows_closed"):
        assert checks[check]["status"] == "pass", checks[check]

    silent = next(iter(commands))
    _, report = _onnode(tmp_path / "b", "standard", _input(
        probes={peer: output(peer) for peer in commands if peer != silent}))
    checks = {c["id"]: c for c in report["checks"]}
    for check in ("network.declared_flows_open", "network.undeclared_flows_closed"):
        assert checks[check]["status"] == "error", checks[check]
        assert f"no probe output from {silent}" in str(checks[check]), checks[check]
