"""The lab harness shared by every integration test that needs lab hosts.

Session fixtures: `lab_lock` (exclusive flock on /tmp/gpupool-lab.lock for the whole
session, bounded wait), `lab` (fresh lab hosts brought up once, torn down at the end) and
`site` (playbooks/site.yml converged once, then re-run for idempotence and in check mode).
Other suites (roles/slurm, the acceptance gate) reuse `lab` and `ansible_playbook`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpupool.gate import runner as gate_runner
from gpupool.lab import hosts as labmod
from gpupool.lab import slurm_cluster
from gpupool.paths import ANSIBLE_CONFIG
from gpupool.spec import loader
from gpupool.spec.model import Description
from tests.conftest import ROOT, lab_description

ANSIBLE_PLAYBOOK = ROOT / ".venv" / "bin" / "ansible-playbook"
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


@dataclass
class Run:
    rc: int
    output: str
    recap: dict[str, dict[str, int]]

    def total(self, key: str) -> int:
        return sum(h[key] for h in self.recap.values())


def ansible_playbook(inventory: Path, playbook: str, *args: str, timeout: float = 900) -> Run:
    """Run a playbook from the repository root; returns its exit code, output and recap."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE_CONFIG), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_FORCE_COLOR": "0"}
    proc = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(inventory), playbook, *args],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)
    out = proc.stdout + proc.stderr
    recap = {m[1]: {"ok": int(m[2]), "changed": int(m[3]), "unreachable": int(m[4]),
                    "failed": int(m[5])} for m in RECAP.finditer(out)}
    return Run(proc.returncode, out, recap)


def _missing_prerequisite() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root (rootful podman with static addresses)"
    for tool in ("podman", "runc", "debootstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/bootstrap.sh installs it)"
    return None


@pytest.fixture(scope="session")
def lab_desc() -> Description:
    return lab_description()


@pytest.fixture(scope="session", autouse=True)
def users_lab_left_as_found(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite runs on its own lab (tests/conftest.py: SUITE_POOL). The lab `make lab`
    builds from the `lab` stack, when there is one, must come out of the session as it went
    in: same hosts and networks, none recreated or restarted, and every node still passing
    the standard gate (CI builds that lab first to prove it, .ci/run)."""
    users = loader.load_stack("lab", ROOT)
    assert users.pool.name != lab_description().pool.name
    before = labmod.fingerprint(users)
    yield
    after = labmod.fingerprint(users)
    assert after == before, f"the suite changed the lab stack's lab: {before} -> {after}"
    inv = labmod.inventory_path(users)
    if not before or not inv.exists():
        return
    reports = gate_runner.gate(loader.description_path("lab", ROOT), [
        gate_runner.ansible_target(n, inv) for n in users.nodes], "standard",
        tmp_path_factory.mktemp("users-lab-gate"))
    failed = {r["node"]: r.get("failed") or r.get("error") for r in reports
              if r["verdict"] != "pass"}
    assert not failed, f"the lab stack's lab no longer passes the standard gate: {failed}"
    print(f"\nthe lab stack's lab was left as found: {len(users.nodes)} nodes, same hosts, "
          "every node passes the standard gate")


@pytest.fixture(scope="session")
def lab_lock() -> Iterator[None]:
    reason = _missing_prerequisite()
    if reason:
        pytest.skip(reason)
    with labmod.lab_lock():
        yield


@pytest.fixture(scope="session")
def lab(lab_lock: None, lab_desc: Description) -> Iterator[labmod.LabState]:
    """Fresh lab hosts for this session (whatever a previous run left is removed first)."""
    labmod.down(lab_desc)
    state = labmod.up(lab_desc)
    assert state.ready, state
    try:
        yield state
    finally:
        labmod.down(lab_desc)


@dataclass
class SiteRuns:
    converge: Run
    idempotence: Run
    check: Run
    host_kernel_before: dict[str, str]


HOST_GLOBAL_SYSCTLS = ("kernel/kptr_restrict", "kernel/dmesg_restrict", "fs/protected_symlinks")


def host_sysctls() -> dict[str, str]:
    return {k: (Path("/proc/sys") / k).read_text().strip() for k in HOST_GLOBAL_SYSCTLS}


@pytest.fixture(scope="session")
def site(lab: labmod.LabState, lab_desc: Description) -> SiteRuns:
    """playbooks/site.yml on fresh hosts, again (idempotence) and in check mode."""
    before = host_sysctls()
    inv = labmod.inventory_path(lab_desc)
    first = ansible_playbook(inv, "playbooks/site.yml")
    assert first.rc == 0, first.output[-6000:]
    slurm_cluster.mark_converged(lab_desc, "site.yml")  # later bring-ups skip the converge
    second = ansible_playbook(inv, "playbooks/site.yml")
    check = ansible_playbook(inv, "playbooks/site.yml", "--check")
    return SiteRuns(first, second, check, before)
