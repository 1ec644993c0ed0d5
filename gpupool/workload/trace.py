"""Job traces for policy replay: the format, a synthetic generator, and the Alibaba sampler.

Trace format (CSV with this header, one job per row, times in seconds):

    job_id,team,class,gpus,submit_s,duration_s

- `submit_s` is the offset from the start of the trace; `duration_s` the run time the job
  needs on its GPUs (it runs that long once started, resuming after preemption).
- `team` must be a team of the pool description and `class` one of its task classes;
  `gpus` is a whole number of GPUs (a job wider than one node spans nodes).

Replays compress time: each trace second lasts 1/speedup wall seconds.
"""

from __future__ import annotations

import csv
import heapq
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpupool.workload.audit import (
    ALIBABA_CLASS,
    MAX_JOB_GPUS,
    UNMAPPED_CLASS,
    Pod,
    TraceError,
    alibaba_pods,
    at_line,
    csv_rows,
)

MIN_SAMPLED_S = 5.0  # a sampled job runs at least this long (accounting has 1 s resolution)


@dataclass(frozen=True)
class TraceJob:
    job_id: str
    team: str
    task_class: str
    gpus: int
    submit_s: float
    duration_s: float


HEADER = ["job_id", "team", "class", "gpus", "submit_s", "duration_s"]


def write(jobs: list[TraceJob], path: Path) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(HEADER)
        for j in jobs:
            w.writerow([j.job_id, j.team, j.task_class, j.gpus, f"{j.submit_s:.3f}",
                        f"{j.duration_s:.3f}"])


# A job id becomes part of a Slurm job name on the lab's controller: plain characters only.
JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_TRACE_S = 366 * 24 * 3600.0  # a year: no trace replays longer


def read(path: Path) -> list[TraceJob]:
    """The jobs of a trace CSV, each value checked: an id of plain characters, used once, a
    whole number of GPUs from 1 (MAX_JOB_GPUS at most), a submission time and a duration
    that are finite, the first from 0 and the second above 0 (a year at most each). A trace
    without jobs is refused: a replay of nothing would still take the lab."""
    jobs: list[TraceJob] = []
    first: dict[str, int] = {}  # job id -> the line it is on
    for n, r in enumerate(csv_rows(path, HEADER), start=2):
        with at_line(path, n):
            if not re.fullmatch(r"[0-9]{1,6}", r["gpus"]):
                raise ValueError(f"gpus {r['gpus'][:40]!r} must be a whole number of GPUs")
            job = TraceJob(r["job_id"], r["team"], r["class"], int(r["gpus"]),
                           float(r["submit_s"]), float(r["duration_s"]))
            if not JOB_ID_RE.fullmatch(job.job_id):
                raise ValueError(f"job_id {job.job_id[:40]!r} must be letters, digits, "
                                 "'.', '_' and '-' (64 at most)")
            if job.job_id in first:
                raise ValueError(f"job_id {job.job_id!r} is already the job on line "
                                 f"{first[job.job_id]}: each job has its own id")
            if not 1 <= job.gpus <= MAX_JOB_GPUS:
                raise ValueError(f"gpus {job.gpus} must be from 1 to {MAX_JOB_GPUS}")
            if not (0 <= job.submit_s <= MAX_TRACE_S and 0 < job.duration_s <= MAX_TRACE_S):
                raise ValueError(f"submit_s {job.submit_s} and duration_s {job.duration_s} "
                                 "must be seconds from 0 (above 0 for a duration), a year "
                                 "at most")
            first[job.job_id] = n
            jobs.append(job)
    if not jobs:
        raise TraceError(f"{path}: no jobs (a header and no rows)")
    return jobs


@dataclass(frozen=True)
class ClassShape:
    """How one task class's jobs look: share of jobs, GPU sizes, log-normal durations."""

    share: float
    gpu_sizes: tuple[int, ...]  # drawn uniformly
    median_s: float
    sigma: float = 0.5


@dataclass(frozen=True)
class Knobs:
    """Synthetic trace knobs.

    load: offered GPU-seconds over (capacity x horizon); above 1 the pool is saturated.
    """

    jobs: int = 120
    horizon_s: float = 600.0
    load: float = 1.5
    capacity_gpus: int = 12
    teams: dict[str, float] = field(default_factory=lambda: {"vision": 1.0, "nlp": 1.0})
    classes: dict[str, ClassShape] = field(default_factory=lambda: {
        "interactive": ClassShape(0.3, (1,), 20.0, 0.3),
        "training": ClassShape(0.3, (2, 4), 90.0, 0.4),
        "deferred": ClassShape(0.4, (1, 2), 60.0, 0.5),
    })
    seed: int = 1


def synthetic(k: Knobs) -> list[TraceJob]:
    rng = random.Random(k.seed)  # noqa: S311 - reproducible synthetic workload
    names = list(k.classes)
    weights = [k.classes[c].share for c in names]
    teams, team_w = list(k.teams), list(k.teams.values())
    drafts = []
    for _ in range(k.jobs):
        cls = rng.choices(names, weights)[0]
        shape = k.classes[cls]
        duration = shape.median_s * math.exp(rng.gauss(0, shape.sigma))
        drafts.append((rng.choices(teams, team_w)[0], cls, rng.choice(shape.gpu_sizes),
                       duration))
    # Scale durations so the offered load matches the knob exactly.
    offered = sum(g * d for _, _, g, d in drafts)
    scale = k.load * k.capacity_gpus * k.horizon_s / offered
    arrivals = sorted(rng.uniform(0, k.horizon_s) for _ in drafts)
    return [TraceJob(f"s{i:04d}", team, cls, gpus, round(t, 3), round(d * scale, 3))
            for i, ((team, cls, gpus, d), t) in enumerate(zip(drafts, arrivals, strict=True))]


PREEMPTIBLE_FIRST_SHARE = 0.25  # of the horizon: the most the preemptible jobs arrive over
PREEMPTIBLE_FIRST_TRIES = 8  # halvings of that window tried until the pool is full at its end


def fifo_starts(jobs: list[tuple[float, float, int]], capacity: int) -> list[float | None]:
    """When each job (arrival, duration, GPUs) starts on `capacity` GPUs with nothing else
    running: first come first served (arrival order, ties as given), each as soon as its
    GPUs are free and never before the job ahead of it. A job wider than the pool never
    starts (None)."""
    starts: list[float | None] = [None] * len(jobs)
    running: list[tuple[float, int]] = []  # (end, GPUs), a heap
    free, last = capacity, -math.inf
    for i in sorted(range(len(jobs)), key=lambda i: jobs[i][0]):
        arrival, duration, gpus = jobs[i]
        if gpus > capacity:
            continue
        t = max(arrival, last)
        while running and (free < gpus or running[0][0] <= t):
            end, held = heapq.heappop(running)
            t, free = max(t, end), free + held
        starts[i] = last = t
        free -= gpus
        heapq.heappush(running, (t + duration, gpus))
    return starts


def _spread(group: list[TraceJob], a: float, b: float) -> list[TraceJob]:
    """The group re-timed to arrive over [a, b], keeping its order and relative spacing."""
    if not group:
        return []
    s0, s1 = min(j.submit_s for j in group), max(j.submit_s for j in group)
    span = s1 - s0
    return [replace(j, submit_s=round(a + ((j.submit_s - s0) / span if span else 0.0)
                                      * (b - a), 3)) for j in group]


def preemptible_first(jobs: list[TraceJob], preemptible: set[str], horizon_s: float,
                      capacity_gpus: int, share: float = PREEMPTIBLE_FIRST_SHARE
                      ) -> list[TraceJob]:
    """The same jobs (same sizes and durations, so the same offered load), re-timed so that
    those of the preemptible classes arrive first and the others after, each group keeping
    its own order and relative spacing: idle GPUs fill with work that later work has to
    take back, the case preemption is for.

    The preemptible jobs arrive over the first `share` of the horizon, or over half of it,
    and so on, whichever is the longest window at whose end they alone still fill the pool
    (fifo_starts): short preemptible jobs spread over a long window would end before the
    others arrive, and nothing would be taken back. Where none does, the longest."""
    first = [j for j in jobs if j.task_class in preemptible]
    rest = [j for j in jobs if j.task_class not in preemptible]
    cut = horizon_s * share
    for _ in range(PREEMPTIBLE_FIRST_TRIES):
        timed = [(j.submit_s, j.duration_s, j.gpus) for j in _spread(first, 0.0, cut)]
        starts = fifo_starts(timed, capacity_gpus)
        if sum(g for (_, d, g), t in zip(timed, starts, strict=True)
               if t is not None and t <= cut < t + d) >= capacity_gpus:
            break
        cut /= 2
    else:
        cut = horizon_s * share
    return sorted(_spread(first, 0.0, cut) + _spread(rest, cut, horizon_s),
                  key=lambda j: (j.submit_s, j.job_id))


def offered_load(jobs: list[TraceJob], capacity_gpus: int, horizon_s: float) -> float:
    """GPU-seconds asked for over GPU-seconds the pool has while the jobs arrive."""
    return sum(j.gpus * j.duration_s for j in jobs) / max(1e-9, capacity_gpus * horizon_s)


def sample_alibaba(path: Path, teams: list[str], *, jobs: int, horizon_s: float, max_gpus: int,
                   seed: int = 1, load: float | None = None, capacity_gpus: int = 0
                   ) -> list[TraceJob]:
    """A contiguous window of the Alibaba trace, mapped onto the pool and compressed.

    Consecutive pods keep the trace's arrival pattern; fractional-GPU pods round up to one
    GPU; teams are assigned round-robin (the trace has none). Without `load`, durations and
    arrivals are scaled together so the window spans `horizon_s`. With it, arrivals still
    span `horizon_s` but durations get their own factor (keeping their proportions), chosen
    so the offered load on `capacity_gpus` is `load`: a window dense enough to saturate
    the pool whatever the trace's own pace.
    """
    rows = [(p, d) for p in alibaba_pods(path) if (d := _ran_for(p)) is not None]
    if not rows:
        raise TraceError(f"{path}: no GPU pod that was scheduled and ended")
    rng = random.Random(seed)  # noqa: S311 - reproducible sampling
    start = rng.randrange(0, max(1, len(rows) - jobs))
    window = sorted(rows[start:start + jobs], key=lambda pd: pd[0].created)
    t0 = window[0][0].created
    span = max(1.0, window[-1][0].created - t0)
    scale = horizon_s / span
    # A share of a GPU takes a whole one.
    gpus = [min(max_gpus, max(1, math.ceil(p.gpus))) for p, _ in window]
    runs = [d for _, d in window]

    def length(d: float, stretch: float) -> float:
        return min(max(d * stretch, MIN_SAMPLED_S), horizon_s)

    stretch = scale
    if load is not None:
        if capacity_gpus <= 0:
            raise TraceError("a target load needs the pool's GPU capacity")
        stretch = _stretch_for(load * capacity_gpus * horizon_s,
                               lambda s: sum(g * length(d, s) for g, d in zip(gpus, runs,
                                                                              strict=True)))
    return [TraceJob(f"a{i:04d}", teams[i % len(teams)],
                     ALIBABA_CLASS.get(p.qos, UNMAPPED_CLASS), g,
                     round((p.created - t0) * scale, 3), round(length(d, stretch), 3))
            for i, ((p, d), g) in enumerate(zip(window, gpus, strict=True))]


def _ran_for(pod: Pod) -> float | None:
    """How long a GPU pod ran, or None: no GPU, never scheduled, or not ended."""
    if pod.gpus <= 0 or pod.scheduled is None or pod.deleted is None \
            or pod.deleted < pod.scheduled:
        return None
    return pod.deleted - pod.scheduled


def _stretch_for(target: float, work: Callable[[float], float]) -> float:
    """The duration factor whose (clamped) work is target: work grows with the factor, so
    bisect on its logarithm, a bounded number of times. The largest factor tried when even
    it falls short (every job already as long as the horizon)."""
    lo, hi = -30.0, 30.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if work(math.exp(mid)) < target:
            lo = mid
        else:
            hi = mid
    return math.exp(hi)

