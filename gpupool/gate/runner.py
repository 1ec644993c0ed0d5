"""Run the gate's suites against nodes in parallel, one pytest process per node.

A node is reached through testinfra: `ansible://NODE` with an inventory (SSH, as Ansible
does) or `local://` on the node itself (how the GPU tier runs on a GPU host, and how a node
gates itself: gate_here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.gate.expect import NodeExpect
from gpupool.gate.plugin import COULD_NOT_RUN, FAIL, PASS
from gpupool.paths import ANSIBLE_CONFIG

SUITES = Path(__file__).resolve().parent / "suites"
# The suites a gate can be limited to (--suite): one file each, suites/test_<name>.py.
SUITE_NAMES = tuple(sorted(p.stem.removeprefix("test_") for p in SUITES.glob("test_*.py")))
CONTROL_PATH_DIR = Path.home() / ".ansible" / "cp"  # Ansible's and testinfra's default
# Bounds on one node's run; past them the node could not be gated.
TIER_TIMEOUT_S = {"quick": 180, "standard": 900, "burn-in": 3600}
EXIT = {PASS: 0, FAIL: 1, COULD_NOT_RUN: 3}


@dataclass(frozen=True)
class Target:
    node: str
    hosts: str  # testinfra --hosts value


def ansible_target(node: str, inventory: Path) -> Target:
    return Target(node, f"ansible://{node}?ansible_inventory={inventory}")


def local_target(node: str) -> Target:
    return Target(node, "local://")


def suite_env() -> dict[str, str]:
    """The environment the suites run in.

    testinfra's ansible backend runs ansible-inventory (the one beside this Python) and
    takes its SSH settings from ansible.cfg: the project's unless the caller names another,
    whatever directory the gate is started from, so its checks share Ansible's master
    connections. It uses them only when their directory exists (Ansible makes it on its
    first SSH connection), so it is made here for a gate that runs first."""
    CONTROL_PATH_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    own = {"ANSIBLE_CONFIG": str(ANSIBLE_CONFIG)} if ANSIBLE_CONFIG.exists() else {}
    return {**own, **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                    f"{os.environ.get('PATH', os.defpath)}"}


def could_not_run(node: str, tier: str, why: str) -> dict[str, Any]:
    return {"node": node, "tier": tier, "verdict": COULD_NOT_RUN, "failed": [],
            "action": None, "counts": {}, "checks": [], "duration_s": 0.0, "error": why}


def gate_node(description: Path | None, target: Target, tier: str, out_dir: Path, *,
              suites: tuple[str, ...] = (), exclude: tuple[str, ...] = (),
              locks: tuple[str, ...] = (), expect_file: Path | None = None,
              probes_file: Path | None = None) -> dict[str, Any]:
    """One node's report. The suites derive what the node must look like from the
    description, or take it ready-made from expect_file (a burst node's, gate/boot.py);
    probes_file holds the peers' probe output where the suites cannot reach the peers."""
    report_path = out_dir / f"{target.node}.json"
    report_path.unlink(missing_ok=True)
    source = f"--gate-expect={expect_file}" if expect_file else f"--gate-file={description}"
    argv = [
        sys.executable, "-m", "pytest", str(SUITES), "-p", "gpupool.gate.plugin",
        f"--hosts={target.hosts}", source, f"--gate-node={target.node}",
        f"--gate-tier={tier}", f"--gate-report={report_path}",
        "-q", "-rN", "-p", "no:cacheprovider", f"--rootdir={SUITES}", "-o", "addopts=",
        "-c", str(SUITES / "pytest.ini"), *(f"--gate-suite={s}" for s in suites),
        *(f"--gate-exclude={e}" for e in exclude), *(f"--gate-lock={lk}" for lk in locks),
        *([f"--gate-probes={probes_file}"] if probes_file else []),
    ]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=suite_env(),
                              timeout=TIER_TIMEOUT_S[tier], check=False)
    except subprocess.TimeoutExpired:
        return could_not_run(target.node, tier, f"timed out after {TIER_TIMEOUT_S[tier]} s")
    if not report_path.exists():
        return could_not_run(target.node, tier, (proc.stdout + proc.stderr)[-1500:])
    report: dict[str, Any] = json.loads(report_path.read_text())
    if report["verdict"] == COULD_NOT_RUN:
        report["error"] = (proc.stdout + proc.stderr)[-1500:]
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    return report


def gate_here(expect: NodeExpect, tier: str, out_dir: Path,
              probed: dict[str, str] | None = None) -> dict[str, Any]:
    """Gate this machine as expect.node against a ready-made expectation, with the peers'
    probe output where it was collected (peer -> output, gpupool/gate/probes.py). Both are
    kept beside the report (out_dir/NODE.expect.json, NODE.probes.json), so the report can
    be read against what was asked and seen."""
    out_dir.mkdir(parents=True, exist_ok=True)
    expect_file = out_dir / f"{expect.node}.expect.json"
    expect_file.write_text(expect.to_json() + "\n")
    probes_file = out_dir / f"{expect.node}.probes.json"
    probes_file.unlink(missing_ok=True)
    if probed is not None:
        probes_file.write_text(json.dumps(probed, sort_keys=True) + "\n")
    return gate_node(None, local_target(expect.node), tier, out_dir, expect_file=expect_file,
                     probes_file=probes_file if probed is not None else None)


def gate(description: Path, targets: list[Target], tier: str, out_dir: Path, *,
         on_done: Callable[[dict[str, Any]], None] = lambda r: None,
         parallel: int = 8, suites: tuple[str, ...] = (),
         exclude: tuple[str, ...] = (), locks: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    out_dir.mkdir(parents=True, exist_ok=True)

    def one(t: Target) -> dict[str, Any]:
        report = gate_node(description, t, tier, out_dir, suites=suites, exclude=exclude,
                           locks=locks)
        on_done(report)
        return report

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(targets)))) as pool:
        return list(pool.map(one, targets))


def exit_code(reports: list[dict[str, Any]]) -> int:
    verdicts = {r["verdict"] for r in reports}
    if FAIL in verdicts:
        return EXIT[FAIL]
    if COULD_NOT_RUN in verdicts:
        return EXIT[COULD_NOT_RUN]
    return EXIT[PASS]
