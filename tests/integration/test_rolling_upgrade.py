"""The rolling upgrade moves the lab's nodes between two real NVIDIA driver builds.

The lab's mirror carries every build of the driver userspace that Debian 12's suites serve
(gpupool/lab/mirror.py): 535.309.01 from bookworm-security (the lab's lock) and 535.261.03
from bookworm. They are real packages, installed, pinned and held by the roles; the lab has
no GPU, so nothing about a driver's behaviour on a GPU follows from this, only that the
procedure (record, drain, requeue, release the holds, install, hold, gate, resume, roll
back) does what it says on real package versions and a real Slurm.

Changing the lock: the playbooks get the other lock as the inventory's gpupool_software
(extra vars) and the gate a description file with it, exactly what a changed description
and a regenerated inventory give them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import bench.rolling_upgrade
from gpupool.lab import hosts as lab_mod
from gpupool.lab import mirror, slurm_cluster
from gpupool.render import slurm
from gpupool.spec import loader
from tests.conftest import lab_description, lab_description_path
from tests.integration.conftest import Run, ansible_playbook

pytestmark = pytest.mark.integration
DESC = lab_description()
LOCK = DESC.software.nvidia_driver
COMPUTE = [n for n, node in DESC.nodes.items() if "compute" in node.roles]
CANARY = COMPUTE[0]
RECORD = "/var/lib/gpupool/upgrade/rollout.json"
SOURCE = "nvidia-graphics-drivers"
PRIMARY = ("nvidia-smi", "libnvidia-ml1", "libcuda1")
# Injected on the canary for the failing rollout: the new build "breaks" sshd hardening
# there (a dpkg hook writes a forbidden sshd setting while the other build is installed and
# removes it otherwise), which the gate catches. A simulated regression, named as such.
HOOK = "/etc/apt/apt.conf.d/99gpupool-test-regression"
OOPS = "/etc/ssh/sshd_config.d/00-regression.conf"
# A deferred job that checkpoints on SIGTERM: requeued by the drain, it resumes from its
# checkpoint with RESUME_WORK seconds left (the job convention).
CHECKPOINTING = """#!/bin/bash
[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && WORK=${RESUME_WORK:-$WORK}
srun bash -c 'trap "echo checkpoint; exit 0" TERM
for i in $(seq 1 $((WORK * 2))); do sleep 0.5; done'
"""
wait_for = slurm_cluster.wait_for


def other_build() -> str:
    builds = [v for v in mirror.driver_versions(lab_mod.mirror_dir(DESC)) if v != LOCK]
    if not builds:
        pytest.fail(f"the lab mirror carries no driver build beside {LOCK}: "
                    f"{mirror.driver_versions(lab_mod.mirror_dir(DESC))}")
    return builds[0]


def with_lock(version: str) -> list[str]:
    """-e arguments that give the playbooks a pool whose driver lock is `version`."""
    raw = yaml.safe_load(lab_description_path().read_text())
    raw["software"]["nvidia_driver"] = version
    path = lab_mod.lab_dir(DESC) / f"description-driver-{version}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    desc = loader.load_file(path)  # validated as a user's edited description would be
    extra = lab_mod.lab_dir(DESC) / f"vars-driver-{version}.yml"
    extra.write_text(yaml.safe_dump({
        "gpupool_software": desc.software.model_dump(mode="json"),
        "admission_description": str(path)}))
    return ["-e", f"@{extra}"]


def rollout(*extra: str, book: str = "rolling_driver_upgrade.yml") -> Run:
    return ansible_playbook(lab_mod.inventory_path(DESC), f"playbooks/{book}", *extra,
                            timeout=1500)


def driver_builds(s: slurm_cluster.SlurmLab, node: str) -> tuple[set[str], set[str]]:
    """The versions of the driver's packages on the node, and which primary ones are held."""
    out = s.sh("dpkg-query -W -f='${db:Status-Abbrev}|${Package}|${Version}|"
               "${source:Package}\\n'", node=node)
    versions = {v.rsplit("-", 1)[0] for st, _p, v, src in (ln.split("|") for ln in
                                                          out.splitlines())
                if st[1:2] == "i" and src == SOURCE}
    held = set(s.sh("apt-mark showhold", node=node).split()) & set(PRIMARY)
    return versions, held


def pool_builds(s: slurm_cluster.SlurmLab) -> dict[str, Any]:
    return {n: sorted(driver_builds(s, n)[0]) for n in COMPUTE}


@pytest.fixture(scope="module")
def pool(site: Any) -> Any:
    s = slurm_cluster.ready(DESC)
    s.sh(f"rm -f {RECORD}")
    figures: dict[str, Any] = {"from": LOCK, "to": other_build(), "nodes": len(COMPUTE)}
    yield s, figures
    bench.write("rolling_upgrade", figures, f"pytest -m integration {bench.rolling_upgrade.TEST}")


def test_upgrade_between_real_driver_builds_with_a_job_running(pool: Any) -> None:
    """The pool moves to the other real build and back to the lock (the newer one: the
    upgrade proper), with a job running on the canary that is requeued after its grace
    time and finishes; every node ends on the lock, held; a re-run changes nothing."""
    s, figures = pool
    other = other_build()
    assert pool_builds(s) == {n: [LOCK] for n in COMPUTE}
    t = time.monotonic()
    away = rollout(*with_lock(other), "-e", "upgrade_batch=3", "-e", "upgrade_gate_tier=quick")
    figures["move_all_s"] = round(time.monotonic() - t, 1)
    assert away.rc == 0, away.output[-5000:]
    assert pool_builds(s) == {n: [other] for n in COMPUTE}
    for node in COMPUTE:
        assert driver_builds(s, node)[1] == set(PRIMARY), node  # held again
    # A site run with the lock changed back refuses to move a driver under running jobs.
    site_run = rollout("--limit", CANARY, "--tags", "nvidia_driver", book="site.yml")
    assert site_run.rc != 0, site_run.output[-3000:]
    assert "goes through playbooks/rolling_driver_upgrade.yml" in " ".join(
        site_run.output.split()), site_run.output[-3000:]
    assert driver_builds(s, CANARY)[0] == {other}

    low = next(c.name for c in reversed(slurm.class_policies(DESC)))
    job = s.sbatch(f"-p {low}", f"-A {next(iter(DESC.teams))}", f"-w {CANARY}", "--gpus=1",
                   "--requeue", script=CHECKPOINTING, env={"WORK": "900", "RESUME_WORK": "5"})
    wait_for("the job running", lambda: s.state(job) == "RUNNING", 120)
    t = time.monotonic()
    back = rollout("-e", "upgrade_grace_s=10")
    figures["upgrade_s"] = round(time.monotonic() - t, 1)
    assert back.rc == 0, back.output[-5000:]
    wait_for("the job finished", lambda: s.sacct(job)[-1]["State"] == "COMPLETED", 300)
    states = [r["State"] for r in s.sacct(job)]
    figures["job_records"] = states
    assert states[0] == "REQUEUED" and states[-1] == "COMPLETED", states
    assert pool_builds(s) == {n: [LOCK] for n in COMPUTE}
    for node in COMPUTE:
        assert driver_builds(s, node)[1] == set(PRIMARY), node
    assert all(st == "idle" for n, st in s.node_states().items() if n in COMPUTE)
    assert json.loads(s.sh(f"cat {RECORD}"))["state"] == "done"

    again = rollout()
    assert again.rc == 0, again.output[-3000:]
    assert again.total("changed") == 0, again.output[-3000:]


def test_a_failing_canary_stops_the_rollout_and_everything_rolls_back(pool: Any) -> None:
    """The other build fails its gate on the canary: the rollout stops there, the canary goes
    back to the recorded versions and is resumed, the nodes after it were never touched,
    and the run fails naming the node. Trying the same lock again is refused, and the
    rollback run by itself changes nothing."""
    s, figures = pool
    other = other_build()
    s.write(HOOK, 'DPkg::Post-Invoke {"if dpkg-query -W -f=\'${Version}\' nvidia-smi | '
            f'grep -q \'^{other}-\'; then echo \'PasswordAuthentication yes\' > {OOPS}; '
            f'else rm -f {OOPS}; fi";}};', node=CANARY)
    try:
        t = time.monotonic()
        run = rollout(*with_lock(other))
        figures["rollback_s"] = round(time.monotonic() - t, 1)
        record = json.loads(s.sh(f"cat {RECORD}"))
        figures["stopped_at"], figures["why"] = record["stopped_at"], record["why"]
        assert run.rc != 0, run.output[-5000:]
        assert f"stopped at {CANARY}" in run.output, run.output[-3000:]
        assert (record["state"], record["stopped_at"]) == ("rolled-back", CANARY), record
        assert "system.sshd_hardened" in record["why"], record
        assert pool_builds(s) == {n: [LOCK] for n in COMPUTE}
        assert driver_builds(s, CANARY)[1] == set(PRIMARY)
        assert all(st == "idle" for n, st in s.node_states().items() if n in COMPUTE)
        for node in COMPUTE[1:]:  # never reached: nothing changed there
            assert run.recap[node]["changed"] == 0, (node, run.recap)

        refused = rollout(*with_lock(other))
        assert refused.rc != 0 and "was rolled back" in refused.output, refused.output[-3000:]
        assert refused.total("changed") == 0
        alone = rollout(*with_lock(other), book="rollback_driver_upgrade.yml")
        assert alone.rc == 0 and alone.total("changed") == 0, alone.output[-3000:]
    finally:
        s.sh(f"rm -f {HOOK} {OOPS}", node=CANARY)
        for path in Path(lab_mod.lab_dir(DESC)).glob("*-driver-*.y*ml"):
            path.unlink()
