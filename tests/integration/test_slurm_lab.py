"""The Slurm policy proven by real jobs on a real Slurm (22.05, Debian 12) in the lab hosts.

One Slurm lab for the module: the session's lab hosts, converged over SSH by the session's
site.yml (fixture `site`), jobs submitted on lab-ctl. Every claim is read back from Slurm (squeue,
sacct, sprio, sshare, scontrol). Fixtures, named as such:
- the lab's GPUs are character devices (major 195) that the role creates from tmpfiles.d:
  slurmd counts and hands them out, nothing computes on them;
- the burst "cloud": slurmctld's ResumeProgram/SuspendProgram in the lab only record
  requests (no cloud is reachable); this test acts on them with the real gpupool.onhost.burst code
  against a local EC2 (moto on this machine), and the lab's burst data plane
  (gpupool.lab.burst_hosts) boots each instance moto reports as a lab host from the burst
  image, with the launch template's user-data and a FIXTURE metadata service.
- jobs are submitted as root on behalf of each team (root is added to the team accounts).
Timings are recorded in bench/results/slurm_lab.json, never asserted.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shlex
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest

import bench.slurm_lab
from gpupool.lab import burst_hosts, burst_image, localaws, slurm_cluster
from gpupool.lab import hosts as lab_mod
from gpupool.onhost import burst
from gpupool.render import flows, slurm
from gpupool.render.cloud import launch, names
from gpupool.spec.facts import controller, rack_places
from tests.conftest import lab_description
from tests.integration.conftest import Run, ansible_playbook
from tests.scheduling_scenarios import SCENARIOS, Job, Scenario, slurm_outcome

pytestmark = pytest.mark.integration

DESC = lab_description()
CTL = controller(DESC)
ONPREM = slurm.hostlist(n.name for n in slurm.nodes(DESC) if not n.cloud)
CLOUD = [n for n in slurm.nodes(DESC) if n.cloud]
TEAMS = list(DESC.teams)
CLASSES = {c.name: c for c in slurm.class_policies(DESC)}
TOP, *_, LOW = list(CLASSES)  # interactive ... deferred
MID = next(c for c in CLASSES if c not in (TOP, LOW))  # training
GPUS_PER_NODE = next(n.gpus for n in slurm.nodes(DESC))
# Prometheus' service discovery refresh and scrape interval (15 s each in the lab) with
# room: the bound on waiting for a burst node's scrape, and on its job, which runs until the
# test has seen the scrape (SCRAPED appears on the node) so that the node is not suspended
# first, and no longer.
SCRAPE_WAIT_S = 60
SCRAPED = "/run/gpupool-test-scraped"
UNTIL_SCRAPED = ("#!/bin/bash\nfor _ in $(seq $WORK); do [ -e " + SCRAPED +
                 " ] && exit 0; sleep 1; done\n")

# A deferred job that checkpoints on SIGTERM and, when the signal is a preemption
# (PreemptTime set), hands itself back to the queue: the contract for preemptible work,
# GraceTime being the most it may take. A job that exits instead ends COMPLETED. A restart
# resumes from its checkpoint: RESUME_WORK seconds are left (all of WORK when unset).
CHECKPOINTING = """#!/bin/bash
echo "start $(date +%s.%N) restart=${SLURM_RESTART_COUNT:-0} host=$(hostname)"
[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && WORK=${RESUME_WORK:-$WORK}
srun bash -c 'trap "echo checkpoint; \
  scontrol show job $SLURM_JOB_ID | grep -q PreemptTime=None \
  || scontrol requeue $SLURM_JOB_ID; exit 0" TERM
echo trapping
for i in $(seq 1 $((WORK * 2))); do sleep 0.5; done'
echo "done $(date +%s.%N)"
"""
SHOW_GPUS = """#!/bin/bash
echo "$(hostname) $CUDA_VISIBLE_DEVICES"
sleep ${WORK:-3}
"""


wait_for = slurm_cluster.wait_for


class Slurm(slurm_cluster.SlurmLab):
    """The lab's Slurm commands (gpupool.lab.slurm_cluster) with this module's conventions: each
    job's length is its WORK, its output kept per job, and the overrunning job is left to
    meet its time limit."""

    def __init__(self) -> None:
        super().__init__(DESC)
        self.figures: dict[str, Any] = {}
        self.overrun = ""

    def sbatch(self, *args: str, script: str = SHOW_GPUS, work: int = 3,
               resume_work: int | None = None) -> str:
        env = {"WORK": str(work)} | ({} if resume_work is None else
                                     {"RESUME_WORK": str(resume_work)})
        return super().sbatch("-o /tmp/slurm-%j.out", "--open-mode=append", *args,
                              script=script, env=env)

    def output(self, jid: str) -> str:
        """The job's output from every host it ran on (a requeued job may move)."""
        return "".join(self.sh(f"cat /tmp/slurm-{jid}.out 2>/dev/null || true", node=h)
                       for h in DESC.nodes)

    def cancel_all(self) -> None:
        """Cancel every job but the overrunning one, which must meet its time limit."""
        def others() -> list[str]:
            return [j for j in self.sh("squeue -h -o %i").split() if j != self.overrun]

        if others():
            self.sh(f"scancel {' '.join(others())}; true")
        wait_for("all jobs gone", lambda: not others(), 60)


def playbook(*extra: str, name: str) -> Run:
    return ansible_playbook(lab_mod.inventory_path(DESC), f"playbooks/{name}", *extra)


@pytest.fixture(scope="module")
def cluster(lab: lab_mod.LabState, site):
    """The session's lab hosts (tests/integration/conftest.py), converged by site.yml (the
    burst image is a converged GPU host, the acceptance gate included): site.yml ends with
    slurm.yml, and the fixture `site` proves it idempotent and check-mode clean, so this
    module converges nothing more. Modules before it that change the scheduler put it back
    (test_mig_lab's teardown, the replay's policy switch)."""
    figures: dict[str, Any] = {"lab_up_s": lab.timings.get("up_s")}
    start = time.monotonic()
    s = Slurm()
    s.figures = figures
    slurm_cluster.ready(DESC)  # root in every team account, on-prem nodes idle
    # The proofs start from no usage: earlier suites (drills, replays) ran jobs as the
    # teams, and fairshare would order them by that history.
    s.reset_usage(TEAMS)
    figures["slurm_up_s"] = round(time.monotonic() - start, 1)
    # A job that outlives its limit (1 minute, Slurm's smallest), started now so the
    # minute passes while the other proofs run; CPU-only, so it takes no GPU from them.
    s.overrun = s.sbatch(f"-p {TOP}", f"-A {TEAMS[0]}", "--time=1", work=300)
    try:
        yield s
    finally:
        bench.write("slurm_lab", figures, f"pytest -m integration {bench.slurm_lab.TEST}")
        print(f"\nslurm lab figures: {json.dumps(figures, sort_keys=True)}")


def test_cluster_matches_the_description(cluster):
    nodes = cluster.sh("sinfo -N -h -o '%N|%G|%T'")
    seen = {n: (g, st) for n, g, st in (line.split("|") for line in nodes.splitlines())}
    for n in slurm.nodes(DESC):
        gres, state = seen[n.name]
        assert gres == f"gpu:{n.gpu_model}:{n.gpus}"
        # On-prem nodes are up; one may already run the fixture's CPU-only time-limit job.
        assert state in (("idle~",) if n.cloud else ("idle", "mixed")), (n.name, state)
    topo = cluster.sh("scontrol show topology")
    places = rack_places(DESC)
    for leaf in {p.leaf for p in places.values()}:
        assert f"SwitchName={leaf} " in topo
    parts = cluster.sh("scontrol -o show partition")
    for c in CLASSES.values():
        line = next(p for p in parts.splitlines() if p.startswith(f"PartitionName={c.name} "))
        assert f"PriorityTier={c.priority} " in line
        assert f"PreemptMode={'REQUEUE' if c.preemptible else 'OFF'}" in line
    limits = cluster.sh("sacctmgr -n -P show assoc user= format=account,grptres")
    for lim in slurm.accounting(DESC)["limits"]:
        have = dict(line.split("|") for line in limits.splitlines())[lim["account"]]
        assert set(have.split(",")) == set(lim["GrpTRES"].split(","))


def test_gpus_are_assigned_exclusively(cluster):
    jobs = [cluster.sbatch(f"-p {MID}", f"-A {TEAMS[i % 2]}", "--gpus=1", "-C onprem", work=6)
            for i in range(3 * GPUS_PER_NODE)]
    wait_for("all jobs done", lambda: all(
        cluster.state(j) == "COMPLETED" for j in jobs), 90)
    runs = []
    for j in jobs:
        host, device = cluster.output(j).split()[:2]
        rec = cluster.sacct(j)[-1]
        runs.append((host, device, *(time.mktime(time.strptime(rec[k], "%Y-%m-%dT%H:%M:%S"))
                                     for k in ("Start", "End"))))
    # One device per job, and no device held by two jobs at the same time.
    for i, a in enumerate(runs):
        assert "," not in a[1]
        for b in runs[i + 1:]:
            if a[:2] == b[:2]:
                assert a[3] <= b[2] or b[3] <= a[2], (a, b)
    assert {h for h, *_ in runs} == set(burst.expand_hostlist(ONPREM))
    cluster.figures["exclusive_gpu_pairs"] = len({r[:2] for r in runs})
    cluster.cancel_all()


def test_team_over_quota_waits_with_the_quota_reason(cluster):
    vision, nlp = TEAMS
    running = [cluster.sbatch(f"-p {LOW}", f"-A {vision}", f"--gpus={GPUS_PER_NODE}",
                              "-C onprem", script=CHECKPOINTING, work=120)
               for _ in range(3)]
    wait_for("the pool full", lambda: all(cluster.state(j) == "RUNNING" for j in running), 30)
    # Two more nodes' worth would put vision above quota + borrowing; nlp is at zero. The
    # same request from nlp comes after vision's reason is read: a higher-priority job
    # waiting ahead would only give vision's the reason "Priority".
    over = cluster.sbatch(f"-p {LOW}", f"-A {vision}", "-N 2",
                          f"--gpus-per-node={GPUS_PER_NODE}", "-C onprem")
    reason = wait_for("a reason for vision's job", lambda: (
        (r := cluster.job(over)["Reason"]) not in ("None", "Priority") and r), 20)
    assert reason == "AssocGrpGRES"
    other = cluster.sbatch(f"-p {LOW}", f"-A {nlp}", "-N 2",
                           f"--gpus-per-node={GPUS_PER_NODE}", "-C onprem")
    wait_for("nlp's job evaluated", lambda: cluster.job(other)["Reason"] != "None", 20)
    assert cluster.job(other)["Reason"] != "AssocGrpGRES"
    cluster.cancel_all()


def test_interactive_preempts_deferred_which_is_requeued_and_completes(cluster):
    vision, nlp = TEAMS
    # The deferred jobs' work outlasts every wait below, so the interactive job can start
    # only by preemption however slow the host is; the victim resumes with 5 s left.
    deferred = [cluster.sbatch(f"-p {LOW}", f"-A {vision}", f"--gpus={GPUS_PER_NODE}",
                               "-C onprem", script=CHECKPOINTING, work=900, resume_work=5)
                for _ in range(3)]
    wait_for("the pool full", lambda: all(cluster.state(j) == "RUNNING" for j in deferred), 30)
    # Slurm signals a preempted job's steps, not its batch shell: a preemption before the
    # step runs reaches no trap, and the job is requeued only after GraceTime. So the
    # interactive job comes once every deferred job's step traps SIGTERM, as a running
    # job's would (a job preempted in its first seconds is the runbook's GraceTime case).
    wait_for("the deferred jobs' steps trapping SIGTERM", lambda: all(
        "trapping" in cluster.output(j) for j in deferred), 60)
    t0 = time.monotonic()
    urgent = cluster.sbatch(f"-p {TOP}", f"-A {nlp}", "--gpus=1", "-C onprem", work=5)
    wait_for("the interactive job running", lambda: cluster.state(urgent) in (
        "RUNNING", "COMPLETED"), 120)
    cluster.figures["interactive_start_on_full_pool_s"] = round(time.monotonic() - t0, 2)
    # Accounting shows REQUEUED when the job handed itself back, PREEMPTED when Slurm
    # requeued it after GraceTime; later assertions check it ran again to completion.
    victims = wait_for("the victim's requeue in accounting", lambda: [
        j for j in deferred if cluster.sacct(j)[0]["State"] in ("REQUEUED", "PREEMPTED")], 120)
    assert len(victims) == 1, [cluster.sacct(j) for j in deferred]
    victim = victims[0]
    done = wait_for("the victim completed", lambda: (
        (recs := cluster.sacct(victim))[-1]["State"] == "COMPLETED" and recs), 180)
    # Either way it was requeued once and then finished: should the job's own `scontrol
    # requeue` lose the race with GraceTime, Slurm requeues it instead. Which path it took
    # is recorded with the figures.
    assert [r["State"] for r in done][1:] == ["COMPLETED"], done
    assert done[0]["State"] in ("REQUEUED", "PREEMPTED"), done
    cluster.figures["interactive_victim_requeued_itself"] = done[0]["State"] == "REQUEUED"
    assert "restart=1" in cluster.output(victim)
    assert "checkpoint" in cluster.output(victim)
    requeued, final = (time.mktime(time.strptime(r, "%Y-%m-%dT%H:%M:%S"))
                       for r in (done[0]["End"], done[-1]["End"]))
    cluster.figures["requeue_to_complete_s"] = final - requeued
    # Only the victim was touched: the others still run their first (and only) time.
    for j in deferred:
        if j != victim:
            assert cluster.state(j) == "RUNNING"
            assert len(cluster.sacct(j)) == 1
    cluster.cancel_all()


def test_training_does_not_preempt_training(cluster):
    vision, nlp = TEAMS
    first = [cluster.sbatch(f"-p {MID}", f"-A {vision}", f"--gpus={GPUS_PER_NODE}",
                            "-C onprem", work=30) for _ in range(3)]
    wait_for("the pool full", lambda: all(cluster.state(j) == "RUNNING" for j in first), 30)
    late = cluster.sbatch(f"-p {MID}", f"-A {nlp}", f"--gpus={GPUS_PER_NODE}", "-C onprem")
    # Several scheduling passes (sched_interval=2, bf_interval=1) see it and preempt nothing.
    wait_for("the late job evaluated", lambda: cluster.job(late)["Reason"] in (
        "Resources", "Priority"), 20)
    time.sleep(6)
    assert cluster.state(late) == "PENDING"
    assert [cluster.state(j) for j in first] == ["RUNNING"] * 3
    assert all(len(cluster.sacct(j)) == 1 for j in first)  # never requeued
    cluster.cancel_all()


def test_two_node_job_lands_on_one_leaf_and_its_step_spans_both(cluster):
    """A step over both nodes of a job, as a multi-node training job's srun is: each node's
    slurmstepd connects back to srun on the batch host, through its firewall (srun's
    ports, SrunPortRange). Before they were admitted the step never ended."""
    job = cluster.sbatch(f"-p {MID}", f"-A {TEAMS[0]}", "-N 2",
                         f"--gpus-per-node={GPUS_PER_NODE}", "-C onprem",
                         script="#!/bin/bash\nsrun --ntasks-per-node=1 hostname\n")
    wait_for("the job done", lambda: cluster.state(job) == "COMPLETED", 60)
    nodes = set(burst.expand_hostlist(cluster.job(job)["NodeList"]))
    places = rack_places(DESC)
    leaves = {places[DESC.nodes[n].rack].leaf for n in nodes}
    assert len(nodes) == 2
    assert len(leaves) == 1, nodes
    assert set(cluster.output(job).split()) == nodes


def test_max_run_time_is_enforced(cluster):
    top = CLASSES[TOP]
    too_long = slurm.time_limit(top.max_runtime_s + 60)
    proc = lab_mod.exec_(DESC, CTL, ["bash", "-c", f"printf '#!/bin/sh\\nsleep 1\\n' > /tmp/x.sh; "
                                 f"sbatch -p {TOP} -A {TEAMS[0]} --time={too_long} /tmp/x.sh"])
    assert proc.returncode != 0
    assert "time limit" in proc.stderr.lower()
    job = cluster.sbatch(f"-p {TOP}", f"-A {TEAMS[0]}", "--gpus=1")
    assert cluster.job(job)["TimeLimit"] == slurm.time_limit(top.max_runtime_s).removeprefix(
        "0-")
    # The job started with the cluster (time limit 1 minute, 5 minutes of work) was stopped.
    final = wait_for("the overrunning job stopped", lambda: (
        (st := cluster.sacct(cluster.overrun)[-1]["State"]) not in (
            "PENDING", "RUNNING", "COMPLETING") and st), 150)
    assert final == "TIMEOUT"
    cluster.cancel_all()


def test_fairshare_orders_teams_after_usage(cluster):
    vision, nlp = TEAMS
    usage = [cluster.sbatch(f"-p {LOW}", f"-A {vision}", f"--gpus={GPUS_PER_NODE}",
                            "-C onprem", work=20) for _ in range(3)]
    wait_for("vision's usage done", lambda: all(
        cluster.state(j) == "COMPLETED" for j in usage), 90)

    def shares() -> dict[str, float]:
        # Fair Tree gives the factor per association: root's under each team account.
        out = cluster.sh("sshare -n -P -a -u root -o Account,User,RawUsage,FairShare")
        return {a.strip(): float(f) for a, u, _, f in (
            line.split("|") for line in out.splitlines()) if a.strip() in TEAMS and u == "root"}

    # sshare recomputes every PriorityCalcPeriod (1 minute in the lab).
    ordered = wait_for("fairshare recomputed", lambda: (
        (s := shares()) and s[nlp] > s[vision] and s), 150)
    cluster.figures["fairshare"] = ordered
    # One slot frees first: the team with the better fairshare factor must get it.
    block = [cluster.sbatch(f"-p {LOW}", f"-A {nlp}", f"--gpus={GPUS_PER_NODE}", "-C onprem",
                            work=w) for w in (12, 90, 90)]
    wait_for("the pool full", lambda: all(cluster.state(j) == "RUNNING" for j in block), 30)
    v = cluster.sbatch(f"-p {LOW}", f"-A {vision}", f"--gpus={GPUS_PER_NODE}", "-C onprem")
    n = cluster.sbatch(f"-p {LOW}", f"-A {nlp}", f"--gpus={GPUS_PER_NODE}", "-C onprem")
    prio = wait_for("sprio rows", lambda: {
        jid: (float(p), float(fs)) for jid, p, fs in (
            line.split("|") for line in cluster.sh(
                f"sprio -h -j {v},{n} -o '%i|%Y|%F'").splitlines())
    } if cluster.sh(f"sprio -h -j {v},{n}").count("\n") == 2 else None, 20)
    assert prio[n][1] > prio[v][1]  # fairshare factor
    assert prio[n][0] > prio[v][0]  # and so the priority
    wait_for("one of them started", lambda: "RUNNING" in (cluster.state(v), cluster.state(n)),
             60)
    assert (cluster.state(n), cluster.state(v)) == ("RUNNING", "PENDING")
    cluster.cancel_all()



# -- the scheduling scenarios on real Slurm --------------------------------------------------
# tests/scheduling_scenarios.py states each scenario once; tests/test_kueue_semantics.py reads
# what Slurm and Kueue do from the rendered configurations. Here slurmctld itself answers:
# the running jobs start on on-prem nodes (-C onprem), the arriving job goes wherever Slurm
# sends it. Burst nodes are not booted here (the lab's ResumeProgram only records the
# request), so a job sent to burst capacity is proven by its allocation: CONFIGURING on a
# cloud node while the node would power up.

CLOUD_NAMES = {n.name for n in CLOUD}


def _scenario_job(cluster: Slurm, job: Job, *extra: str) -> str:
    # Preemptible work checkpoints and hands itself back on preemption (the job convention);
    # every job outlasts the scenario and is cancelled at its end.
    preemptible = DESC.task_classes[job.task_class].preemptible
    return cluster.sbatch(f"-p {job.task_class}", f"-A {job.team}", f"-N {job.nodes}",
                          f"--gpus-per-node={GPUS_PER_NODE}", *extra,
                          script=CHECKPOINTING if preemptible else SHOW_GPUS, work=900)


def _preempted(cluster: Slurm, running: list[tuple[Job, str]]) -> set[str]:
    """The classes of running jobs that accounting shows preempted (requeued by the job
    itself, or by Slurm after GraceTime)."""
    return {j.task_class for j, jid in running
            if cluster.sacct(jid)[0]["State"] in ("REQUEUED", "PREEMPTED")}


def _usable(cluster: Slurm, node: str) -> bool:
    """A cloud node slurmctld may resume: idle and powered down, and nothing else."""
    state = cluster.sh(f"scontrol show node {node}").split("State=", 1)[1].split()[0]
    return state.split("+") == ["IDLE", "CLOUD", "POWERED_DOWN"]


def _power_down(cluster: Slurm, nodes: set[str], why: str = "a scenario allocated it"
                ) -> None:
    """Cloud nodes allocated but never booted back to powered down and usable, so the
    burst proofs below start from them: DOWN, then a forced power down, as the burst
    program returns a node it could not launch (gpupool/onhost/burst.py). A forced power
    down alone leaves a powering-up node NOT_RESPONDING in Slurm 22.05, and slurmctld then
    never picks it again."""
    for node in sorted(nodes):
        cluster.sh(f"scontrol update nodename={node} state=down "
                   f"reason={shlex.quote('gpupool test: ' + why)}")
        cluster.sh(f"scontrol update nodename={node} state=power_down_force")
    wait_for("the cloud nodes powered down", lambda: all(_usable(cluster, n) for n in nodes),
             120)


@pytest.mark.parametrize("s", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scheduling_scenario_on_real_slurm(cluster, s: Scenario):
    """slurmctld does what scheduling_scenarios.slurm_outcome reads from the rendered
    slurm.conf and accounting limits: whether the arriving job starts, on burst capacity or
    not, which running classes it preempts, and its time limit."""
    assert slurm_outcome(DESC, s) == s.expect, "the rendering no longer says what is expected"
    running = [(j, _scenario_job(cluster, j, "-C onprem")) for j in s.running]
    wait_for("the running jobs started", lambda: all(
        cluster.state(jid) == "RUNNING" for _, jid in running), 60)
    arriving = _scenario_job(cluster, s.arriving)
    allocated: set[str] = set()
    try:
        if s.expect.starts:
            wait_for("the arriving job started", lambda: cluster.state(arriving) in (
                "RUNNING", "CONFIGURING"), 120)
            nodes = set(burst.expand_hostlist(cluster.job(arriving)["NodeList"]))
            allocated = nodes & CLOUD_NAMES
            assert bool(allocated) == s.expect.on_burst, nodes
        else:
            wait_for("the arriving job evaluated", lambda: cluster.job(arriving)["Reason"]
                     not in ("None", ""), 20)
            time.sleep(6)  # several scheduling passes (sched_interval=2) start nothing
            assert cluster.state(arriving) == "PENDING", cluster.job(arriving)
        if s.expect.preempts:
            preempted = wait_for("the preemption in accounting",
                                 lambda: _preempted(cluster, running), 60)
            assert tuple(sorted(preempted)) == s.expect.preempts
        else:
            assert _preempted(cluster, running) == set()
            assert [cluster.state(jid) for _, jid in running] == ["RUNNING"] * len(running)
        if s.max_runtime_s:
            assert cluster.job(arriving)["TimeLimit"] == slurm.time_limit(s.max_runtime_s)
    finally:
        cluster.cancel_all()
        _power_down(cluster, allocated)

RELAY = "/var/spool/slurm/gpupool-burst-requests"  # the lab's ResumeProgram's record


@dataclass
class AwsLab:
    """The lab's AWS for the burst proofs: moto reachable from lab hosts, declared as the
    Pulumi program declares the burst region (subnets, launch templates, the munge secret),
    and the burst data plane that boots its instances (gpupool.lab.burst_hosts)."""
    ec2: Any
    config: dict[str, Any]
    url: str
    region: str
    subnets: dict[str, tuple[str, str]]
    image: str
    capacity: localaws.CapacityProxy  # the resume program's EC2: moto, short on demand
    handled: dict[str, int] = field(default_factory=dict)  # relay requests acted on, by kind

    def sync(self) -> dict[str, str]:
        return burst_hosts.sync(DESC, self.ec2, self.image, self.url, self.region)

    def _new_requests(self, cluster: Slurm, kind: str) -> list[list[str]]:
        """The hostlists of slurmctld's requests of one kind not handled yet (the relay
        file only grows while the proofs run)."""
        lines = [ln.split() for ln in cluster.sh(f"cat {RELAY} 2>/dev/null || true").splitlines()
                 if len(ln.split()) == 3 and ln.split()[1] == kind]
        new = lines[self.handled.get(kind, 0):]
        return [burst.expand_hostlist(ln[2]) for ln in new]

    def _handled(self, kind: str) -> None:
        self.handled[kind] = self.handled.get(kind, 0) + 1

    def resume_requested(self, cluster: Slurm,
                         release: Callable[[str, int], None] = burst.release_later
                         ) -> tuple[str, list[burst.Launched]]:
        """slurmctld's next resume request (one node), carried out by the real resume
        program."""
        (node,), *_ = wait_for("slurmctld's resume request",
                               lambda: self._new_requests(cluster, "resume"), 60)
        self._handled("resume")
        return node, burst.resume(self.ec2, self.config, [node],
                                  update=scontrol_update(cluster), release=release)

    def suspend_requested(self, cluster: Slurm, *nodes: str, instance: bool = True,
                          settled: Callable[[str], bool] = lambda s: s in ("idle~", "idle%")
                          ) -> None:
        """slurmctld's suspend requests for idle nodes (one request may name several),
        carried out by the real suspend program's steps: terminate their instances (when
        they have them), lift a spot drain, start the controller's timer that drains a
        boot gate's failure again; then the nodes reach a settled state."""
        asked: set[str] = set()

        def requested() -> bool:
            for hostlist in self._new_requests(cluster, "suspend"):
                self._handled("suspend")
                asked.update(hostlist)
            return asked >= set(nodes)

        wait_for("slurmctld's suspend request", requested, 120)
        # The suspend program's own query (burst.sinfo_reasons), on the controller.
        reasons = cluster.sh("SLURM_TIME_FORMAT=standard " + shlex.join(burst.SINFO_REASONS))
        assert bool(burst.suspend(self.ec2, list(nodes))) == instance
        burst.clear_spot_drains(burst.spot_records(reasons), list(nodes),
                                update=scontrol_update(cluster))
        burst.hold_gate_drains(burst.gate_failures(reasons), list(nodes),
                               self.config["suspend_timeout_s"],
                               lambda argv: cluster.sh(shlex.join(argv)))
        assert self.sync() == {}
        states: dict[str, str] = {}

        def down() -> bool:
            states.update(cluster.node_states())
            return all(settled(states.get(n, "")) for n in nodes)

        try:
            wait_for("the nodes powered down", down, 120)
        except lab_mod.LabError as e:
            raise AssertionError(f"{e}: {[(n, states.get(n)) for n in nodes]}") from e
        assert burst.live_instances(self.ec2, list(nodes)) == {}


def scontrol_update(cluster: Slurm) -> Callable[..., None]:
    """The burst program's `scontrol update ARGS` (an argv there), run on the controller."""
    return lambda *args: cluster.sh("scontrol update " + " ".join(map(shlex.quote, args)))


def _scraped(cluster: Slurm, node: str, address: str) -> dict[str, str]:
    """The health Prometheus (on the controller) reports for each of its jobs' targets on
    node at address: the targets come from the scheduler exporter's service discovery
    (roles/monitoring), never from an inventory."""
    answer = json.loads(cluster.http_get(9090, "/api/v1/targets?state=active",
                                         monitoring=True))
    return {t["labels"]["job"]: t["health"] for t in answer["data"]["activeTargets"]
            if t["labels"].get("node") == node and t["scrapeUrl"].startswith(f"http://{address}:")}


TCP_PROBE_S = 3


def _tcp(address: str, port: int) -> str:
    """A TCP connection from this machine: open, refused (admitted, nothing listening) or
    timeout (dropped)."""
    try:
        with socket.create_connection((address, port), timeout=TCP_PROBE_S):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"


def on_host(node: str, command: str) -> str:
    """A command's output on a burst host (empty when the host is gone)."""
    return lab_mod.podman("exec", burst_hosts.host_name(DESC, node), "sh", "-c", command,
                          check=False).stdout


@pytest.fixture(scope="module")
def aws_lab(cluster):
    cluster.sh(f"rm -f {RELAY}")
    with contextlib.ExitStack() as stack:
        stack.callback(burst_hosts.remove_all, DESC)
        t = time.monotonic()
        image = burst_image.build(DESC)
        cluster.figures["burst_image_ready_s"] = round(time.monotonic() - t, 1)
        url = stack.enter_context(localaws.endpoint(burst_hosts.aws_address(DESC)))
        capacity = localaws.CapacityProxy(url, burst_hosts.aws_address(DESC))
        stack.callback(capacity.stop)
        config = {**slurm.burst_config(DESC), "endpoint_url": capacity.url}
        ec2 = burst.client(config, [c.name for c in CLOUD])
        region = DESC.burst_groups[next(iter(DESC.burst_groups))].region
        subnets = burst_hosts.declare_network(ec2, DESC, region)
        ami = ec2.describe_images(MaxResults=5)["Images"][0]["ImageId"]
        burst_hosts.declare_templates(ec2, DESC, ami)
        # The proofs start from usable cloud nodes, whatever ran before on this shared lab
        # (seen: a node left NOT_RESPONDING after earlier runs, never resumed again).
        _power_down(cluster, {c.name for c in CLOUD if not _usable(cluster, c.name)},
                    "not usable before the burst proofs")
        # The operator's step after `pulumi up`: the controller's key into the secret.
        key = base64.b64decode(cluster.sh("base64 -w0 /etc/munge/munge.key"))
        boto3.client("secretsmanager", region_name=region, endpoint_url=url).create_secret(
            Name=names.munge_secret_name(DESC), SecretBinary=key)
        yield AwsLab(ec2, config, url, region, subnets, image, capacity)


def _boot_failure(node: str, cluster: Slurm) -> str:
    boot = on_host(node, "tail -30 /var/log/cloud-init-output.log; systemctl --no-pager "
                   "status slurmd munge gpupool-fixture-imds | tail -30")
    return f"{cluster.sh(f'scontrol show node {node}')}\n{boot}"


def _metadata_and_secret(node: str, user: str) -> tuple[str, str]:
    """Whether user's process on a burst host gets a metadata token, and the munge key
    from Secrets Manager (the CLI's own timeouts bound each; it finds credentials only at
    the metadata service, as on EC2)."""
    q = shlex.quote
    group = next(iter(DESC.burst_groups.values()))
    imds_put = ("curl -sf --max-time 5 -X PUT http://169.254.169.254/latest/api/token"
             " -H 'X-aws-ec2-metadata-token-ttl-seconds: 60'")
    secret = (f"aws secretsmanager get-secret-value --region {q(group.region)} --secret-id "
              f"{q(names.munge_secret_name(DESC))} --query SecretBinary --output text "
              "--cli-connect-timeout 5 --cli-read-timeout 10")
    run = f"runuser -u {q(user)} -- env HOME=/tmp AWS_METADATA_SERVICE_NUM_ATTEMPTS=1 "
    out = on_host(node, (
        f"if {run}{imds_put} >/dev/null 2>&1; then echo reached; else echo refused; fi; "
        f"if err=$({run}{secret} 2>&1 >/dev/null); then echo read; "
        'elif echo "$err" | grep -q "Unable to locate credentials"; then '
        "echo 'refused: no credentials'; else echo \"other: $err\" | head -c 300; fi"))
    reached, read, *_ = [*out.strip().splitlines(), "", ""]
    return reached, read


def test_burst_instance_boots_into_the_pool_runs_the_job_and_is_terminated(cluster, aws_lab):
    """A job no on-prem node can take: slurmctld asks for a cloud node, the real resume
    program launches it through its group's launch template into the pool's subnet (moto;
    the first instance type out of capacity, so the next in the declared order), the lab
    turns the instance into a host booted from the burst image with the template's real
    user-data, which takes the node name from the instance tags, the munge key from Secrets
    Manager, passes the acceptance gate's quick tier and starts slurmd configless. The job
    runs there; idle, the node is suspended
    and its instance terminated, which removes the host."""
    group = next(iter(aws_lab.config["groups"].values()))
    first, second, *_ = group["instance_types"]
    full = [cluster.sbatch(f"-p {LOW}", f"-A {TEAMS[0]}", f"--gpus={GPUS_PER_NODE}",
                           "-C onprem", work=180) for _ in range(3)]
    wait_for("the pool full", lambda: all(cluster.state(j) == "RUNNING" for j in full), 30)
    t0 = time.monotonic()
    job = cluster.sbatch(f"-p {LOW}", f"-A {TEAMS[1]}", f"--gpus={GPUS_PER_NODE}",
                         script=UNTIL_SCRAPED, work=SCRAPE_WAIT_S)
    aws_lab.capacity.short = {first: localaws.ICE}
    try:
        node, (launched,) = aws_lab.resume_requested(cluster)
    finally:
        aws_lab.capacity.short = {}
    assert launched.instance_type == second
    assert aws_lab.capacity.refused[-1] == (launched.market, first)
    (instance,) = [i for r in aws_lab.ec2.describe_instances(
        InstanceIds=[launched.instance_id])["Reservations"] for i in r["Instances"]]
    assert aws_lab.subnets[instance["SubnetId"]][0] == group["subnet_segment"]
    t1 = time.monotonic()
    # Wall clock as well: the host's files are stamped by this machine's kernel clock.
    launched_at = time.time()
    cluster.figures["burst_launch_s"] = round(t1 - t0, 1)
    assert aws_lab.sync() == {node: launched.instance_id}
    try:
        wait_for("the job running on the burst host",
                 lambda: cluster.state(job) in ("RUNNING", "COMPLETED"), 240)
        running_at = time.time()
        cluster.figures["burst_boot_to_job_running_s"] = round(time.monotonic() - t1, 1)
        # While the job runs (an idle node is soon suspended): Prometheus scrapes the
        # node's node and DCGM exporters at the instance's address, found through Slurm.
        address = instance["PrivateIpAddress"]
        wait_for("Prometheus scraping the burst node's exporters", lambda: _scraped(
            cluster, node, address) == {"node": "up", "dcgm": "up"}, SCRAPE_WAIT_S)
        on_host(node, f"touch {SCRAPED}")
        wait_for("the job done", lambda: cluster.state(job) == "COMPLETED", SCRAPE_WAIT_S)
    except lab_mod.LabError as e:
        raise AssertionError(f"{e}\n{_boot_failure(node, cluster)}") from e
    cluster.figures["burst_resume_to_job_done_s"] = round(time.monotonic() - t0, 1)
    assert cluster.job(job)["NodeList"] == node
    shown = cluster.sh(f"scontrol show node {node}")
    assert f"NodeAddr={instance['PrivateIpAddress']} " in shown, shown
    # The node's key came from the secret (the image carries none), its configuration
    # from slurmctld (configless: the image carries no slurm.conf).
    assert on_host(node, "sha256sum < /etc/munge/munge.key").strip() == cluster.sh(
        "sha256sum < /etc/munge/munge.key").strip()
    assert on_host(node, "ls /etc/slurm/slurm.conf 2>/dev/null || echo none").strip() == "none"
    # A job's user has the uid the description fixes here too (the image's accounts).
    user, uid = next(iter(DESC.ids.users.items()))
    assert on_host(node, f"id -u {user}").strip() == str(uid)
    # The image's host firewall is up: this machine speaks from the burst network's gateway,
    # in the burst block, whose flow of protocol `all` leaves the management plane closed
    # (sshd dropped) and lets other ports in (refused: nothing listens there); slurmd and
    # the exporters answered the controller above.
    assert "policy drop" in on_host(node, "nft list chain inet gpupool input")
    assert (_tcp(address, 22), _tcp(address, flows.canary_port(DESC))) == (
        "timeout", "refused")
    assert "slurm.conf" in on_host(node, "ls /var/lib/slurm/slurmd/conf-cache")
    # Only root reaches the metadata service, and with it the node role's credentials: a
    # member's process (as any job's is) is refused a token, and without credentials gets
    # no munge key from Secrets Manager; root's still gets both here (the metadata fixture
    # serves one credential and moto enforces no IAM: on EC2 the run role's is refused).
    assert _metadata_and_secret(node, "root") == ("reached", "read")
    assert _metadata_and_secret(node, user) == ("refused", "refused: no credentials")
    # The boot swapped the template's boot profile for the run profile once the key was
    # in place: the instance's association in the lab's EC2 names the run profile.
    (association,) = aws_lab.ec2.describe_iam_instance_profile_associations(Filters=[
        {"Name": "instance-id", "Values": [launched.instance_id]}])[
        "IamInstanceProfileAssociations"]
    group_name = next(iter(aws_lab.config["groups"]))
    assert association["IamInstanceProfile"]["Arn"].endswith(
        f":instance-profile/{names.run_profile_name(DESC, group_name)}"), association
    # The gate's quick tier passed on the host before slurmd started (gpupool/gate/boot.py).
    report_file = f"{launch.GATE_REPORTS}/{node}.json"
    report = json.loads(on_host(node, f"cat {report_file}"))
    assert report["verdict"] == "pass", report["failed"]
    # Boot to job running, split where the host's gate starts and ends (the report is
    # written as the gate ends): boot is the host's start, systemd and the user-data up to
    # the gate; registration is slurmd's start, its configless fetch and registration,
    # and the job's launch there.
    gate_end = float(on_host(node, f"stat -c %.9Y {report_file}"))
    cluster.figures["burst_gate_s"] = report["duration_s"]
    cluster.figures["burst_boot_s"] = round(gate_end - report["duration_s"] - launched_at, 1)
    cluster.figures["burst_registration_s"] = round(running_at - gate_end, 1)

    cluster.cancel_all()
    t2 = time.monotonic()
    aws_lab.suspend_requested(cluster, node)
    cluster.figures["burst_idle_to_suspended_s"] = round(time.monotonic() - t2, 1)


def test_no_capacity_anywhere_sets_cloud_nodes_down_with_the_reason(cluster, aws_lab):
    """Every instance type out of capacity: each cloud node slurmctld asks for is set DOWN
    at once with the reason and a bounded blackout (the release timer, recorded here), so
    its job goes back to the queue instead of waiting out ResumeTimeout; no instance is
    left running."""
    group = next(iter(aws_lab.config["groups"].values()))
    full = [cluster.sbatch(f"-p {LOW}", f"-A {TEAMS[0]}", f"--gpus={GPUS_PER_NODE}",
                           "-C onprem", work=180) for _ in range(3)]
    wait_for("the pool full", lambda: all(cluster.state(j) == "RUNNING" for j in full), 30)
    job = cluster.sbatch(f"-p {LOW}", f"-A {TEAMS[1]}", f"--gpus={GPUS_PER_NODE}", work=5)
    released: list[tuple[str, int]] = []
    aws_lab.capacity.short = dict.fromkeys(group["instance_types"], localaws.ICE)
    downed = []
    try:
        # slurmctld moves the job to the next cloud node as each goes down: one request
        # per node of the group, then none is left.
        for _ in group["nodes"]:
            node, launched = aws_lab.resume_requested(
                cluster, release=lambda n, s: released.append((n, s)))
            assert launched == []
            downed.append(node)
            reason = cluster.sh(f"sinfo -h -n {node} -o '%E'").strip()
            assert reason.startswith("gpupool-burst: no capacity"), reason
            assert cluster.node_states()[node].startswith("down"), cluster.node_states()
        assert sorted(downed) == sorted(group["nodes"])
        assert released == [(n, group["capacity_blackout_s"]) for n in downed]
        wait_for("the job pending again", lambda: cluster.state(job) == "PENDING", 30)
        assert burst.live_instances(aws_lab.ec2, group["nodes"]) == {}
    finally:
        aws_lab.capacity.short = {}
        cluster.cancel_all()
        # What the release timers run at the end of the blackout (burst.release_later).
        for node in downed:
            cluster.sh(f"scontrol update nodename={node} state=power_down_force")
    # Through SuspendProgram (nothing to terminate) back to idle and powered down.
    aws_lab.suspend_requested(cluster, *downed, instance=False)


def test_spot_notice_drains_the_burst_node_and_its_job_resumes_elsewhere(cluster, aws_lab):
    """A deferred job on a spot burst node; EC2's two-minute notice (the metadata fixture):
    the node's watcher drains it with the spot record and requeues the job, which saves a
    checkpoint on the signal and runs again on an on-prem node, from its checkpoint."""
    full = [cluster.sbatch(f"-p {LOW}", f"-A {TEAMS[0]}", f"--gpus={GPUS_PER_NODE}",
                           "-C onprem", work=600) for _ in range(3)]
    wait_for("the pool full", lambda: all(cluster.state(j) == "RUNNING" for j in full), 30)
    job = cluster.sbatch(f"-p {LOW}", f"-A {TEAMS[1]}", f"--gpus={GPUS_PER_NODE}",
                         script=CHECKPOINTING, work=900, resume_work=5)
    node, (launched,) = aws_lab.resume_requested(cluster)
    assert launched.market == "spot"
    aws_lab.sync()
    try:
        wait_for("the job running on the spot node", lambda: cluster.state(job) == "RUNNING",
                 240)
    except lab_mod.LabError as e:
        raise AssertionError(f"{e}\n{_boot_failure(node, cluster)}") from e
    assert on_host(node, f"systemctl is-active {launch.SPOT_WATCH_UNIT.format(node)}").strip() \
        == "active"
    # The notice only once the job step traps SIGTERM: a requeue in the moment between the
    # batch script's start and the step's trap would end the job with no checkpoint.
    wait_for("the job's step trapping SIGTERM", lambda: (
        "trapping" in on_host(node, f"cat /tmp/slurm-{job}.out")), 30)
    # On-prem frees up, so the requeued job has somewhere to go.
    cluster.sh(f"scancel {' '.join(full)}")
    t0 = time.monotonic()
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
    burst_hosts.notice(DESC, node, "terminate", when)
    reason = wait_for("the spot drain", lambda: (
        (r := cluster.sh(f"sinfo -h -n {node} -o '%E'").strip()).startswith(
            "gpupool: spot interruption notice") and r), 60)
    assert f"terminating at {when}" in reason
    assert f"instance-type={launched.instance_type}" in reason
    wait_for("the job requeued", lambda: cluster.sacct(job)[0]["State"] in (
        "REQUEUED", "PREEMPTED"), 60)
    cluster.figures["spot_notice_to_requeued_s"] = round(time.monotonic() - t0, 1)
    # The job's output reaches its file on the host a moment after accounting has the
    # requeue: read it until the checkpoint line is there (bounded).
    wait_for("the checkpoint line in the job's output on the spot host", lambda: (
        "checkpoint" in on_host(node, f"cat /tmp/slurm-{job}.out")), 30)
    wait_for("the job running again", lambda: cluster.state(job) in ("RUNNING", "COMPLETED"),
             120)
    cluster.figures["spot_notice_to_running_again_s"] = round(time.monotonic() - t0, 1)
    done = wait_for("the job completed", lambda: (
        (recs := cluster.sacct(job))[-1]["State"] == "COMPLETED" and recs), 120)
    assert cluster.job(job)["NodeList"] != node
    assert "restart=1" in cluster.output(job), done
    cluster.cancel_all()
    aws_lab.suspend_requested(cluster, node)
    # The record stays on the node (for the next resume to avoid that capacity); the drain
    # is lifted, so the node can be resumed again.
    assert "drain" not in cluster.sh(f"sinfo -h -n {node} -o '%T'")


def broken_image(image: str) -> str:
    """The burst image drifted on purpose: an sshd drop-in read before the hardening's
    that takes passwords again. Everything else boots; the gate's quick tier must catch it."""
    ref = f"{image}-sshd-drift"
    if lab_mod.podman("image", "exists", ref, check=False).returncode == 0:
        return ref
    builder = f"gpupool-burst-drift-{DESC.pool.name}"
    lab_mod.podman("rm", "-f", builder, check=False)
    try:
        lab_mod.podman("run", "--name", builder, "--entrypoint", "/bin/sh", image, "-c",
                       "printf 'PasswordAuthentication yes\\n' > "
                       "/etc/ssh/sshd_config.d/00-drift.conf", timeout=120)
        lab_mod.podman("commit", "--change", 'CMD ["/sbin/init"]', "--change", "ENTRYPOINT []",
                       "--change", f"LABEL gpupool.pool={DESC.pool.name}", builder, ref,
                       timeout=300)
    finally:
        lab_mod.podman("rm", "-f", builder, check=False)
    return ref


def test_a_burst_host_that_fails_its_gate_never_takes_a_job(cluster, aws_lab):
    """The burst image broken on purpose (sshd_hardened must fail): the instance boots, its
    user-data runs the gate's quick tier before slurmd, which fails, so the node drains
    itself with the failed check as the reason and powers down. Its job goes back to the
    queue without having run there, slurmd never started on the host, and the suspend
    program terminates the instance; the node stays drained for on-call."""
    node = CLOUD[0].name
    full = [cluster.sbatch(f"-p {LOW}", f"-A {TEAMS[0]}", f"--gpus={GPUS_PER_NODE}",
                           "-C onprem", work=180) for _ in range(3)]
    wait_for("the pool full", lambda: all(cluster.state(j) == "RUNNING" for j in full), 30)
    # Held to this node, so the requeued job waits here instead of trying the next one.
    job = cluster.sbatch(f"-p {LOW}", f"-A {TEAMS[1]}", f"--gpus={GPUS_PER_NODE}",
                         f"-w {node}", work=5)
    good, aws_lab.image = aws_lab.image, broken_image(aws_lab.image)
    try:
        asked, (launched,) = aws_lab.resume_requested(cluster)
        assert asked == node
        assert aws_lab.sync() == {node: launched.instance_id}
        reason = wait_for("the node's own drain", lambda: (
            (r := cluster.sh(f"sinfo -h -n {node} -o '%E'").strip()).startswith(
                "gpupool gate failed") and r), 180)
        assert reason == "gpupool gate failed: system.sshd_hardened", reason
        report = json.loads(on_host(node, f"cat {launch.GATE_REPORTS}/{node}.json"))
        assert report["verdict"] == "fail" and report["failed"] == ["system.sshd_hardened"]
        wait_for("the job back in the queue", lambda: cluster.state(job) == "PENDING", 60)
        assert on_host(node, "systemctl is-active slurmd || true").strip() != "active"
        assert on_host(node, f"ls /tmp/slurm-{job}.out 2>/dev/null || echo none").strip() \
            == "none"
        cluster.sh(f"scancel {job}")
        # The power-down goes through SuspendProgram: the instance is terminated, and the
        # node, whose drain Slurm lifts as it powers down (idle_on_node_suspend), is
        # drained again with its reason by the controller's timer.
        aws_lab.suspend_requested(cluster, node, settled=lambda s: s.startswith("drain"))
        assert cluster.sh(f"sinfo -h -n {node} -o '%E'").strip() == reason
    finally:
        aws_lab.image = good
        cluster.cancel_all()
    # On-call's step once the image is fixed.
    cluster.sh(f"scontrol update nodename={node} state=resume")
    wait_for("the node back to idle", lambda: cluster.node_states().get(
        node, "").startswith("idle"), 60)


def test_drain_and_resume_hooks(cluster):
    """The hooks the acceptance gate uses: drain with a reason, resume; both idempotent."""
    node = burst.expand_hostlist(ONPREM)[-1]
    reason = "gpupool test: dcgm diag failed"

    def run(name: str, *extra: str) -> int:
        run = playbook("-e", f"node={node}", *extra, name=name)
        assert run.rc == 0, run.output[-3000:]
        return run.recap[node]["changed"]  # the play runs for the node, scontrol on the controller

    assert run("node_drain.yml", "-e", f"reason='{reason}'") == 1
    assert cluster.sh(f"sinfo -h -n {node} -o '%T|%E'").strip() == f"drained|{reason}"
    assert run("node_drain.yml", "-e", f"reason='{reason}'") == 0
    assert run("node_resume.yml") == 1
    wait_for("the node idle", lambda: cluster.node_states()[node] == "idle", 30)
    assert run("node_resume.yml") == 0


def test_node_service_waits_for_the_job_then_takes_the_node_out(cluster):
    """playbooks/node_service.yml on a node with a job running: drained with the service
    reason, the job left to finish (not killed), slurmd stopped; a second run changes
    nothing; back in service by starting slurmd and node_resume.yml (in a full pool,
    onboard.yml, whose burn-in gate needs the roles this module does not converge)."""
    node = burst.expand_hostlist(ONPREM)[0]
    job = cluster.sbatch(f"-p {LOW}", f"-A {TEAMS[0]}", f"-w {node}", "--gpus=1", work=15)
    wait_for("the job running", lambda: cluster.state(job) == "RUNNING", 60)

    def run(name: str, *extra: str) -> int:
        run = playbook("-e", f"node={node}", "-e", "admission_idle_delay=2", *extra, name=name)
        assert run.rc == 0, run.output[-3000:]
        return run.recap[node]["changed"]

    try:
        assert run("node_service.yml", "-e", "reason='RMA GPU 3'") > 0
        assert cluster.sacct(job)[-1]["State"] == "COMPLETED"  # waited for, not killed
        assert cluster.sh("systemctl is-active slurmd || true", node=node).strip() != "active"
        state, reason = cluster.sh(f"sinfo -h -n {node} -o '%T|%E'").strip().split("|")
        # drained, or down and drained once slurmctld notices slurmd gone (SlurmdTimeout)
        assert state.startswith(("drain", "down")), state
        assert reason == "gpupool-gate: service: RMA GPU 3", reason
        assert run("node_service.yml", "-e", "reason='RMA GPU 3'") == 0
    finally:
        cluster.sh("systemctl start slurmd", node=node)
        assert run("node_resume.yml") == 1
    wait_for("the node idle", lambda: cluster.node_states()[node] == "idle", 60)


def test_decommission_waits_for_the_job_then_stops_the_node_and_records_it(cluster):
    """playbooks/decommission.yml (issue 17) on a node with a job running: drained as
    decommissioned, the job left to finish, slurmd and munge stopped and disabled, the
    verdict recorded on the controller; a second run changes nothing. The node is put back
    by hand (services enabled, record removed, node_resume.yml) for the tests after this."""
    node = burst.expand_hostlist(ONPREM)[-1]
    record = f"/var/lib/gpupool/admission/{node}.json"
    job = cluster.sbatch(f"-p {LOW}", f"-A {TEAMS[0]}", f"-w {node}", "--gpus=1", work=10)
    wait_for("the job running", lambda: cluster.state(job) == "RUNNING", 60)

    def run(name: str) -> int:
        run = playbook("-e", f"node={node}", "-e", "admission_idle_delay=2", name=name)
        assert run.rc == 0, run.output[-3000:]
        return run.recap[node]["changed"]

    saved = cluster.sh(f"cat {record} 2>/dev/null || true")
    try:
        assert run("decommission.yml") > 0
        assert cluster.sacct(job)[-1]["State"] == "COMPLETED"  # waited for, not killed
        for unit in ("slurmd", "munge"):
            assert cluster.sh(f"systemctl is-active {unit} || true", node=node).strip() != "active"
            assert cluster.sh(f"systemctl is-enabled {unit} || true", node=node).strip() \
                == "disabled"
        state, reason = cluster.sh(f"sinfo -h -n {node} -o '%T|%E'").strip().split("|")
        assert state.startswith(("drain", "down")), state
        assert reason == "gpupool-gate: decommissioned", reason
        assert json.loads(cluster.sh(f"cat {record}")) == {"node": node,
                                                           "verdict": "decommissioned"}
        assert run("decommission.yml") == 0
    finally:
        cluster.sh("systemctl enable --now munge slurmd", node=node)
        if saved.strip():
            cluster.write(record, saved.strip())
        else:
            cluster.sh(f"rm -f {record}")
        assert run("node_resume.yml") == 1
    wait_for("the node idle", lambda: cluster.node_states()[node] == "idle", 60)
