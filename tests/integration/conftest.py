"""The lab harness shared by every integration test that needs lab hosts.

Session fixtures: `lab_lock` (exclusive flock on /tmp/gpupool-lab.lock for the whole
session, bounded wait), `lab` (fresh lab hosts brought up once, torn down at the end),
`site` (playbooks/site.yml converged once, then re-run for idempotence and in check mode)
and `debian13_prepared` (the Debian 13 lane's image and mirror, made on a thread from the
session's start).
Other suites (roles/slurm, the acceptance gate) reuse `lab` and `ansible_playbook`.

Every playbook the suite runs, directly or through gpupool, runs under the strategy
`playbook_strategy` names: ansible.cfg's own, Mitogen's linear strategy
(strategy_plugins/mitogen_linear.py), which operators and `make lab` run too.
GPUPOOL_TEST_STRATEGY=linear runs the suite under Ansible's own linear strategy instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

import bench.site_lab
from gpupool.gate import runner as gate_runner
from gpupool.lab import hosts as labmod
from gpupool.lab import slurm_cluster
from gpupool.paths import ANSIBLE_CONFIG
from gpupool.spec import loader
from gpupool.spec.facts import controllers
from gpupool.spec.model import Description
from tests.conftest import (
    DEBIAN13_POOL,
    ROOT,
    debian13_lab_raw,
    lab_description,
    write_suite_description,
)

ANSIBLE_PLAYBOOK = ROOT / ".venv" / "bin" / "ansible-playbook"
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
# ansible.posix's profile_roles summary: "common ------------------ 12.34s".
ROLE_TIME = re.compile(r"^(\S+) -+ (\d+\.\d+)s$", re.M)
PROFILE_ROLES = {"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_roles",
                 "PROFILE_ROLES_SUMMARY_ONLY": "true"}


STRATEGY = "GPUPOOL_TEST_STRATEGY"


@pytest.fixture(scope="session", autouse=True)
def playbook_strategy() -> Iterator[str]:
    """The strategy of every ansible-playbook the session starts, set in the environment they
    inherit: ansible.cfg's mitogen_linear unless GPUPOOL_TEST_STRATEGY names Ansible's
    `linear`. Set even when it is the default, so bench.write records what ran."""
    wanted = os.environ.get(STRATEGY, "mitogen_linear")
    if wanted not in ("mitogen_linear", "linear"):
        pytest.exit(f"{STRATEGY}={wanted!r}: expected mitogen_linear or linear", 2)
    saved = os.environ.get("ANSIBLE_STRATEGY")
    os.environ["ANSIBLE_STRATEGY"] = wanted
    yield wanted
    if saved is None:
        os.environ.pop("ANSIBLE_STRATEGY", None)
    else:
        os.environ["ANSIBLE_STRATEGY"] = saved


@dataclass
class Run:
    rc: int
    output: str
    recap: dict[str, dict[str, int]]
    seconds: float = 0.0

    def total(self, key: str) -> int:
        return sum(h[key] for h in self.recap.values())


def ansible_playbook(inventory: Path, playbook: str, *args: str, timeout: float = 900,
                     env: dict[str, str] | None = None) -> Run:
    """Run a playbook from the repository root; returns its exit code, output, recap and
    wall seconds. env: more environment (a callback to enable)."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE_CONFIG), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_FORCE_COLOR": "0", **(env or {})}
    start = time.monotonic()
    proc = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(inventory), playbook, *args],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)
    out = proc.stdout + proc.stderr
    recap = {m[1]: {"ok": int(m[2]), "changed": int(m[3]), "unreachable": int(m[4]),
                    "failed": int(m[5])} for m in RECAP.finditer(out)}
    return Run(proc.returncode, out, recap, round(time.monotonic() - start, 1))


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


DEBIAN13_LANE = "test_debian13_lab.py"


def _prepare(desc: Description) -> None:
    labmod.ensure_mirror(desc, labmod.build_image(lambda _m: None, labmod.lab_recipe(desc)),
                         lambda _m: None)


@pytest.fixture(scope="session")
def debian13_prepared(request: pytest.FixtureRequest, lab_lock: None
                      ) -> Iterator[tuple[Path, Description, Future[None] | None]]:
    """The Debian 13 lane's description (its file and itself), and its image and package mirror
    being made on a thread: started with the session's first lab (asked for by `lab`), so
    that on a fresh machine the trixie debootstrap and the NVIDIA 550 downloads run beside
    the Debian 12 lab's converge, which mostly waits on dpkg, and not in the lane's own
    time. No thread when the session does not run the lane. The lane's `up` makes whatever
    this did not (a failure here is reported there, where it is made again)."""
    path = write_suite_description(DEBIAN13_POOL, debian13_lab_raw())
    desc = loader.load_file(path)
    if not any(item.path.name == DEBIAN13_LANE for item in request.session.items):
        yield path, desc, None
        return
    with ThreadPoolExecutor(1, thread_name_prefix="debian13") as pool:
        yield path, desc, pool.submit(_prepare, desc)


@pytest.fixture(scope="session")
def lab(lab_lock: None, lab_desc: Description,
        debian13_prepared: tuple[Path, Description, Future[None] | None]
        ) -> Iterator[labmod.LabState]:
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
    """playbooks/site.yml on fresh hosts, again (idempotence) and in check mode; their
    times, per role too, go to the site_lab figures."""
    before = host_sysctls()
    inv = labmod.inventory_path(lab_desc)
    first = ansible_playbook(inv, "playbooks/site.yml", env=PROFILE_ROLES)
    assert first.rc == 0, first.output[-6000:]
    slurm_cluster.mark_converged(lab_desc, "site.yml")  # later bring-ups skip the converge
    second = ansible_playbook(inv, "playbooks/site.yml", env=PROFILE_ROLES)
    check = ansible_playbook(inv, "playbooks/site.yml", "--check", env=PROFILE_ROLES)
    runs = dict(zip(bench.site_lab.RUNS, (first, second, check), strict=True))
    bench.write("site_lab", {
        "hosts": len(lab_desc.nodes), **{f"{k}_s": r.seconds for k, r in runs.items()},
        "roles_s": {k: {m[1]: float(m[2]) for m in ROLE_TIME.finditer(r.output)
                        if m[1] != "total"} for k, r in runs.items()}},
        f"pytest -m integration {bench.site_lab.TEST}")
    return SiteRuns(first, second, check, before)



# What the lab's scheduler looked like when a test using it failed, in that test's report:
# CI keeps only the report, and the lab is gone by the time anyone reads it.
SNAPSHOT = ("scontrol ping", "sinfo -N -h -o '%N %T %E'", "squeue -h -o '%i %T %r'",
            "sshare -n -P -a -o Account,User,RawUsage",
            "systemctl is-active slurmctld slurmdbd munge",
            "journalctl -u slurmctld --no-pager -n 25 -o short-monotonic")
SNAPSHOTS_TAKEN: list[str] = []


def scheduler_snapshot(desc: Description) -> str:
    """SNAPSHOT's answers on each controller host still running; bounded, never raises."""
    running = labmod.podman("ps", "--format", "{{.Names}}", check=False, timeout=30).stdout
    lines = []
    for node in controllers(desc):
        if labmod.container_name(desc, node) not in running.split():
            lines.append(f"## {node}: not running")
            continue
        for cmd in SNAPSHOT:
            try:
                out = labmod.exec_(desc, node, ["bash", "-c", cmd], timeout=20)
                lines.append(f"## {node}: {cmd}\n{out.stdout}{out.stderr}")
            except subprocess.TimeoutExpired:
                lines.append(f"## {node}: {cmd}: no answer within 20 s")
    return "\n".join(lines)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    desc = getattr(item, "funcargs", {}).get("lab_desc")
    # The first few failures only: a module's fixture failing fails each of its tests.
    if report.failed and isinstance(desc, Description) and len(SNAPSHOTS_TAKEN) < 3:
        SNAPSHOTS_TAKEN.append(item.nodeid)
        try:
            snapshot = scheduler_snapshot(desc)
        except (OSError, subprocess.SubprocessError) as err:
            snapshot = f"no snapshot: {err}"
        report.sections.append(("the lab's scheduler at the failure", snapshot))
    return report
