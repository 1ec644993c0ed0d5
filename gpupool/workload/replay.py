"""Policy replay metrics: what a replayed trace's accounting records say about a policy.

Pure functions over run records (one per run of a job: a requeued job has several), so
they are tested without Slurm. gpupool/exercise/replay_run.py produces the records on the lab.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from gpupool.workload.audit import percentile
from gpupool.workload.trace import fifo_starts


@dataclass(frozen=True)
class Run:
    """One run of one job, as accounting records it (times in seconds)."""

    job: str  # the trace's job id
    task_class: str
    team: str
    gpus: int
    eligible: float
    start: float | None
    end: float | None
    state: str  # COMPLETED, REQUEUED, PREEMPTED, FAILED, ...


@dataclass(frozen=True)
class Demand:
    """A trace job as offered: when it became eligible and how long it needs."""

    job: str
    task_class: str
    gpus: int
    eligible: float
    duration: float


def _segments(runs: list[Run]) -> list[tuple[float, float, int]]:
    return [(r.start, r.end, r.gpus) for r in runs
            if r.start is not None and r.end is not None and r.end > r.start]


def busy_gpus(runs: list[Run], t: float) -> int:
    return sum(g for s, e, g in _segments(runs) if s <= t < e)


def saturated_windows(runs: list[Run], demands: list[Demand], capacity: int,
                      step: float = 1.0) -> list[float]:
    """Sample times (every `step` s) at which offered work could fill the pool: the GPUs
    of jobs eligible and not yet finished reach the capacity."""
    finish: dict[str, float] = {}
    for r in runs:
        if r.state == "COMPLETED" and r.end is not None:
            finish[r.job] = r.end
    if not demands:
        return []
    t0 = min(d.eligible for d in demands)
    t1 = max(finish.values(), default=t0)
    out = []
    for i in range(math.ceil((t1 - t0) / step)):
        t = t0 + i * step
        wanted = sum(d.gpus for d in demands if d.eligible <= t < finish.get(d.job, math.inf))
        if wanted >= capacity:
            out.append(t)
    return out


ACCOUNTING_RESOLUTION_S = 1.0  # sacct's times are whole seconds: allowed once per run
# Accounting's end states of a job that did not finish its work.
FAILED_STATES = frozenset({"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "CANCELLED",
                           "BOOT_FAIL", "DEADLINE"})


def _quantiles(values: list[float], scale: float = 1.0) -> dict[str, Any]:
    return {"p50": round(percentile(values, 50) * scale, 2),
            "p95": round(percentile(values, 95) * scale, 2), "n": len(values)}


def waited_on_by_class(demands: list[Demand], waited_on: dict[str, dict[str, int]]
                       ) -> dict[str, dict[str, int]]:
    """Per class, how many of its jobs Slurm was seen holding back for each reason
    (squeue's: Resources, Priority, AssocGrpGRES...); a job counts once per reason."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for d in demands:
        for reason in waited_on.get(d.job, {}):
            out[d.task_class][reason] += 1
    return {c: dict(sorted(r.items(), key=lambda kv: (-kv[1], kv[0])))
            for c, r in sorted(out.items())}


def class_figures(demands: list[Demand], capacity: int, horizon_s: float
                  ) -> dict[str, dict[str, Any]]:
    """What each class asks of the pool, whatever the policy: its jobs, its offered load
    (its GPU-seconds over the pool's while the trace arrives, horizon_s) and its waits with
    the pool to itself (trace.fifo_starts), which no policy that also runs the other
    classes can beat for a class whose jobs are one GPU each."""
    by_class: dict[str, list[Demand]] = defaultdict(list)
    for d in demands:
        by_class[d.task_class].append(d)
    out = {}
    for cls, ds in sorted(by_class.items()):
        starts = fifo_starts([(d.eligible, d.duration, d.gpus) for d in ds], capacity)
        out[cls] = {
            "jobs": len(ds),
            "offered_load": round(sum(d.gpus * d.duration for d in ds)
                                  / max(1e-9, capacity * horizon_s), 3),
            "alone_wait_s": _quantiles([s - d.eligible for d, s in zip(ds, starts, strict=True)
                                        if s is not None]),
        }
    return out


def metrics(runs: list[Run], demands: list[Demand], capacity: int,
            speedup: float = 1.0, waited_on: dict[str, dict[str, int]] | None = None
            ) -> dict[str, Any]:
    """The policy's figures from its runs. speedup: how much faster than the trace the
    replay ran; trace-time figures are the wall-time ones times it. waited_on: what each
    job was seen pending for (replay_run.replay_once)."""
    by_job: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_job[r.job].append(r)
    waits: dict[str, list[float]] = defaultdict(list)
    team_waits: dict[str, list[float]] = defaultdict(list)
    for d in demands:
        started = [r.start for r in by_job.get(d.job, []) if r.start is not None]
        if started:
            wait = max(0.0, min(started) - d.eligible)
            waits[d.task_class].append(wait)
            team_waits[by_job[d.job][0].team].append(wait)
    sat = saturated_windows(runs, demands, capacity)
    util = (sum(busy_gpus(runs, t) for t in sat) / (capacity * len(sat))) if sat else None
    completed = {r.job for r in runs if r.state == "COMPLETED"}
    ran = {j: sum(e - s for s, e, _ in _segments(rs)) for j, rs in by_job.items()}
    need = {d.job: d.duration for d in demands}
    interruptions = sum(1 for r in runs if r.state in ("REQUEUED", "PREEMPTED"))
    # Work lost: GPU-seconds run beyond what each interrupted job needed (redone work).
    # A job that ran once redid nothing; accounting's 1 s resolution and each run's start
    # and stop overhead are allowed for (1 s per run).
    gpus = {d.job: d.gpus for d in demands}
    redone = {j: max(0.0, ran[j] - need[j] - ACCOUNTING_RESOLUTION_S * len(by_job[j]))
              for j in completed if j in need and len(by_job[j]) > 1}
    lost = sum(s * gpus[j] for j, s in redone.items())
    work = sum(d.duration * d.gpus for d in demands)
    failed = {j for j, rs in by_job.items() if j not in completed
              and max(rs, key=lambda r: r.end or 0.0).state in FAILED_STATES}
    starts = [r.start for r in runs if r.start is not None]
    ends = [r.end for r in runs if r.end is not None]
    t0 = min(d.eligible for d in demands) if demands else 0.0
    return {
        "jobs": len(demands),
        "completed": len(completed),
        "capacity_gpus": capacity,
        "saturated_s": len(sat),
        "gpu_utilization_saturated": round(util, 4) if util is not None else None,
        "wait_s": {c: _quantiles(w) for c, w in sorted(waits.items())},
        "wait_s_by_team": {t: _quantiles(w) for t, w in sorted(team_waits.items())},
        "wait_trace_s": {c: _quantiles(w, speedup) for c, w in sorted(waits.items())},
        "makespan_s": round(max(ends) - t0, 1) if ends else None,
        "makespan_trace_s": round((max(ends) - t0) * speedup, 1) if ends else None,
        "first_start_s": round(min(starts) - t0, 1) if starts else None,
        "preemptions_and_requeues": interruptions,
        "work_lost_gpu_s": round(lost, 1),
        "work_lost_share": round(lost / work, 4) if work else 0.0,
        # Job time redone per interruption (wall seconds): what one checkpoint interval bounds.
        "work_lost_per_preemption_s": (round(sum(redone.values()) / interruptions, 2)
                                       if interruptions else None),
        "failed_share": round(len(failed) / len(demands), 4) if demands else 0.0,
        "waited_on": waited_on_by_class(demands, waited_on or {}),
    }


TARGET_UTILIZATION = 0.9
SCHED_CYCLES = 2  # interactive p95 wait within this many scheduling cycles
# What squeue's pending reasons mean for a job of the top class (squeue(1), JOB REASON
# CODES); a reason not here is quoted as Slurm gives it.
REASONS = {
    "Resources": "no GPUs free that it may take (busy with work it does not preempt)",
    "Priority": "behind jobs of higher priority",
    "AssocGrpGRES": "its team at its GPU quota plus borrowing",
    "QOSGrpGRES": "its class at its QOS's GPU limit",
    "ReqNodeNotAvail": "the nodes it may use were down, drained or reserved",
}


def _waited_on(reasons: dict[str, int], cls: str) -> str:
    return f"{cls} jobs waited on: " + "; ".join(
        f"{REASONS.get(r, r)} ({r}, {n} job{'s' * (n != 1)})" for r, n in reasons.items())


def _top_class_targets(g: dict[str, Any], top_class: str, bound: float,
                       alone: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The top class's wait targets: within SCHED_CYCLES scheduling cycles, and within them
    of the least its own jobs make it wait (class_figures), which says what the policy, not
    the trace, costs it."""
    p95 = g["wait_s"].get(top_class, {}).get("p95")
    seen = g.get("waited_on", {}).get(top_class)
    reasons = f"; {_waited_on(seen, top_class)}" if seen else (
        ": a job that must preempt waits for its victim to save and requeue, then for the "
        "scheduling pass after it" if g["preemptions_and_requeues"] else
        ": no GPUs free and nothing preemptible under it")
    floor = alone["alone_wait_s"]["p95"] if alone else None
    crowded = (f"; the {top_class} jobs alone ask for {alone['offered_load']:g}x the pool's "
               f"GPUs while the trace arrives: with the pool to themselves their p95 wait "
               f"would be {floor:g} s" if floor is not None and floor > bound else "")
    out = [{"target": f"{top_class} p95 wait within {SCHED_CYCLES} scheduling cycles "
                      f"({bound:g} s)",
            "value": p95, "met": None if p95 is None else p95 <= bound,
            "why": (f"no {top_class} job in the trace" if p95 is None else
                    f"p95 {p95} s{crowded}{reasons}")}]
    if floor is not None and p95 is not None:
        out.append({"target": f"{top_class} p95 wait within {SCHED_CYCLES} scheduling cycles "
                              f"of its wait with the pool to itself ({floor:g} + {bound:g} s)",
                    "value": [p95, floor], "met": p95 <= floor + bound,
                    "why": f"p95 {p95} s, {round(p95 - floor, 2):g} s more{reasons}"})
    return out


def targets(policies: dict[str, dict[str, Any]], top_class: str, sched_interval_s: float,
            checkpoint_interval_s: float, classes: dict[str, dict[str, Any]] | None = None
            ) -> list[dict[str, Any]]:
    """The seeds' promise as checks on one run's figures, each with its value, whether it
    was met (None: the run gives no evidence either way) and, when not, why from the data.
    classes: what the trace asks of the pool per class (class_figures)."""
    g, base = policies.get("gpupool"), policies.get("baseline")
    if g is None:
        return []
    out = []
    util = g["gpu_utilization_saturated"]
    idle = (round((1 - util) * g["capacity_gpus"] * g["saturated_s"], 1)
            if util is not None else None)
    out.append({"target": f"GPU utilization while saturated at least {TARGET_UTILIZATION:.0%}",
                "value": util, "met": None if util is None else util >= TARGET_UTILIZATION,
                "why": ("demand never reached the pool's capacity: no saturated second"
                        if util is None else
                        f"{idle} GPU-s idle in {g['saturated_s']} saturated seconds: waiting "
                        "work did not fit the free GPUs (whole-node jobs, quotas) or waited "
                        "for a scheduling cycle or a preempted job's grace time")})
    if base is not None:
        b = base["gpu_utilization_saturated"]
        out.append({"target": "utilization while saturated ahead of manual allocation",
                    "value": [util, b],
                    "met": None if util is None or b is None else util > b,
                    "why": ("the baseline never saturated" if b is None else
                            f"baseline {b} against {util}: its teams' own nodes were busy "
                            "as well")})
    out += _top_class_targets(g, top_class, SCHED_CYCLES * sched_interval_s,
                              (classes or {}).get(top_class))
    per = g["work_lost_per_preemption_s"]
    allowed = checkpoint_interval_s + ACCOUNTING_RESOLUTION_S
    out.append({"target": f"work lost per preemption at most one checkpoint interval "
                          f"({checkpoint_interval_s:g} s, +{ACCOUNTING_RESOLUTION_S:g} s "
                          "accounting resolution)",
                "value": per, "met": None if per is None else per <= allowed,
                "why": ("no preemption in this run" if per is None else
                        f"{per} s redone per preemption: the job lost more than its last "
                        "checkpoint (it was killed before it could save)")})
    for t in out:
        if t["met"]:
            t["why"] = ""
    return out


def utilization_series(runs: list[Run], capacity: int, t0: float, t1: float,
                       step: float = 1.0) -> list[tuple[float, float]]:
    return [(t - t0, busy_gpus(runs, t) / capacity)
            for t in (t0 + i * step for i in range(math.ceil((t1 - t0) / step)))]
