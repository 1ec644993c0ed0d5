"""The Slurm policy proven by real jobs on a real Slurm (22.05, Debian 12) in the lab hosts.

One Slurm lab for the module: the session's lab hosts (fixture `lab`), the slurm role
converged over SSH, jobs submitted on lab-ctl. Every claim is read back from Slurm (squeue,
sacct, sprio, sshare, scontrol). Fixtures, named as such:
- the lab's GPUs are character devices (major 195) that the role creates from tmpfiles.d:
  slurmd counts and hands them out, nothing computes on them;
- the burst "cloud": slurmctld's ResumeProgram/SuspendProgram in the lab only record
  requests (no cloud is reachable); this test acts on them with the real gpupool.onhost.burst code
  against a local EC2 (moto on 127.0.0.1) and "boots" the cloud node by starting its slurmd
  on lab-ctl.
- jobs are submitted as root on behalf of each team (root is added to the team accounts).
Timings are recorded in bench/results/slurm_lab.json, never asserted.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import pytest
import yaml

import bench.slurm_lab
from gpupool.lab import hosts as lab_mod
from gpupool.lab import localaws, slurm_cluster
from gpupool.onhost import burst
from gpupool.paths import PROJECT_ROOT
from gpupool.render import slurm
from gpupool.spec.facts import controller, rack_places
from tests.conftest import lab_description
from tests.integration.conftest import Run, ansible_playbook

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
ROLE_DEFAULTS = yaml.safe_load((PROJECT_ROOT / "roles/slurm/defaults/main.yml").read_text())
RUNNERS = [ROLE_DEFAULTS["slurm_prolog_program"], ROLE_DEFAULTS["slurm_epilog_program"]]

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


def playbook(*extra: str, name: str = "slurm.yml") -> Run:
    return ansible_playbook(lab_mod.inventory_path(DESC), f"playbooks/{name}",
                            "-e", f"@{lab_mod.lab_dir(DESC) / 'slurm-vars.yml'}", *extra)


@pytest.fixture(scope="module")
def cluster(lab: lab_mod.LabState):
    """The session's lab hosts (tests/integration/conftest.py) with Slurm converged."""
    figures: dict[str, Any] = {"lab_up_s": lab.timings.get("up_s")}
    (lab_mod.lab_dir(DESC) / "slurm-vars.yml").write_text(
        yaml.safe_dump({"gpupool_slurm": slurm.plan(DESC)}))
    start = time.monotonic()
    run = playbook()
    assert run.rc == 0, run.output[-6000:]
    figures["converge_s"] = round(time.monotonic() - start, 1)
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


def test_converge_is_idempotent_and_check_mode_clean(cluster):
    t = time.monotonic()
    again = playbook()
    cluster.figures["reconverge_s"] = round(time.monotonic() - t, 1)
    assert again.rc == 0, again.output[-3000:]
    assert {h: r["changed"] for h, r in again.recap.items()} == dict.fromkeys(DESC.nodes, 0)
    check = playbook("--check")
    assert check.rc == 0, check.output[-3000:]
    assert check.total("changed") == 0, check.output[-3000:]


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
    # Either way it was requeued once and then finished: on a loaded host the job's own
    # `scontrol requeue` may lose the race with GraceTime, and Slurm requeues it instead.
    assert [r["State"] for r in done][1:] == ["COMPLETED"], done
    assert done[0]["State"] in ("REQUEUED", "PREEMPTED"), done
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


def test_two_node_job_lands_on_one_leaf(cluster):
    job = cluster.sbatch(f"-p {MID}", f"-A {TEAMS[0]}", "-N 2",
                         f"--gpus-per-node={GPUS_PER_NODE}", "-C onprem", work=2)
    wait_for("the job done", lambda: cluster.state(job) == "COMPLETED", 60)
    nodes = set(burst.expand_hostlist(cluster.job(job)["NodeList"]))
    places = rack_places(DESC)
    leaves = {places[DESC.nodes[n].rack].leaf for n in nodes}
    assert len(nodes) == 2
    assert len(leaves) == 1, nodes


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


def test_burst_node_resumed_when_full_and_suspended_when_idle(cluster):
    relay = "/var/spool/slurm/gpupool-burst-requests"
    cluster.sh(f"rm -f {relay}")
    # The cloud image's slurmd, installed up front on lab-ctl where the "instance" runs,
    # and purged afterwards: lab-ctl must leave this proof as the roles left it (an
    # unheld slurmd there fails the gate's software.locked_version_held[slurm]).
    had_slurmd = cluster.sh("command -v slurmd || true").strip() != ""
    cluster.sh("command -v slurmd >/dev/null || (DEBIAN_FRONTEND=noninteractive apt-get "
               "install -y -q --no-install-recommends slurmd >/dev/null && systemctl "
               "disable --now slurmd)", timeout=300)

    node = CLOUD[0].name
    with contextlib.ExitStack() as stack:
        if not had_slurmd:
            stack.callback(cluster.sh, "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q "
                           "slurmd >/dev/null", timeout=300,
                           check=False)
        stack.callback(cluster.sh, "[ -f /run/slurmd.pid ] && kill $(cat /run/slurmd.pid)",
                       check=False)
        # The burst image is built by the same slurm role as an on-prem node, so it carries
        # the Prolog=/Epilog= runners slurm.conf names (a missing one drains the node and
        # requeues the job); the fixture instance gets copies, removed afterwards. Their
        # part directories stay absent (no DCGM here), which the runners take as no parts.
        onprem = burst.expand_hostlist(ONPREM)[0]
        for program in RUNNERS:
            if cluster.sh(f"[ -e {program} ] || echo absent").strip() == "absent":
                cluster.write(program, cluster.sh(f"cat {program}", node=onprem).rstrip("\n"))
                cluster.sh(f"chmod 0755 {program}")
                stack.callback(cluster.sh, f"rm -f {program}", check=False)
        config = slurm.burst_config(DESC)
        config["endpoint_url"] = stack.enter_context(localaws.endpoint())
        ec2 = burst.client(config, [c.name for c in CLOUD])
        image = ec2.describe_images(MaxResults=5)["Images"][0]["ImageId"]
        for group in config["groups"].values():
            ec2.create_launch_template(LaunchTemplateName=group["launch_template"],
                                       LaunchTemplateData={"ImageId": image})

        full = [cluster.sbatch(f"-p {LOW}", f"-A {TEAMS[0]}", f"--gpus={GPUS_PER_NODE}",
                               "-C onprem", work=120) for _ in range(3)]
        wait_for("the pool full", lambda: all(cluster.state(j) == "RUNNING" for j in full), 30)
        t0 = time.monotonic()
        job = cluster.sbatch(f"-p {LOW}", f"-A {TEAMS[1]}", f"--gpus={GPUS_PER_NODE}", work=5)
        line = wait_for("slurmctld's resume request", lambda: cluster.sh(
            f"grep ' resume ' {relay} || true").strip(), 60)
        requested = burst.expand_hostlist(line.split()[-1])
        assert len(requested) == 1
        node = requested[0]
        _, group = burst.group_of(config, node)
        ctl_addr = DESC.nodes[CTL].addresses["management"]

        def update(*args: str) -> None:
            # The program tells slurmctld the instance's address; the fixture instance is
            # lab-ctl, so its address stands in for the (unreachable) EC2 private IP.
            cluster.sh("scontrol update " + " ".join(
                f"nodeaddr={ctl_addr}" if a.startswith("nodeaddr=") else a for a in args))

        launched = burst.resume(ec2, config, [node], update=update)
        assert [g.instance_type for g in launched] == group["instance_types"][:1]
        # The "instance boots": its slurmd starts (on lab-ctl) and registers the node; -b
        # reports a fresh boot (a container shares the host's boot time, which slurmctld
        # would take for a node that never rebooted). Configless, as a burst image boots:
        # slurmd takes its configuration from slurmctld (--conf-server), not from /etc/slurm.
        port = ROLE_DEFAULTS["slurm_ctld_port"]
        cluster.sh(f"for i in $(seq 0 {GPUS_PER_NODE - 1}); do [ -e /dev/nvidia$i ] || "
                   f"mknod /dev/nvidia$i c 195 $i; done; mkdir -p /var/lib/slurm/slurmd; "
                   f"slurmd -b -N {node} --conf-server {ctl_addr}:{port}")
        # What slurmd fetched is cached in its spool (22.05: SlurmdSpoolDir/conf-cache);
        # removed afterwards.
        cache = "/var/lib/slurm/slurmd/conf-cache"
        stack.callback(cluster.sh, f"rm -rf {cache}", check=False)
        try:
            wait_for("the job on the cloud node", lambda: cluster.state(job) == "COMPLETED",
                     120)
        except lab_mod.LabError as e:
            raise AssertionError(f"{e}\n{cluster.sh(f'scontrol show node {node}')}\n"
                                 f"{cluster.sh(f'scontrol show job {job}')}") from e
        cluster.figures["burst_resume_to_job_done_s"] = round(time.monotonic() - t0, 1)
        fetched = cluster.sh(f"ls {cache} 2>/dev/null || true").split()
        assert {"slurm.conf", "gres.conf"} <= set(fetched), (
            fetched, cluster.sh("tail -20 /var/log/slurm/slurmd.log", check=False))
        assert cluster.job(job)["NodeList"] == node
        cluster.cancel_all()
        t1 = time.monotonic()
        wait_for("slurmctld's suspend request", lambda: cluster.sh(
            f"grep ' suspend ' {relay} || true").strip(), 120)
        assert burst.suspend(ec2, [node])
        cluster.sh("kill $(cat /run/slurmd.pid)")
        wait_for("the node powered down", lambda: cluster.node_states().get(node) in (
            "idle~", "idle%"), 120)
        cluster.figures["burst_idle_to_suspended_s"] = round(time.monotonic() - t1, 1)
        assert burst.live_instances(ec2, [node]) == {}


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
