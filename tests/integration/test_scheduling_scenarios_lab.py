"""The scheduling scenarios of tests/scheduling_scenarios.py replayed on the lab's real
Slurm: what tests/test_kueue_semantics.py reads from the rendered slurm.conf is what
slurmctld does. Each scenario's running jobs start on on-prem nodes (-C onprem), then the
arriving job is submitted and Slurm's answer is read back (squeue, scontrol, sacct).

Fixtures, as in test_slurm_lab.py (whose `cluster` fixture this module reuses): GPUs are
character devices; burst nodes are never booted here, so a job sent to burst capacity is
proven by its allocation (CONFIGURING on a cloud node while the node would power up), not
by running.
"""

from __future__ import annotations

import time

import pytest

from gpupool.render import slurm
from tests.integration import test_slurm_lab as lab_slurm
from tests.integration.test_slurm_lab import (
    CHECKPOINTING,
    CLOUD,
    DESC,
    GPUS_PER_NODE,
    SHOW_GPUS,
    wait_for,
)
from tests.scheduling_scenarios import SCENARIOS, Job, Scenario, expand

pytestmark = pytest.mark.integration
cluster = lab_slurm.cluster  # the module-scoped fixture: the lab's Slurm, converged

CLOUD_NAMES = {n.name for n in CLOUD}
STARTED = ("RUNNING", "CONFIGURING", "COMPLETED")


def submit(sl: lab_slurm.Slurm, job: Job, *extra: str, work: int = 900) -> str:
    # Preemptible jobs checkpoint and hand themselves back on preemption; others just run.
    preemptible = DESC.task_classes[job.task_class].preemptible
    return sl.sbatch(f"-p {job.task_class}", f"-A {job.team}", f"-N {job.nodes}",
                     f"--gpus-per-node={GPUS_PER_NODE}", *extra,
                     script=CHECKPOINTING if preemptible else SHOW_GPUS, work=work)


@pytest.mark.parametrize("s", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario_on_real_slurm(cluster: lab_slurm.Slurm,
                                s: Scenario) -> None:
    running = [(j, submit(cluster, j, "-C onprem")) for j in s.running]
    wait_for("the running jobs started", lambda: all(
        cluster.state(jid) == "RUNNING" for _, jid in running), 60)
    arriving = submit(cluster, s.arriving)
    try:
        if s.expect.starts:
            wait_for("the arriving job started", lambda: cluster.state(arriving) in STARTED,
                     120)
            nodes = set(expand(cluster.job(arriving)["NodeList"]))
            assert bool(nodes & CLOUD_NAMES) == s.expect.on_burst, nodes
            preempted = wait_for("preemptions settled", lambda: preempted_classes(
                cluster, running) if s.expect.preempts else set(), 60) or set()
            assert tuple(sorted(preempted)) == s.expect.preempts
        else:
            wait_for("the arriving job evaluated",
                     lambda: cluster.job(arriving)["Reason"] != "None", 20)
            time.sleep(6)  # several scheduling passes preempt nothing and start nothing
            assert cluster.state(arriving) == "PENDING"
            assert preempted_classes(cluster, running) == set()
        if s.max_runtime_s:
            assert cluster.job(arriving)["TimeLimit"] == slurm.time_limit(s.max_runtime_s)
    finally:
        cluster.cancel_all()


def preempted_classes(sl: lab_slurm.Slurm, running: list[tuple[Job, str]]) -> set[str]:
    return {j.task_class for j, jid in running
            if sl.sacct(jid)[0]["State"] in ("REQUEUED", "PREEMPTED")}
