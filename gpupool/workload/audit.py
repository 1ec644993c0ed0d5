"""Workload audit: what a pool's jobs look like, and how many GPUs they need.

Reads job history (Slurm `sacct` output, or the Alibaba GPU trace format) into one job
record shape, then reports durations, GPUs per job, parallel experiments per team and
class, the GPU count that keeps a wait-time target, and the quotas that would follow.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import heapq
import itertools
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
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
_GPU_TRES = re.compile(r"gres/gpu(?::[^=,]+)?=(\d+)")


@dataclass(frozen=True)
class Job:
    id: str
    team: str
    task_class: str
    gpus: float  # fractional for GPU-sharing tasks
    submit: float  # seconds
    start: float
    end: float

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


def _ran(job: Job) -> Job | None:
    """The job as the audit counts it, or None where it used no GPU or never ran. A
    submission recorded after the start (a requeued job's) waited nothing; a time or GPU
    count that is not a finite number is a mistake in the file, not a job."""
    if not all(math.isfinite(v) for v in (job.gpus, job.submit, job.start, job.end)):
        raise ValueError("times and GPU counts must be finite numbers")
    if job.gpus <= 0 or job.end <= job.start:
        return None
    return dataclasses.replace(job, submit=min(job.submit, job.start))


def _ts(value: str) -> float | None:
    if value in ("", "Unknown", "None"):
        return None
    return datetime.fromisoformat(value).timestamp()


def read_sacct(path: Path) -> list[Job]:
    """Lines of `SACCT_COMMAND` output ('|'-separated, no header)."""
    jobs = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != 8:
            raise TraceError(f"{path}:{n}: {len(fields)} '|'-separated fields, expected 8 "
                             f"(the output of: {SACCT_COMMAND})")
        job_id, account, partition, tres, submit, start, end, _state = fields
        with at_line(path, n):
            m = _GPU_TRES.findall(tres)
            s, b, e = _ts(submit), _ts(start), _ts(end)
            if not m or s is None or b is None or e is None:
                continue  # CPU-only, or never ran
            gpus = max(_gpu_count(g, "gres/gpu", MAX_JOB_GPUS) for g in m)
            if job := _ran(Job(job_id, account, partition, float(gpus), s, b, e)):
                jobs.append(job)
    return jobs


UNMAPPED_CLASS = "training"  # a QoS class the map does not name
UNMAPPED_WHY = ("not in the class map: counted as training, steady work "
                "(--class-map QOS=CLASS to say otherwise)")


def read_alibaba(path: Path, trace_end: float | None = None,
                 classes: dict[str, str] | None = None,
                 unmapped: set[str] | None = None) -> list[Job]:
    """openb_pod_list_*.csv: GPU pods; those still running end at the trace's end. classes:
    QoS class -> task class (default ALIBABA_CLASS); a QoS class it does not name counts as
    UNMAPPED_CLASS and is added to `unmapped`, so the report can say so."""
    classes = ALIBABA_CLASS if classes is None else classes
    pods = alibaba_pods(path)
    end_of_trace = trace_end or max((p.deleted or 0.0 for p in pods), default=0.0)
    jobs = []
    for p in pods:
        if p.scheduled is None:
            continue
        if p.qos not in classes and unmapped is not None:
            unmapped.add(p.qos)
        if job := _ran(Job(p.name, "trace", classes.get(p.qos, UNMAPPED_CLASS), p.gpus,
                           p.created, p.scheduled,
                           end_of_trace if p.deleted is None else p.deleted)):
            jobs.append(job)
    return jobs


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


def _time_weighted_percentile(steps: list[tuple[float, float]], q: float) -> float:
    spans = [(lvl, t2 - t1) for (t1, lvl), (t2, _) in itertools.pairwise(steps)
             if t2 > t1]
    total = sum(d for _, d in spans)
    if not total:
        return 0.0
    acc = 0.0
    for lvl, d in sorted(spans):
        acc += d
        if acc >= q / 100 * total:
            return lvl
    return spans[-1][0]


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
          q: float = 95) -> dict[str, Any]:
    """The audit: per team and class, durations, GPUs per job and demand; the GPUs that keep
    the q-th percentile wait at or under wait_s; quotas in proportion to p90 demand."""
    groups: dict[tuple[str, str], list[Job]] = defaultdict(list)
    for j in jobs:
        groups[(j.team, j.task_class)].append(j)
    needed = gpus_for_wait_target(jobs, wait_s, q)
    per_team_peak: dict[str, float] = defaultdict(float)
    rows = []
    for (team, cls), js in sorted(groups.items()):
        gpu_steps = concurrency(js, "gpus")
        p90_gpus = _time_weighted_percentile(gpu_steps, 90)
        per_team_peak[team] += p90_gpus
        rows.append({
            "team": team, "class": cls, "jobs": len(js),
            "duration_s": _dist([j.duration for j in js]),
            "gpus_per_job": _dist([j.gpus for j in js]),
            "parallel_jobs_peak": max((lvl for _, lvl in concurrency(js, "jobs")), default=0),
            "gpus_in_use_p90": round(p90_gpus, 2),
        })
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
    }
