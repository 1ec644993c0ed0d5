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
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from gpupool.workload.audit import ALIBABA_CLASS, ALIBABA_COLUMNS, TraceError, at_line, csv_rows


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


def read(path: Path) -> list[TraceJob]:
    jobs = []
    for n, r in enumerate(csv_rows(path, HEADER), start=2):
        with at_line(path, n):
            jobs.append(TraceJob(r["job_id"], r["team"], r["class"], int(r["gpus"]),
                                 float(r["submit_s"]), float(r["duration_s"])))
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


def sample_alibaba(path: Path, teams: list[str], *, jobs: int, horizon_s: float, max_gpus: int,
                   seed: int = 1) -> list[TraceJob]:
    """A contiguous window of the Alibaba trace, mapped onto the pool and compressed.

    Consecutive pods keep the trace's arrival pattern; fractional-GPU pods round up to one
    GPU; teams are assigned round-robin (the trace has none); durations and arrivals are
    scaled together so the window spans `horizon_s`.
    """
    rows = []
    for n, r in enumerate(csv_rows(path, ALIBABA_COLUMNS), start=2):
        with at_line(path, n):
            if r["scheduled_time"] and r["deletion_time"] and int(r["gpu_milli"]) > 0:
                rows.append(r)
    if not rows:
        raise TraceError(f"{path}: no GPU pod that was scheduled and ended")
    rng = random.Random(seed)  # noqa: S311 - reproducible sampling
    start = rng.randrange(0, max(1, len(rows) - jobs))
    window = sorted(rows[start:start + jobs], key=lambda r: float(r["creation_time"]))
    t0 = float(window[0]["creation_time"])
    span = max(1.0, float(window[-1]["creation_time"]) - t0)
    scale = horizon_s / span
    out = []
    for i, r in enumerate(window):
        duration = (float(r["deletion_time"]) - float(r["scheduled_time"])) * scale
        out.append(TraceJob(
            f"a{i:04d}", teams[i % len(teams)], ALIBABA_CLASS.get(r["qos"], "training"),
            min(max_gpus, max(1, int(r["num_gpu"]))),
            round((float(r["creation_time"]) - t0) * scale, 3),
            round(min(max(duration, 5.0), horizon_s), 3)))
    return out

