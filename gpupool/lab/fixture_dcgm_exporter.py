#!/usr/bin/python3
# @FIXTURE_MARK@
"""The lab's FIXTURE /usr/bin/dcgm-exporter (package datacenter-gpu-manager-exporter of the
lab mirror, gpupool/lab/mirror.py). It is not NVIDIA software and reads no GPU: it exists
so that the dcgm role's unit, its flags, Prometheus' scrape, the Slurm job map and what
reads the per-job series (idle reclaim) are exercised in the lab.

It takes the real exporter's flags (--collectors, --address, --hpc-job-mapping-dir,
--remote-hostengine-info; others are ignored) and serves on GET /metrics every counter of
the collectors file for each fixture GPU (/dev/nvidia<N> device files, which the slurm
role creates in the lab), with the real exporter's labels (gpu, UUID, device, modelName,
Hostname) plus fixture="1" and FIXTURE in the help text, so that nobody takes its numbers
for GPU data. As the real exporter does, a GPU whose index names a file in the job-mapping
directory (content: job ids, one per line) gets one sample per job, labelled
hpc_job="<id>".

What the values are (NOT GPU data; the fixture GPUs are device files nobody can use):
a GPU with no job reports 0 for every counter. A GPU mapped to a job reports the CPU
activity of that job's processes on this host: the CPU time (user + system, and that of
their reaped children) they consumed between the previous scrape and this one, divided by
the wall time between the two and by the number of this host's GPUs mapped to the job, as
a percent clamped to 0-100, in DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_MEM_COPY_UTIL, and as a
ratio (percent / 100) in every DCGM_FI_PROF_*_ACTIVE counter; every other counter stays 0.
A job's processes are those descending from its slurmstepd processes (their title is
"slurmstepd: [<job>.<step>]"), read from /proc/<pid>/stat and /proc/<pid>/cmdline, which
any user may read, whatever the cgroup version or the proctrack plugin; a process that
left that tree (a daemon) is not counted. A job's first scrape reports 0 (there is no
previous one), and two scrapes less than MIN_INTERVAL_S apart share the values of the
first. So a job that computes reports activity and one that sleeps reports 0, which is
what idle reclaim (gpupool/onhost/idle_reclaim.py) is proven against in the lab.

Each scrape reads /proc once (at most MAX_PIDS processes), and a process that vanishes
meanwhile is skipped. Standard library only (lab hosts have python3). For tests only,
GPUPOOL_FIXTURE_DEV_DIR replaces /dev and GPUPOOL_FIXTURE_PROC_DIR replaces /proc.
"""

from __future__ import annotations

import argparse
import glob
import http.server
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable

FIELD = re.compile(r"DCGM_FI_[A-Z0-9_]+")
# What a job's CPU activity stands for, in percent and as a ratio.
PERCENT = frozenset({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"})
RATIO = re.compile(r"DCGM_FI_PROF_[A-Z0-9_]+_ACTIVE")
STEPD = re.compile(r"slurmstepd: \[([0-9]+)\.[^\]]*\]")
MAX_PIDS = 65536  # /proc entries read per scrape, at most
MAX_DEPTH = 64  # parent links followed from a process to its job's slurmstepd, at most
MIN_INTERVAL_S = 1.0  # a scrape sooner than this after a job's last one reuses its values
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dcgm-exporter", description="FIXTURE dcgm-exporter")
    p.add_argument("-f", "--collectors", default="/etc/dcgm-exporter/default-counters.csv")
    p.add_argument("-a", "--address", default=":9400")
    p.add_argument("--hpc-job-mapping-dir", default="")
    p.add_argument("-r", "--remote-hostengine-info", default="")
    args, _unknown = p.parse_known_args(argv)  # the real exporter's other flags
    return args


def counters(path: str) -> list[tuple[str, str, str]]:
    """(field, Prometheus type, help) of each counter line of a dcgm-exporter CSV."""
    out = []
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            field, kind, help_ = (x.strip() for x in [*line.split(",", 2), "", ""][:3])
            if FIELD.fullmatch(field) and kind in ("gauge", "counter"):
                out.append((field, kind, help_))
    return out


def gpus(dev_dir: str) -> list[int]:
    """Indexes of the /dev/nvidia<N> device files present."""
    names = (os.path.basename(d) for d in glob.glob(os.path.join(dev_dir, "nvidia[0-9]*")))
    return sorted(int(m.group(1)) for n in names if (m := re.fullmatch(r"nvidia(\d+)", n)))


def jobs(mapping_dir: str, index: int) -> list[str]:
    """Job ids the mapping directory lists for a GPU (a file named after its index)."""
    if not mapping_dir:
        return []
    try:
        with open(os.path.join(mapping_dir, str(index)), encoding="utf-8") as f:
            return [x.strip() for x in f if x.strip()]
    except OSError:
        return []


def _read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read(4096).decode("utf-8", "replace")


def job_cpu_ticks(proc_dir: str, wanted: set[str]) -> dict[str, int]:
    """CPU ticks (utime + stime + cutime + cstime) of each wanted job's processes: those
    below one of its slurmstepd processes (not counting slurmstepd's own). One pass over
    proc_dir; a process that vanishes or cannot be read is skipped."""
    if not wanted:
        return {}
    try:
        names = [n for n in os.listdir(proc_dir) if n.isdigit()][:MAX_PIDS]
    except OSError:
        return {}
    parent: dict[str, str] = {}
    ticks: dict[str, int] = {}
    job_of: dict[str, str | None] = {}  # pid -> its job, None when it has none
    for pid in names:
        try:
            stat = _read(os.path.join(proc_dir, pid, "stat"))
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            parent[pid] = fields[1]
            ticks[pid] = sum(int(x) for x in fields[11:15])
            if comm == "slurmstepd":
                title = _read(os.path.join(proc_dir, pid, "cmdline")).replace("\0", " ")
                m = STEPD.search(title)
                if m and m.group(1) in wanted:
                    job_of[pid] = m.group(1)
        except (OSError, ValueError, IndexError):
            parent.pop(pid, None)
            ticks.pop(pid, None)
    steps = set(job_of)
    out: dict[str, int] = {}
    for pid, own in ticks.items():
        if pid in steps:
            continue  # slurmstepd itself: Slurm's work, not the job's
        chain, cur, job = [], pid, None
        for _ in range(MAX_DEPTH):
            if cur in job_of:
                job = job_of[cur]
                break
            chain.append(cur)
            nxt = parent.get(cur)
            if nxt is None or nxt == cur:
                break
            cur = nxt
        for p in chain:
            if p not in steps:
                job_of[p] = job
        if job is not None:
            out[job] = out.get(job, 0) + own
    return out


class Activity:
    """Per job, the CPU percent of its processes between its last two scrapes (see the
    module's docstring), divided by the job's GPUs on this host, clamped to 0-100."""

    def __init__(self, proc_dir: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.proc_dir = proc_dir
        self.clock = clock
        self.lock = threading.Lock()
        self.last: dict[str, tuple[float, int]] = {}  # job -> (when, its ticks then)
        self.percent: dict[str, float] = {}

    def update(self, gpus_of_job: dict[str, int]) -> dict[str, float]:
        with self.lock:
            now = self.clock()
            due = [j for j in gpus_of_job
                   if j not in self.last or now - self.last[j][0] >= MIN_INTERVAL_S]
            ticks = job_cpu_ticks(self.proc_dir, set(due)) if due else {}
            for job in due:
                t = ticks.get(job, 0)
                if job in self.last:
                    when, before = self.last[job]
                    seconds = max(0, t - before) / CLOCK_TICKS
                    share = 100.0 * seconds / (now - when) / max(1, gpus_of_job[job])
                    self.percent[job] = round(min(100.0, max(0.0, share)), 2)
                else:
                    self.percent[job] = 0.0
                self.last[job] = (now, t)
            for job in set(self.last) - set(gpus_of_job):  # ended jobs are forgotten
                self.last.pop(job, None)
                self.percent.pop(job, None)
            return {j: self.percent.get(j, 0.0) for j in gpus_of_job}


def value(field: str, percent: float) -> float:
    """A counter's value for a job's CPU percent: utilisation-like counters follow it."""
    if field in PERCENT:
        return percent
    if RATIO.fullmatch(field):
        return round(percent / 100.0, 4)
    return 0.0


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics(args: argparse.Namespace, dev_dir: str, hostname: str,
            activity: Activity | None = None) -> str:
    samples: list[tuple[dict[str, str], str]] = []  # (labels, job or "")
    for i in gpus(dev_dir):
        base = {"gpu": str(i), "UUID": f"FIXTURE-{hostname}-{i}", "device": f"nvidia{i}",
                "modelName": "FIXTURE", "Hostname": hostname, "fixture": "1"}
        samples += [({**base, "hpc_job": j}, j) for j in jobs(args.hpc_job_mapping_dir, i)
                    ] or [(base, "")]
    gpus_of_job: dict[str, int] = {}
    for _, job in samples:
        if job:
            gpus_of_job[job] = gpus_of_job.get(job, 0) + 1
    percent = activity.update(gpus_of_job) if activity is not None else {}
    lines = []
    for field, kind, help_ in counters(args.collectors):
        lines += [f"# HELP {field} FIXTURE, not GPU data: {escape(help_)}",
                  f"# TYPE {field} {kind}"]
        for labels, job in samples:
            text = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
            lines.append(f"{field}{{{text}}} {value(field, percent.get(job, 0.0)):g}")
    return "\n".join(lines) + "\n"


def serve(args: argparse.Namespace) -> None:
    dev_dir = os.environ.get("GPUPOOL_FIXTURE_DEV_DIR", "/dev")
    activity = Activity(os.environ.get("GPUPOOL_FIXTURE_PROC_DIR", "/proc"))
    hostname = socket.gethostname()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                # The collectors file is read per scrape: a bad one answers 500, not a crash.
                try:
                    body = metrics(args, dev_dir, hostname, activity).encode()
                except (OSError, ValueError) as e:
                    self.send_error(500, str(e))
                    return
                kind = "text/plain; version=0.0.4; charset=utf-8"
            elif path == "/health":
                body, kind = b"OK (FIXTURE)\n", "text/plain"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *a: object) -> None:
            pass  # one line per scrape would flood the journal

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True

    host, _, port = args.address.rpartition(":")
    host = host.strip("[]")
    if ":" in host:
        Server.address_family = socket.AF_INET6
    server = Server((host, int(port)), Handler)
    print(f"dcgm-exporter FIXTURE (no GPU data) serving on {args.address}", file=sys.stderr,
          flush=True)
    server.serve_forever()


if __name__ == "__main__":
    serve(parse_args(sys.argv[1:]))
