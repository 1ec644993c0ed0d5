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


def metrics(runs: list[Run], demands: list[Demand], capacity: int) -> dict[str, Any]:
    by_job: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_job[r.job].append(r)
    waits: dict[str, list[float]] = defaultdict(list)
    for d in demands:
        started = [r.start for r in by_job.get(d.job, []) if r.start is not None]
        if started:
            waits[d.task_class].append(max(0.0, min(started) - d.eligible))
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
    lost = sum(max(0.0, ran[j] - need[j] - len(by_job[j])) * gpus[j]
               for j in completed if j in need and len(by_job[j]) > 1)
    starts = [r.start for r in runs if r.start is not None]
    ends = [r.end for r in runs if r.end is not None]
    t0 = min(d.eligible for d in demands) if demands else 0.0
    return {
        "jobs": len(demands),
        "completed": len(completed),
        "capacity_gpus": capacity,
        "saturated_s": len(sat),
        "gpu_utilization_saturated": round(util, 4) if util is not None else None,
        "wait_s": {c: {"p50": round(percentile(w, 50), 2), "p95": round(percentile(w, 95), 2),
                       "n": len(w)} for c, w in sorted(waits.items())},
        "makespan_s": round(max(ends) - t0, 1) if ends else None,
        "first_start_s": round(min(starts) - t0, 1) if starts else None,
        "preemptions_and_requeues": interruptions,
        "work_lost_gpu_s": round(lost, 1),
    }


def utilization_series(runs: list[Run], capacity: int, t0: float, t1: float,
                       step: float = 1.0) -> list[tuple[float, float]]:
    return [(t - t0, busy_gpus(runs, t) / capacity)
            for t in (t0 + i * step for i in range(math.ceil((t1 - t0) / step)))]
