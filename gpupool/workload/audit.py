"""Workload audit: what a pool's jobs look like, how many GPUs they need, and whether the
pool's GPUs of each model were enough.

Reads job history (Slurm `sacct` output, or the Alibaba GPU trace format) into one job
record shape, then reports durations, GPUs per job, parallel experiments per team and
class, the GPU count that keeps a wait-time target, the quotas that would follow, and
demand against capacity per GPU model.

Capacity per model: a job counts against the model its GPUs were (sacct's AllocTRES
`gres/gpu:h100=8`), so 40 idle L40S never hide an H100 shortage. Each model's row gives
the peak and time-weighted p95 of the GPUs in use at once, the model's capacity (every
capacity type together: on-prem, and burst at its most), and how long, what share of the
history's span and in how many episodes demand was over it. Jobs that name no model
(a plain `gres/gpu=2`, the Alibaba trace, or an allocation across several models, which
only a request for any GPU gets) have a row of their own, model None: any model of the
pool could serve them (`served_by`), so their capacity is the whole pool, and they share
it with every other job: that row is over capacity while every job's GPUs together are
over the whole pool.

Rows that are not counted are counted by reason (DROP_REASONS; the first that applies,
in its order), never skipped in silence and never a crash: a row of history from a
long-running pool may be half-written, cut, or from an account since removed. A value no
row of `sacct` holds is such a row (`unparsable`), with the first few named by line. The
Alibaba trace is a published data set, not a pool's history: a value it never holds is
a wrong file and stops the read at its line (TraceError), as for the replay's sampler
that shares its reader. This module knows nothing of the description: the caller gives
the teams, models and capacity to check against.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import heapq
import itertools
import math
import re
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

# The sacct invocation the audit reads (document it in the runbooks, never improvise it):
SACCT_FORMAT = "JobID,Account,Partition,AllocTRES,Submit,Start,End,State"
SACCT_COMMAND = f"sacct -a -X -P -n -S now-30days --format={SACCT_FORMAT}"
# Alibaba's QoS classes mapped onto gpupool's task classes, and why: the audit reports the
# mapping it used (and `gpupool audit --class-map QOS=CLASS` changes it).
ALIBABA_CLASS = {"LS": "interactive", "Guaranteed": "training", "Burstable": "training",
                 "BE": "deferred"}
ALIBABA_CLASS_WHY = {
    "LS": "latency-sensitive pods: long-running services in this trace, not notebooks; "
          "mapped to the top class for their priority (never preempted). Remap with "
          "--class-map LS=training to size them as steady work",
    "Guaranteed": "guaranteed resources, run to completion, not preempted",
    "Burstable": "may use more than requested, run to completion, not preempted",
    "BE": "best effort: runs on idle GPUs and may be preempted",
}
# A GPU entry of AllocTRES: gres/gpu=N, or gres/gpu:TYPE=N (TYPE a model or MIG profile).
# The count is taken as written and checked after, so `gres/gpu=abc` is unparsable, not
# a CPU-only job.
_GPU_TRES = re.compile(r"gres/gpu(?::([^=,]+))?=([^,]*)")


@dataclass(frozen=True)
class Job:
    id: str
    team: str
    task_class: str
    gpus: float  # fractional for GPU-sharing tasks
    submit: float  # seconds
    start: float
    end: float
    gpu_model: str = ""  # the model its GPUs were; "" where the history names none

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def wait(self) -> float:
        return self.start - self.submit


class TraceError(ValueError):
    """A job-history file that cannot be read as what it claims to be; the message names
    the file and, where there is one, the line."""


ALIBABA_COLUMNS = ("name", "num_gpu", "gpu_milli", "qos", "creation_time", "deletion_time",
                   "scheduled_time")


# Past these a value is a mistake in the file, not a job: GPUs on one job, and seconds
# from the trace's (or the epoch's) start.
MAX_JOB_GPUS = 100_000
MAX_TRACE_SECONDS = 1e11


@contextlib.contextmanager
def at_line(path: Path, line: int) -> Iterator[None]:
    """Turn a bad value on one line into a TraceError naming the file and line."""
    try:
        yield
    except (ValueError, KeyError, TypeError, IndexError, ArithmeticError) as exc:
        raise TraceError(f"{path}:{line}: {type(exc).__name__}: {exc}") from None


def csv_rows(path: Path, columns: Iterable[str]) -> list[dict[str, str]]:
    """The rows of a CSV file whose header holds at least these columns."""
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in columns if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(f"{path}: missing column(s) {', '.join(missing)} in the "
                                 f"header (expected {','.join(columns)})")
            rows = []
            for row in reader:
                # DictReader fills a short row's missing fields with None: say so, rather
                # than let a caller fail on None.
                if None in row.values():
                    raise TraceError(f"{path}:{reader.line_num}: the row has fewer fields "
                                     f"than the header's {len(reader.fieldnames or [])}")
                rows.append(row)
            return rows
    except csv.Error as exc:
        raise TraceError(f"{path}: not a CSV file: {exc}") from None


@dataclass(frozen=True)
class Pod:
    """One row of an Alibaba openb_pod_list_*.csv, its values checked."""
    name: str
    qos: str
    gpus: float  # whole GPUs, or a share of one (gpu_milli / 1000); 0 for a CPU pod
    created: float
    scheduled: float | None  # None: never scheduled
    deleted: float | None  # None: still running when the trace ends


def _gpu_count(value: str, what: str, most: int) -> int:
    count = int(value)
    if not 0 <= count <= most:
        raise ValueError(f"{what} {count} must be from 0 to {most}")
    return count


def _trace_seconds(value: str, what: str) -> float | None:
    if not value:
        return None
    t = float(value)
    if not 0 <= t <= MAX_TRACE_SECONDS:  # also refuses nan and inf
        raise ValueError(f"{what} {value[:40]!r} must be a finite number of seconds from 0, "
                         f"{MAX_TRACE_SECONDS:g} at most")
    return t


def alibaba_pods(path: Path) -> list[Pod]:
    """The pods of an openb_pod_list_*.csv; a value that is not what the trace's columns
    hold stops the read at its line."""
    pods = []
    for n, r in enumerate(csv_rows(path, ALIBABA_COLUMNS), start=2):
        with at_line(path, n):
            num = _gpu_count(r["num_gpu"], "num_gpu", MAX_JOB_GPUS)
            milli = _gpu_count(r["gpu_milli"], "gpu_milli", 1000)
            created = _trace_seconds(r["creation_time"], "creation_time")
            if created is None:
                raise ValueError("creation_time is empty")
            pods.append(Pod(r["name"], r["qos"], num if num > 1 else milli / 1000, created,
                            _trace_seconds(r["scheduled_time"], "scheduled_time"),
                            _trace_seconds(r["deletion_time"], "deletion_time")))
    return pods


# Why a row of history is not one of the audit's jobs. The order is the precedence: a row
# is dropped for the first reason that applies.
DROP_REASONS: dict[str, str] = {
    "unparsable": "not a row the history's format holds (field count, a time or a GPU "
                  "count that is no number or past any job's)",
    "no_gpu": "no GPU (CPU-only, or 0 GPUs)",
    "pending": "never started (pending, or cancelled before it started)",
    "running": "still running: no end yet",
    "unknown_team": "its account is no team of the description",
    "unknown_gpu_model": "its GPU type is no model of the pool (a MIG profile is a "
                         "slice of a GPU, not a GPU)",
    "no_run_time": "ended at or before it started (clock skew)",
}
UNPARSABLE_EXAMPLES = 5  # lines named in the report: enough to find the rest


@dataclass
class History:
    """The jobs a history file holds, and the rows dropped: counts by reason
    (DROP_REASONS), the unknown team and model names by rows, the first unparsable
    lines."""
    jobs: list[Job] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
    dropped_names: dict[str, Counter[str]] = field(default_factory=dict)
    unparsable_examples: list[str] = field(default_factory=list)

    def drop(self, reason: str, name: str = "") -> None:
        self.dropped[reason] += 1
        if name:
            self.dropped_names.setdefault(reason, Counter())[name] += 1

    def unparsable(self, where: str) -> None:
        self.drop("unparsable")
        if len(self.unparsable_examples) < UNPARSABLE_EXAMPLES:
            self.unparsable_examples.append(where)

    def keep(self, job: Job) -> None:
        """Add the job, or count it dropped where it used no GPU or no time. A
        submission recorded after the start (a requeued job's) waited nothing; a time or
        GPU count that is not a finite number is a mistake in the file, not a job."""
        if not all(math.isfinite(v) for v in (job.gpus, job.submit, job.start, job.end)):
            raise ValueError("times and GPU counts must be finite numbers")
        if job.gpus <= 0:
            self.drop("no_gpu")
        elif job.end <= job.start:
            self.drop("no_run_time")
        else:
            self.jobs.append(dataclasses.replace(job, submit=min(job.submit, job.start)))

    def summary(self) -> dict[str, Any]:
        """The report's keys for the rows dropped (every reason, 0 included)."""
        return {
            "dropped": {r: self.dropped[r] for r in DROP_REASONS},
            "dropped_total": sum(self.dropped.values()),
            "drop_reasons": dict(DROP_REASONS),
            "dropped_names": {r: dict(sorted(n.items()))
                              for r, n in sorted(self.dropped_names.items())},
            "unparsable_examples": list(self.unparsable_examples),
        }


def _ts(value: str) -> float | None:
    if value in ("", "Unknown", "None"):
        return None
    return datetime.fromisoformat(value).timestamp()


def _gpu_type(typed: dict[str, int], models: Collection[str] | None) -> tuple[str, str]:
    """(model, unknown type) of a row's typed GPU entries: one model, or "" for none or
    several (an allocation across models, which only a request for any GPU gets)."""
    unknown = sorted(t for t in typed if models is not None and t not in models)
    if unknown:
        return "", unknown[0]
    return (next(iter(typed)) if len(typed) == 1 else ""), ""


def read_sacct(path: Path, teams: Collection[str] | None = None,
               models: Collection[str] | None = None) -> History:
    """Lines of `SACCT_COMMAND` output ('|'-separated, no header). teams and models: the
    accounts and GPU types to count (None: any); a row of another is dropped by name."""
    history = History()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != 8:
            history.unparsable(f"{path}:{n}: {len(fields)} '|'-separated fields, expected "
                               f"8 (the output of: {SACCT_COMMAND})")
            continue
        job_id, account, partition, tres, submit, start, end, _state = fields
        try:
            with at_line(path, n):
                typed: dict[str, int] = {}
                gpus = 0
                for gpu_type, count in _GPU_TRES.findall(tres):
                    value = _gpu_count(count, "gres/gpu", MAX_JOB_GPUS)
                    if gpu_type:
                        typed[gpu_type] = value
                    gpus = max(gpus, value)
                gpus = max(gpus, sum(typed.values()))
                if gpus > MAX_JOB_GPUS:  # each type's count is in bounds, their sum not
                    raise ValueError(f"gres/gpu {gpus} must be from 0 to {MAX_JOB_GPUS}")
                s, b, e = _ts(submit), _ts(start), _ts(end)
        except TraceError as exc:
            history.unparsable(str(exc))
            continue
        model, unknown = _gpu_type(typed, models)
        if not gpus:
            history.drop("no_gpu")
        elif s is None or b is None:
            history.drop("pending")
        elif e is None:
            history.drop("running")
        elif teams is not None and account not in teams:
            history.drop("unknown_team", account)
        elif unknown:
            history.drop("unknown_gpu_model", unknown)
        else:
            history.keep(Job(job_id, account, partition, float(gpus), s, b, e, model))
    return history


UNMAPPED_CLASS = "training"  # a QoS class the map does not name
UNMAPPED_WHY = ("not in the class map: counted as training, steady work "
                "(--class-map QOS=CLASS to say otherwise)")


def read_alibaba(path: Path, trace_end: float | None = None,
                 classes: dict[str, str] | None = None,
                 unmapped: set[str] | None = None) -> History:
    """openb_pod_list_*.csv: GPU pods; those still running end at the trace's end (a
    trace is a window cut from a running cluster, and its pods carry no account, so none
    is dropped as running or of an unknown team). classes:
    QoS class -> task class (default ALIBABA_CLASS); a QoS class it does not name counts as
    UNMAPPED_CLASS and is added to `unmapped`, so the report can say so."""
    classes = ALIBABA_CLASS if classes is None else classes
    pods = alibaba_pods(path)
    end_of_trace = trace_end or max((p.deleted or 0.0 for p in pods), default=0.0)
    history = History()
    for p in pods:
        if not p.gpus:
            history.drop("no_gpu")
        elif p.scheduled is None:
            history.drop("pending")
        else:
            if p.qos not in classes and unmapped is not None:
                unmapped.add(p.qos)
            history.keep(Job(p.name, "trace", classes.get(p.qos, UNMAPPED_CLASS), p.gpus,
                             p.created, p.scheduled,
                             end_of_trace if p.deleted is None else p.deleted))
    return history


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[idx]


def concurrency(jobs: Iterable[Job], weight: str = "gpus") -> list[tuple[float, float]]:
    """Step function (time, level) of running jobs (weight 'jobs') or GPUs ('gpus')."""
    events: list[tuple[float, float]] = []
    for j in jobs:
        w = j.gpus if weight == "gpus" else 1.0
        events += [(j.start, w), (j.end, -w)]
    level, out = 0.0, []
    for t, d in sorted(events):
        level += d
        out.append((t, level))
    return out


def _spans(steps: list[tuple[float, float]],
           window: tuple[float, float] | None = None) -> list[tuple[float, float]]:
    """(level, seconds) of a concurrency step function, over its own span or over a
    window (level 0 where the steps have not begun or have ended): a model's p95 and
    time over capacity are shares of the whole history, not of its own busy hours."""
    points = [(window[0], 0.0), *steps, (window[1], 0.0)] if window else steps
    return [(lvl, t2 - t1) for (t1, lvl), (t2, _) in itertools.pairwise(points) if t2 > t1]


def _time_weighted_percentile(spans: list[tuple[float, float]], q: float) -> float:
    total = sum(d for _, d in spans)
    if not total:
        return 0.0
    acc = 0.0
    for lvl, d in sorted(spans):
        acc += d
        if acc >= q / 100 * total:
            return lvl
    return spans[-1][0]


# Levels are sums of fractional GPUs: a level this close to the capacity is at it.
_EPSILON = 1e-9


def _against_capacity(jobs: list[Job], compared: list[Job], capacity: int,
                      window: tuple[float, float]) -> dict[str, Any]:
    """Peak and p95 GPUs in use at once by `jobs`, and the time `compared`'s GPUs in use
    (the jobs sharing the capacity) were over `capacity`: seconds, share of the window,
    episodes."""
    demand = _spans(concurrency(jobs, "gpus"), window)
    shared = _spans(concurrency(compared, "gpus"), window)
    over = [lvl > capacity + _EPSILON for lvl, _ in shared]
    over_s = sum(d for (_, d), o in zip(shared, over, strict=True) if o)
    span = window[1] - window[0]
    return {
        "jobs": len(jobs),
        "peak_gpus": round(max((lvl for lvl, _ in demand), default=0.0), 2),
        "p95_gpus": round(_time_weighted_percentile(demand, 95), 2),
        "capacity": capacity,
        "exceeded": over_s > 0,
        "exceeded_s": round(over_s, 3),
        "exceeded_share": round(over_s / span, 4) if span else 0.0,
        # An episode begins where a span over capacity follows one that was not.
        "exceeded_episodes": sum(o and not before for before, o in
                                 itertools.pairwise([False, *over])),
    }


def capacity_by_model(jobs: list[Job],
                      capacity: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    """Demand against capacity per GPU model (capacity: model -> capacity type -> GPUs),
    every model of the pool or of the jobs, then the jobs that name no model against the
    whole pool (the module's docstring says why)."""
    if not jobs:
        return []
    window = (min(j.start for j in jobs), max(j.end for j in jobs))
    by_model: dict[str, list[Job]] = defaultdict(list)
    for j in jobs:
        by_model[j.gpu_model].append(j)
    rows = []
    for model in sorted(set(capacity) | (set(by_model) - {""})):
        types = capacity.get(model, {})
        rows.append({"model": model, "capacity_by_type": dict(types)} | _against_capacity(
            by_model[model], by_model[model], sum(types.values()), window))
    if by_model[""]:
        rows.append({"model": None,
                     "served_by": sorted(m for m, t in capacity.items() if sum(t.values()))}
                    | _against_capacity(by_model[""], jobs, pool_gpus(capacity), window))
    return rows


def capacity_text(row: dict[str, Any]) -> str:
    """A capacity_by_model row in words, as the console and the Markdown report say it."""
    what = (row["model"] if row["model"] is not None
            else f"no model named (any of {', '.join(row['served_by']) or 'none'})")
    line = (f"{what}: peak {row['peak_gpus']:g}, p95 {row['p95_gpus']:g} of "
            f"{row['capacity']} GPUs")
    if row["exceeded"]:
        line += (f": short {row['exceeded_share']:.0%} of the time "
                 f"({row['exceeded_s'] / 3600:.1f} h, {row['exceeded_episodes']} "
                 f"episode{'' if row['exceeded_episodes'] == 1 else 's'})")
    return line


def pool_gpus(capacity: dict[str, dict[str, int]]) -> int:
    return sum(sum(types.values()) for types in capacity.values())


def simulate_fcfs_waits(jobs: list[Job], capacity: float) -> list[float]:
    """Waits if the jobs (arriving at submit, running their duration) were served first
    come first served on `capacity` GPUs, ignoring node boundaries."""
    running: list[tuple[float, float]] = []  # (end, gpus)
    free, now, waits = capacity, 0.0, []
    for j in sorted(jobs, key=lambda j: j.submit):
        need = min(j.gpus, capacity)
        now = max(now, j.submit)  # FCFS: nobody overtakes
        while running and running[0][0] <= now:
            free += heapq.heappop(running)[1]
        while free < need - 1e-9:
            end, gpus = heapq.heappop(running)
            now, free = max(now, end), free + gpus
        free -= need
        heapq.heappush(running, (now + j.duration, need))
        waits.append(now - j.submit)
    return waits


def gpus_for_wait_target(jobs: list[Job], wait_s: float, q: float = 95) -> int:
    """The smallest GPU count whose FCFS q-th percentile wait meets the target (binary
    search)."""
    lo = max(1, math.ceil(max((j.gpus for j in jobs), default=1)))
    hi = max(lo, math.ceil(sum(j.gpus for j in jobs)))
    while lo < hi:
        mid = (lo + hi) // 2
        if percentile(simulate_fcfs_waits(jobs, mid), q) <= wait_s:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _dist(values: list[float]) -> dict[str, float]:
    return {f"p{q}": round(percentile(values, q), 3) for q in (50, 90, 99)} | {
        "max": round(max(values, default=0.0), 3), "count": len(values)}


def audit(jobs: list[Job], wait_s: float, declared_quota: dict[str, int] | None = None,
          q: float = 95, capacity: dict[str, dict[str, int]] | None = None) -> dict[str, Any]:
    """The audit: per team and class, durations, GPUs per job and demand; the GPUs that keep
    the q-th percentile wait at or under wait_s; quotas in proportion to p90 demand; demand
    against the pool's capacity per model (capacity: model -> capacity type -> GPUs)."""
    groups: dict[tuple[str, str], list[Job]] = defaultdict(list)
    for j in jobs:
        groups[(j.team, j.task_class)].append(j)
    needed = gpus_for_wait_target(jobs, wait_s, q)
    per_team_peak: dict[str, float] = defaultdict(float)
    rows = []
    for (team, cls), js in sorted(groups.items()):
        p90_gpus = _time_weighted_percentile(_spans(concurrency(js, "gpus")), 90)
        per_team_peak[team] += p90_gpus
        rows.append({
            "team": team, "class": cls, "jobs": len(js),
            "duration_s": _dist([j.duration for j in js]),
            "gpus_per_job": _dist([j.gpus for j in js]),
            "parallel_jobs_peak": max((lvl for _, lvl in concurrency(js, "jobs")), default=0),
            "gpus_in_use_p90": round(p90_gpus, 2),
        })
    models = capacity_by_model(jobs, capacity or {})
    demand_total = sum(per_team_peak.values()) or 1.0
    recommended = {t: max(1, round(needed * d / demand_total)) for t, d in per_team_peak.items()}
    return {
        "jobs": len(jobs),
        "wait_target_s": wait_s,
        "wait_percentile": q,
        "gpus_needed_for_target": needed,
        "observed_wait_s": _dist([j.wait for j in jobs]),
        "groups": rows,
        "recommended_quota": recommended,
        "declared_quota": declared_quota or {},
        "pool_gpus": pool_gpus(capacity or {}),
        "capacity_by_model": models,
        # Models whose own jobs were over their capacity; None: the jobs naming no model.
        "short_of": [row["model"] for row in models if row["exceeded"]],
    }
