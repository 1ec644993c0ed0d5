"""Replay a trace on the lab's real Slurm under two policies in one run, or under two
descriptions' policies (`replay --compare`: another description's slurm.conf policy and
accounting put on the lab for its run, and the lab's own put back).

- gpupool: the configuration the slurm role renders from the description (task classes as
  partitions with preemption that requeues, team quotas, fairshare, backfill);
- baseline: manual allocation as pools run without gpupool: each team's nodes pinned to
  it (the nodes' `owner_team`), one partition per team, first come first served
  (sched/builtin), no classes, no preemption.

Every job sleeps for its (time-compressed) duration in 0.1 s steps, keeping its progress
on the shared checkpoint tier, so a preempted job resumes where it stopped.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import datetime
from typing import Any

from gpupool.exercise.context import Context
from gpupool.exercise.drills import convention_step
from gpupool.lab.hosts import LabError
from gpupool.lab.slurm_cluster import (
    SlurmLab,
    SlurmLabError,
    onprem_nodes,
    playbook,
    slurm_role_vars,
    wait_for,
)
from gpupool.render import slurm
from gpupool.spec.model import Description
from gpupool.workload.replay import Demand, Run
from gpupool.workload.trace import TraceJob

POLICIES = ("gpupool", "baseline")
CHECKPOINT_INTERVAL_S = 0.1  # WORK below saves its progress every step
MIN_JOB_S = 5.0  # accounting has 1 s resolution
LEAD_S = 8.0  # submission finishes before the first job is eligible
CONF = "/etc/slurm/slurm.conf"
# The baseline's slurm.conf says what it is, so that going back to gpupool's policy
# happens only when the baseline is in force (and replays the slurm role, minutes, when a
# replay stopped halfway left it there).
BASELINE_MARK = "# gpupool replay: manual-allocation baseline (slurm.yml restores the policy)"
# The same for another description's policy in force (`replay --compare`).
COMPARE_MARK = "# gpupool replay --compare: another description's policy (slurm.yml restores)"
MARKS = (BASELINE_MARK, COMPARE_MARK)
# roles/slurm/templates/slurm.conf.j2's line above the policy gpupool renders.
POLICY_HEAD = "# Pool policy (gpupool slurm render)"
# What `replay --compare` drains the nodes the other description lacks for: no value of
# either description in it (it lands in a command line).
DRAIN_REASON = "gpupool replay --compare: node not in the compared description"
# Lines of slurm.conf the baseline replaces.
_POLICY_KEYS = re.compile(r"^(PartitionName|PreemptType|PreemptMode|SchedulerType|"
                          r"PriorityType|PriorityWeight\w*)=")

WORK = r"""#!/bin/bash
# Replay job's work: WORK_DS tenths of a second, counted by the clock (a busy host does not
# stretch it), resumable from its progress file, which it saves on SIGTERM and exits.
P={root}/.gpupool/replay/$SLURM_JOB_NAME.progress
done=$(cat "$P" 2>/dev/null || echo 0)
trap 'echo $done > "$P"; exit 143' TERM
last=$(date +%s%N)
while [ "$done" -lt "$WORK_DS" ]; do
  sleep 0.1
  now=$(date +%s%N); step=$(((now - last) / 100000000))
  done=$((done + step)); last=$((last + step * 100000000))
  echo $done > "$P"
done
"""


def job_script(root: str) -> str:
    """The replay job's batch script: WORK in a job step, as the job convention says, so a
    preemption requeues it at once (its GPUs are not held for GraceTime)."""
    return "#!/bin/bash\n" + convention_step(f"bash {root}/.gpupool/replay/work.sh")


def baseline_conf(desc: Any, current: str) -> str:
    """The running slurm.conf turned into the manual-allocation baseline."""
    owners: dict[str, list[str]] = {}
    for name, node in desc.nodes.items():
        if node.owner_team and name in onprem_nodes(desc):
            owners.setdefault(node.owner_team, []).append(name)
    if not owners:
        raise SlurmLabError("the baseline pins nodes to teams: set owner_team on the nodes")
    kept = [ln for ln in current.splitlines()
            if not _POLICY_KEYS.match(ln) and ln not in MARKS]
    return "\n".join([
        BASELINE_MARK,
        *kept,
        "SchedulerType=sched/builtin",
        "PriorityType=priority/basic",
        "PreemptType=preempt/none",
        *(f"PartitionName={team} Nodes={slurm.hostlist(nodes)} MaxTime=UNLIMITED State=UP"
          for team, nodes in sorted(owners.items())),
    ]) + "\n"


def _restart_all(s: SlurmLab) -> None:
    s.sh("systemctl restart slurmctld")
    for node in onprem_nodes(s.desc):
        s.sh("systemctl restart slurmd", node=node)
    wait_for("nodes idle after restart", lambda: all(
        s.node_states().get(n, "").rstrip("*") == "idle" for n in onprem_nodes(s.desc)), 90)


def _is_baseline(conf: str) -> bool:
    """The conf is not gpupool's own policy: the baseline's or another description's."""
    return bool(set(MARKS) & set(conf.splitlines()))


def gpupool_conf(s: SlurmLab) -> str | None:
    """The controller's slurm.conf when it holds gpupool's policy (what use_policy can put
    back after the baseline without replaying the role); None under the baseline."""
    current = s.sh(f"cat {CONF}")
    return None if _is_baseline(current) else current


def use_policy(s: SlurmLab, policy: str, saved: str | None = None) -> None:
    """Put the lab on a policy. gpupool's is the slurm role's own configuration: `saved`
    (gpupool_conf() read before the baseline) written back on every node, or without it the
    role played again (minutes), unless the baseline was never put in its place. The
    baseline is written over it on every node."""
    current = s.sh(f"cat {CONF}")
    if policy == "gpupool":
        if not _is_baseline(current):
            return
        if saved is not None and not _is_baseline(saved):
            # Byte for byte (the role's next run finds nothing to change); every node holds
            # the same file (the slurm role).
            for node in s.desc.nodes:
                s.write(CONF, saved, node=node, newline=False)
        else:
            proc = playbook(s.desc, "slurm.yml")  # the role restores its own configuration
            if proc.returncode != 0:
                raise SlurmLabError(f"slurm.yml failed: {proc.stdout[-3000:]}")
        _restart_all(s)
        return
    conf = baseline_conf(s.desc, current)
    for node in s.desc.nodes:
        s.write(CONF, conf, node=node)
    _restart_all(s)


def compared_nodes(lab: Description, other: Description) -> list[str]:
    """The lab's nodes `other` lacks, which its replay runs without (drained). `other` must
    fit the lab's hosts: nodes the lab has not, a controller or login node left out, or a
    node declared otherwise (another class, rack, roles or addresses, or its class's
    hardware changed) are refused: a replay compares policies on the hosts there are."""
    added = sorted(set(other.nodes) - set(lab.nodes))
    if added:
        raise SlurmLabError(f"the compared description has nodes the lab has not: "
                            f"{', '.join(added)[:200]}; it may only leave lab nodes out")
    compute = set(onprem_nodes(lab))
    missing = sorted(set(lab.nodes) - set(other.nodes))
    if kept := [n for n in missing if n not in compute]:
        raise SlurmLabError(f"the compared description leaves out {', '.join(kept)}, not "
                            "a compute node: only compute nodes can be drained for it")
    changed = sorted(n for n, node in other.nodes.items() if node != lab.nodes[n] or
                     other.node_classes.get(node.class_) != lab.node_classes.get(node.class_))
    if changed:
        raise SlurmLabError(f"the compared description declares {', '.join(changed)[:200]} "
                            "otherwise than the lab: compare policies on the same hosts")
    if not set(onprem_nodes(lab)) - set(missing):
        raise SlurmLabError("the compared description leaves no compute node of the lab")
    return missing


def policy_of(lab: Description, other: Description) -> Description:
    """The lab with another description's policy: its teams (quotas, borrowing, members)
    and task classes (partitions, QOS, priorities, preemption) on the lab's hosts."""
    return lab.model_copy(update={"teams": other.teams, "task_classes": other.task_classes})


def compare_conf(lab: Description, other: Description, saved: str) -> str:
    """slurm.conf with the slurm role's daemon settings (those of `saved`, gpupool's own
    policy in force) and the policy rendered from `other` on the lab's hosts."""
    head, sep, _ = saved.partition(f"\n{POLICY_HEAD}\n")
    if not sep:
        raise SlurmLabError(f"{CONF} has no line {POLICY_HEAD!r}: not the slurm role's")
    return "\n".join([COMPARE_MARK, *(ln for ln in head.splitlines() if ln not in MARKS),
                      POLICY_HEAD, *slurm.slurm_conf(policy_of(lab, other))]) + "\n"


SACCT_WAIT_S = 60  # slurmdbd busy after a restart; the limits need slurmctld's TRES


def sacct_apply(s: SlurmLab, plan: str, phases: tuple[str, ...] = ("base", "limits")) -> None:
    """Converge accounting to an accounting plan on the controller with the role's own
    converger (QOS, accounts, members, then team limits), each phase retried while
    slurmdbd or slurmctld is not answering yet (bounded)."""
    v = slurm_role_vars()
    for phase in phases:
        cmd = (f"{shlex.quote(v['slurm_python'])} "
               f"{shlex.quote(v['slurm_lib_dir'] + '/gpupool_sacct_apply.py')} "
               f"{shlex.quote(plan)} --phase {phase}")
        said: list[str] = []

        def applied(cmd: str = cmd, said: list[str] = said) -> bool:
            proc = s.sh(f"{cmd} 2>&1 && echo GPUPOOL_APPLIED", check=False)
            said[:] = [proc[-500:]]
            return "GPUPOOL_APPLIED" in proc

        try:
            wait_for(f"accounting {phase} applied", applied, SACCT_WAIT_S)
        except LabError as exc:
            raise SlurmLabError(f"{exc}: {said[0] if said else ''}") from exc


def role_accounting() -> str:
    """The accounting plan the slurm role applied (its accounting.json on the controller)."""
    return f"{slurm_role_vars()['slurm_lib_dir']}/accounting.json"


def use_other(s: SlurmLab, other: Description, saved: str, drain: list[str]) -> None:
    """Put the lab on another description's policy: its slurm.conf on every node, its
    accounts, QOS and team limits applied, and the lab nodes it lacks drained
    (DRAIN_REASON). restore_policy() undoes it."""
    lab = s.desc
    conf = compare_conf(lab, other, saved)
    # The role's plan's users kept whatever the description says (root, who submits).
    keep = json.loads(s.sh(f"cat {shlex.quote(role_accounting())}")).get("keep_users", [])
    plan = f"{slurm_role_vars()['slurm_lib_dir']}/compare-accounting.json"
    s.write(plan, json.dumps({**slurm.accounting(policy_of(lab, other)), "keep_users": keep}))
    sacct_apply(s, plan, ("base",))  # QOS of new classes exist before partitions name them
    for node in lab.nodes:
        s.write(CONF, conf, node=node)
    _restart_all(s)
    sacct_apply(s, plan, ("limits",))
    for node in drain:
        s.sh(f"scontrol update nodename={shlex.quote(node)} state=drain "
             f"reason={shlex.quote(DRAIN_REASON)}")


def team_limits(s: SlurmLab) -> dict[str, str]:
    """Each account's GrpTRES as accounting holds it now (the team quotas in force)."""
    out = s.sh(f"sacctmgr -n -P show assoc cluster={shlex.quote(s.desc.pool.name)} user= "
               "format=account,user,grptres")
    return {a: g for a, u, g in (ln.split("|", 2) for ln in out.splitlines()
                                 if ln.count("|") == 2) if not u}


def drained_by_compare(s: SlurmLab) -> list[str]:
    """Nodes drained with DRAIN_REASON (`sinfo -R`), whatever run left them."""
    out = s.sh("sinfo -h -R -N -o '%N|%E'")
    return sorted({n for n, _, r in (ln.partition("|") for ln in out.splitlines())
                   if r.strip() == DRAIN_REASON})


def restore_policy(s: SlurmLab, saved: str | None) -> None:
    """Back to the lab description's own policy after use_other: the nodes drained for it
    resumed, gpupool's slurm.conf back (use_policy) and the role's accounting plan applied
    again. Every step runs even when one before it failed; the first failure is raised."""
    errors: list[BaseException] = []
    for step in (lambda: [s.sh(f"scontrol update nodename={shlex.quote(n)} state=resume")
                          for n in drained_by_compare(s)],
                 lambda: use_policy(s, "gpupool", saved),
                 lambda: sacct_apply(s, role_accounting())):
        try:
            step()
        except Exception as exc:  # every step is tried; the first failure is raised
            errors.append(exc)
    if errors:
        raise errors[0]


def _submit_line(policy: str, job: TraceJob, begin: str, speedup: float, name: str) -> str:
    work_ds = max(int(MIN_JOB_S * 10), round(job.duration_s / speedup * 10))
    # Read and checked from a trace file (trace.read), quoted still: this runs as a shell
    # script on the controller.
    q = shlex.quote
    where = (f"-p {q(job.task_class)} --requeue" if policy == "gpupool"
             else f"-p {q(job.team)}")
    return (f"sbatch --parsable -J {q(name)} -A {q(job.team)} {where} "
            f"--gpus={int(job.gpus)} -C onprem --begin={q(begin)} -o /dev/null "
            f"--export=ALL,WORK_DS={work_ds} {{script}}")


def _ts(value: str) -> float | None:
    return None if value in ("", "Unknown", "None") else datetime.fromisoformat(value).timestamp()


# Job states after which accounting no longer changes a record (sacct(1) JOB STATE CODES).
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                          "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"})
FINAL_WAIT_S = 120  # slurmctld hands finished jobs to slurmdbd asynchronously


def parse_runs(sacct_out: str, prefix: str, jobs: dict[str, TraceJob]) -> list[Run]:
    """Runs of this replay's jobs (names `prefix` + trace job id) in `sacct -P` output of
    JobName,AllocTRES,Eligible,Start,End,State; other jobs are ignored."""
    runs = []
    for line in sacct_out.splitlines():
        name, tres, eligible, start, end, state = line.split("|")
        job = jobs.get(name.removeprefix(prefix)) if name.startswith(prefix) else None
        if job is None:
            continue
        gpus = re.search(r"gres/gpu=(\d+)", tres)
        runs.append(Run(job.job_id, job.task_class, job.team,
                        int(gpus.group(1)) if gpus else job.gpus,
                        _ts(eligible) or 0.0, _ts(start), _ts(end), state.split()[0]))
    return runs


# squeue's reasons that say nothing about the policy: not eligible yet (the trace's
# arrival time, sbatch --begin), or not looked at by the scheduler yet.
NOT_WAITING = frozenset({"BeginTime", "None"})


def queued(squeue_out: str, prefix: str) -> tuple[int, dict[str, str]]:
    """This replay's jobs in `squeue -h -o '%j|%T|%r'` output: how many are still queued or
    running, and what each pending one waits on (its reason, without the details some
    reasons carry: "ReqNodeNotAvail, UnavailableNodes:gpu[1-2]" counts as ReqNodeNotAvail),
    but for NOT_WAITING."""
    left, reasons = 0, {}
    for line in squeue_out.splitlines():
        name, state, reason = [*line.split("|", 2), "", ""][:3]
        if not name.startswith(prefix):
            continue
        left += 1
        reason = reason.split(",", 1)[0].strip()
        if state == "PENDING" and reason not in NOT_WAITING:
            reasons[name.removeprefix(prefix)] = reason
    return left, reasons


def unfinished(runs: list[Run], jobs: dict[str, TraceJob]) -> list[str]:
    """Jobs whose accounting is not final yet: no record at all, or a last record (sacct
    lists a job's records oldest first) that is not in a final state with its end time."""
    last = {r.job: r for r in runs}
    return sorted(j for j in jobs if j not in last or last[j].state not in FINAL_STATES
                  or last[j].end is None)


def collect(s: SlurmLab, since: str, prefix: str, jobs: dict[str, TraceJob]) -> list[Run]:
    """This replay's accounting, once it is final: queried by the replay's own job names
    (a run key in every name), and read again until every job's last record has ended, so
    nothing a later configuration change does to the controller can alter these figures."""
    names = ",".join(prefix + j for j in jobs)
    query = (f"sacct -a -X -D -P -n -S {since} --name={names} "
             "-o JobName,AllocTRES,Eligible,Start,End,State")
    runs: list[Run] = []

    def final() -> bool:
        runs[:] = parse_runs(s.sh(query), prefix, jobs)
        return not unfinished(runs, jobs)

    try:
        wait_for("replay accounting final", final, FINAL_WAIT_S)
    except LabError as exc:
        raise SlurmLabError(f"{exc}: not final: {', '.join(unfinished(runs, jobs)[:10])}"
                            ) from exc
    return runs


def check_trace(desc: Any, trace: list[TraceJob]) -> None:
    """Refuse a trace that names a team or a task class the pool does not have."""
    for j in trace:
        if j.team not in desc.teams or j.task_class not in desc.task_classes:
            raise SlurmLabError(f"trace job {j.job_id}: unknown team {j.team!r} or class "
                                f"{j.task_class!r}")


def gpu_limits(desc: Any, policy: str) -> dict[str, int]:
    """The most GPUs one job of each team can ever get on the on-prem nodes: all of them
    under gpupool's policy, the team's own nodes' under the baseline (manual allocation
    pins each team to the nodes it owns)."""
    onprem = [n for n in slurm.nodes(desc) if not n.cloud]
    if policy != "baseline":
        return dict.fromkeys(desc.teams, sum(n.gpus for n in onprem))
    owned = dict.fromkeys(desc.teams, 0)
    for n in onprem:
        team = desc.nodes[n.name].owner_team if n.name in desc.nodes else None
        if team in owned:
            owned[team] += n.gpus
    return owned


def runnable(desc: Any, policy: str, trace: list[TraceJob]
             ) -> tuple[list[TraceJob], list[TraceJob]]:
    """The trace split into the jobs the policy can run and those it never can (wider than
    the GPUs it may give the job's team): a job that would wait forever is not submitted,
    and counted as a figure of that policy."""
    limits = gpu_limits(desc, policy)
    return ([j for j in trace if j.gpus <= limits[j.team]],
            [j for j in trace if j.gpus > limits[j.team]])


def cancel_left(s: SlurmLab, prefix: str) -> list[str]:
    """Cancel this replay's jobs that are still queued or running (names `prefix` + trace
    job id); returns their job ids. A replay that timed out used to leave them, and every
    replay after it failed waiting for an idle pool."""
    ids = [job for job, _, name in (ln.partition(" ") for ln in
                                    s.sh("squeue -h -o '%i %j'").splitlines())
           if name.startswith(prefix)]
    if ids:
        s.sh(f"scancel {' '.join(shlex.quote(i) for i in ids)}")
    return ids


def offered(trace: list[TraceJob], speedup: float, t0: float = 0.0) -> list[Demand]:
    """The trace as the replay offers it to Slurm, in wall seconds from t0: each job
    eligible at its compressed arrival and running its compressed duration, but at least
    MIN_JOB_S."""
    return [Demand(j.job_id, j.task_class, j.gpus, t0 + j.submit_s / speedup,
                   max(MIN_JOB_S, j.duration_s / speedup)) for j in trace]


def run_key() -> str:
    """A key unique to one `gpupool replay` invocation, carried in every job name, so that
    accounting is read per run and never mixes two runs' jobs."""
    return f"r{time.time_ns() // 1_000_000:x}"


def replay_once(ctx: Context, policy: str, trace: list[TraceJob], *, speedup: float,
                timeout_s: float, report: Callable[[str], None], run: str,
                saved: str | None = None, label: str | None = None
                ) -> tuple[list[Run], list[Demand], dict[str, dict[str, int]]]:
    """Replay the trace under one policy (saved: as use_policy takes it). label: the run's
    name in job names and messages, given when the lab already holds the policy to replay
    (`replay --compare` put another description's there): the policy is left as it is.
    Returns the runs,
    the demands and what each job was seen pending for (job -> reason -> samples, one
    sample per poll while it waited). The figures returned are final before this returns:
    the next policy's restart of slurmctld cannot rewrite them."""
    s = ctx.slurm
    if not trace:  # nothing this policy can run: no figures to wait for
        return [], [], {}
    if label is None:
        use_policy(s, policy, saved)
    name = label or policy
    prefix = f"{run}-{name}-"
    s.sh(f"rm -rf {ctx.root}/.gpupool/replay && mkdir -p {ctx.root}/.gpupool/replay")
    s.write(f"{ctx.root}/.gpupool/replay/work.sh", WORK.format(root=ctx.root))
    s.write(f"{ctx.root}/.gpupool/replay/job.sh", job_script(ctx.root))
    t0 = float(s.sh("date +%s").strip()) + LEAD_S
    since = datetime.fromtimestamp(t0 - LEAD_S).strftime("%Y-%m-%dT%H:%M:%S")
    lines = []
    for j in trace:
        begin = datetime.fromtimestamp(t0 + j.submit_s / speedup).strftime("%Y-%m-%dT%H:%M:%S")
        lines.append(_submit_line(policy, j, begin, speedup, prefix + j.job_id).format(
            script=f"{ctx.root}/.gpupool/replay/job.sh"))
    s.write("/var/lib/gpupool/jobs/replay-submit.sh", "set -e\n" + "\n".join(lines))
    s.sh("bash /var/lib/gpupool/jobs/replay-submit.sh >/dev/null", timeout=300)
    report(f"{name}: {len(trace)} jobs submitted")
    waited_on: dict[str, Counter[str]] = defaultdict(Counter)

    def finished() -> bool:
        left, reasons = queued(s.sh("squeue -h -o '%j|%T|%r'"), prefix)
        for job, reason in reasons.items():
            waited_on[job][reason] += 1
        return left == 0

    try:
        wait_for(f"{name}: every job finished", finished, timeout_s)
    except BaseException:
        cancel_left(s, prefix)  # the next replay, or policy, starts on an idle pool
        raise
    jobs = {j.job_id: j for j in trace}
    runs = collect(s, since, prefix, jobs)
    demands = offered(trace, speedup, t0)
    report(f"{name}: done in {time.time() - t0:.0f}s")
    return runs, demands, {j: dict(c) for j, c in waited_on.items()}
