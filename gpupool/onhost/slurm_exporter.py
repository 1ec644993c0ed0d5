"""The scheduler's metrics for Prometheus: the `gpupool_*` series that monitoring/rules and
the dashboard read, from Slurm's own commands, served on the controller.

The slurm_exporter role installs this file as is and runs it as the
gpupool-slurm-exporter service under its own user; it imports nothing of gpupool, only the
standard library and prometheus_client (Debian's python3-prometheus-client). Each scrape
runs four read-only commands (squeue, scontrol, sinfo, sacct), each bounded by a timeout,
and at most one collection every MIN_INTERVAL_S (scrapes in between get the last one). When
Slurm does not answer, the scrape still succeeds with `gpupool_slurm_up 0`, the error is
logged, and the process keeps serving: an alert, never a crash loop.

Series (labels):
- gpupool_job_gpu_allocated{job_id, team, class, Hostname, gpu}: 1 per GPU a running job holds
- gpupool_node_gpus{node, model, state="allocated"|"idle"}: GPUs per node by use
- gpupool_jobs_pending{team, class, reason} and gpupool_jobs_pending_wait_seconds_max{team,
  class}: the queue and how long its oldest job has waited so far
- gpupool_queue_wait_seconds{class} (histogram): eligible-to-start wait of jobs that started
- gpupool_jobs_finished_total{team, class, state}: state as sacct prints it (OUT_OF_MEMORY,
  NODE_FAIL, PREEMPTED, TIMEOUT, ...)
- gpupool_node_state{node, state, reason}: 1 for the node's current base state (drained,
  idle, ...), power flags dropped: a powered-down burst node is idle with power="off"
- gpupool_slurm_up, gpupool_exporter_collect_seconds, gpupool_exporter_errors_total{command}

It also tells Prometheus where the burst nodes are (SD_PATH, an HTTP service discovery
endpoint): no inventory knows a burst node's address, which its instance gets at launch and
the resume program gives Slurm (NodeAddr); Slurm's cloud nodes that are powered up, at that
address, are the targets, with their node name as the `node` label on-prem targets carry.

Two halves, for slurm.conf's PrivateData=jobs (render/slurm.py): with it, Slurm lists
others' jobs only to root, SlurmUser, AdminLevel operators and coordinators, and every one of
those may also change jobs (Slurm has no read-only level; a slurmrestd token carries its
user's powers too). So the process that serves HTTP never holds that view:

- the privileged half (--write-snapshot DIR), run as root by a oneshot timer, sandboxed,
  takes no input but its fixed command lines (SNAPSHOT), runs them and writes their output
  as one JSON file (SNAPSHOT_NAME) without following links (prom_textfile, beside this
  file), in a directory only root writes and only the exporter's group reads;
- the serving half (--snapshot FILE), unprivileged, answers those commands from the file
  (SnapshotRun), and runs as itself only what PrivateData does not hide: the cloud nodes'
  sinfo and `scontrol show hostnames`. A snapshot older than --max-age, or one whose
  command failed, is `gpupool_slurm_up 0`, like Slurm not answering.

    python3 slurm_exporter.py --listen 127.0.0.1:9815     # serve, running the commands
    python3 slurm_exporter.py --once                      # print one scrape and exit
    python3 slurm_exporter.py --write-snapshot DIR        # privileged half: one snapshot
    python3 slurm_exporter.py --snapshot DIR/slurm.json --listen ...   # serving half
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    REGISTRY,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

# The privileged half writes its snapshot without following a planted link (see there).
try:  # in the package: the tests, the lab's control host
    from gpupool.onhost import prom_textfile
except ImportError:  # on the controller, where role slurm_exporter copies it beside this file
    import prom_textfile  # type: ignore[no-redef]

log = logging.getLogger("gpupool-slurm-exporter")

COMMAND_TIMEOUT_S = 10.0
MIN_INTERVAL_S = 5.0
MAX_HOSTLISTS_PER_SCRAPE = 200  # `scontrol show hostnames` calls for compressed node lists
# Wait buckets in seconds: seconds (interactive) up to a day (deferred work).
WAIT_BUCKETS = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
                14400.0, 43200.0, 86400.0)
FINISHED = "CD,F,OOM,NF,PR,TO,CA,DL,BF"  # sacct's codes of final states
SQUEUE = ["squeue", "-h", "-a", "-t", "PD,R,CG,S,CF", "-o", "%i|%T|%P|%a|%V|%S|%r"]
SCONTROL_JOBS = ["scontrol", "-d", "show", "job"]
SINFO = ["sinfo", "-h", "-N", "-o", "%N|%T|%G|%E"]
# Cloud nodes with the address Slurm reaches them at (the node name until one is given).
SINFO_CLOUD = ["sinfo", "-h", "-N", "-t", "CLOUD", "-o", "%N|%o|%T"]
SD_PATH = "/sd/cloud-nodes"  # ?port=N: Prometheus http_sd targets, that port on each
# -D: every run of a requeued job, so a preemption is counted as well as the final state.
SACCT = ["sacct", "-a", "-X", "-D", "-n", "-P", "-o",
         "JobID,Account,Partition,State,Eligible,Start,End"]

# The snapshot: the four commands whose answers PrivateData=jobs hides from the exporter's
# own user (sinfo's with them, so that nodes and jobs are of one moment). sacct over a fixed
# window, not from a cursor: the privileged half keeps no state and reads nothing the
# serving half writes, and the serving half counts each run once however the windows
# overlap (Finished), so one missed timer run or a slow one loses nothing.
SACCT_WINDOW = [*SACCT, "-s", FINISHED, "-S", "now-15minutes", "-E", "now"]
SNAPSHOT = {"squeue": SQUEUE, "jobs": SCONTROL_JOBS, "nodes": SINFO, "finished": SACCT_WINDOW}
SNAPSHOT_NAME = "slurm.json"
SNAPSHOT_MAX_BYTES = 64 << 20
SNAPSHOT_MAX_AGE_S = 60.0

Run = Callable[[list[str]], str]


class SlurmUnavailable(RuntimeError):
    """A Slurm command failed or timed out."""


def run_command(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmUnavailable(f"{argv[0]}: {exc}") from exc
    if proc.returncode != 0:
        raise SlurmUnavailable(f"{argv[0]} exited {proc.returncode}: {proc.stderr.strip()[:300]}")
    return proc.stdout


def take_snapshot(run: Run = run_command, clock: Callable[[], float] = time.time) -> bytes:
    """The privileged half's one run: each SNAPSHOT command's output, or why it failed."""
    outputs: dict[str, str] = {}
    errors: dict[str, str] = {}
    for key, argv in SNAPSHOT.items():
        try:
            outputs[key] = run(argv)
        except SlurmUnavailable as exc:  # the serving half reports it: gpupool_slurm_up 0
            log.error("snapshot: %s", exc)
            errors[key] = str(exc)[:300]
    return json.dumps({"taken": clock(), "outputs": outputs, "errors": errors}).encode()


def write_snapshot(directory: str, run: Run = run_command,
                   clock: Callable[[], float] = time.time) -> None:
    """take_snapshot into directory/SNAPSHOT_NAME, never through a link (prom_textfile:
    a directory anyone but root may write is refused, nothing is written)."""
    prom_textfile.write(Path(directory), SNAPSHOT_NAME, take_snapshot(run, clock))


class SnapshotRun:
    """The serving half's Run: the SNAPSHOT commands answered from the file the privileged
    half wrote (SlurmUnavailable when it is missing, malformed, older than max_age, or
    records that command failing); any other command run as this user (run)."""

    def __init__(self, path: str, max_age: float = SNAPSHOT_MAX_AGE_S,
                 clock: Callable[[], float] = time.time, run: Run = run_command) -> None:
        self.path, self.max_age, self.clock, self.fallback = path, max_age, clock, run

    @staticmethod
    def key(argv: list[str]) -> str | None:
        if argv[:len(SACCT)] == SACCT:  # the collector asks from its cursor; any window does
            return "finished"
        return next((k for k, a in SNAPSHOT.items() if a == argv), None)

    def load(self) -> dict[str, Any]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                data = f.read(SNAPSHOT_MAX_BYTES + 1)
        except OSError as exc:
            raise SlurmUnavailable(f"snapshot {self.path}: {exc.strerror or exc}") from exc
        try:
            if len(data) > SNAPSHOT_MAX_BYTES:
                raise ValueError("too large")
            snap = json.loads(data)
            taken = float(snap["taken"])
            outputs, errors = snap["outputs"], snap["errors"]
            if not (isinstance(outputs, dict) and isinstance(errors, dict) and all(
                    isinstance(v, str) for v in (*outputs.values(), *errors.values()))):
                raise ValueError("outputs and errors must map names to text")
        except (ValueError, KeyError, TypeError) as exc:
            raise SlurmUnavailable(f"snapshot {self.path}: malformed ({exc})") from exc
        age = self.clock() - taken
        if not math.isfinite(age) or age > self.max_age or age < -self.max_age:
            raise SlurmUnavailable(f"snapshot {self.path}: taken {age:.0f} s ago, "
                                   f"more than {self.max_age:.0f}")
        return {"outputs": outputs, "errors": errors}

    def __call__(self, argv: list[str]) -> str:
        key = self.key(argv)
        if key is None:
            return self.fallback(argv)
        snap = self.load()
        if key in snap["errors"]:
            raise SlurmUnavailable(f"{argv[0]} (snapshot): {snap['errors'][key]}")
        if key not in snap["outputs"]:
            raise SlurmUnavailable(f"{argv[0]}: not in the snapshot")
        return snap["outputs"][key]


def timestamp(value: str) -> float | None:
    """A Slurm time (2026-12-01T00:40:12) as epoch seconds; None for Unknown/None/N/A."""
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def base_state(state: str) -> tuple[str, str]:
    """A node state as sinfo prints it, split into the base state and its power flag:
    idle~ is powered down, idle# powering up, down* not responding."""
    power = {"~": "off", "#": "powering_up", "%": "powering_down", "!": "powering_down"}
    flag = next((power[c] for c in state if c in power), "on")
    base = state.rstrip("*~#!%$@^-+").lower()
    return base, flag


def indices(spec: str) -> list[int]:
    """GPU indices of an IDX list: '0-1,3' -> [0, 1, 3]."""
    out: list[int] = []
    for part in filter(None, spec.split(",")):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"not a GPU index list: {spec!r}")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


@dataclass
class Job:
    job_id: str
    state: str
    klass: str
    team: str
    eligible: float | None
    start: float | None
    reason: str


def parse_squeue(text: str) -> list[Job]:
    jobs = []
    for line in text.splitlines():
        parts = line.split("|", 6)
        if len(parts) != 7:
            continue
        jid, state, klass, team, eligible, start, reason = parts
        jobs.append(Job(jid.strip(), state, klass, team, timestamp(eligible), timestamp(start),
                        reason.strip("()") or "None"))
    return jobs


_JOB_LINE = re.compile(r"^JobId=(\d+)\s")
# A detail line of `scontrol -d show job`: one per group of nodes with the same allocation.
_DETAIL = re.compile(r"^\s+Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S*)\s*$")
_GPU_IDX = re.compile(r"(?:^|,)gpu(?::[^:(,]+)?(?::\d+)?\(IDX:([0-9,-]+)\)")


def parse_gpu_details(text: str) -> list[tuple[str, str, list[int]]]:
    """(job id, node list, GPU indices) of every detail line of `scontrol -d show job`."""
    found, job = [], None
    for line in text.splitlines():
        if m := _JOB_LINE.match(line):
            job = m.group(1)
        elif job and (m := _DETAIL.match(line)):
            try:
                gpus = [i for g in _GPU_IDX.finditer(m.group(2)) for i in indices(g.group(1))]
            except ValueError as exc:  # one odd line must not hide every other job's GPUs
                log.warning("job %s: %s", job, exc)
                continue
            if gpus:
                found.append((job, m.group(1), gpus))
    return found


@dataclass
class Node:
    name: str
    state: str
    power: str
    model: str
    gpus: int
    reason: str


def parse_sinfo(text: str) -> dict[str, Node]:
    nodes: dict[str, Node] = {}
    for line in text.splitlines():
        parts = line.split("|", 3)
        if len(parts) != 4:
            continue
        name, state, gres, reason = parts
        model, gpus = "", 0
        for g in gres.split(","):
            fields = g.split("(")[0].split(":")
            if fields[0] == "gpu" and fields[-1].isdigit():
                model, gpus = (fields[1] if len(fields) == 3 else ""), gpus + int(fields[-1])
        base, power = base_state(state)
        nodes[name] = Node(name, base, power, model, gpus, reason.strip() or "none")
    return nodes


def parse_cloud_nodes(text: str) -> dict[str, str]:
    """Node name -> address of the cloud nodes that are powered up and have an address:
    one that is still its name has not been resumed (or is powered down again)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or base_state(parts[2])[1] != "on":
            continue
        try:
            address = ipaddress.ip_address(parts[1].strip())
        except ValueError:
            continue
        found[parts[0].strip()] = str(address)
    return found


def sd_targets(nodes: dict[str, str], port: int) -> list[dict[str, Any]]:
    """Prometheus http_sd's answer: each node's port, labelled with the node's name."""
    return [{"targets": [f"[{a}]:{port}" if ":" in a else f"{a}:{port}"],
             "labels": {"node": name}} for name, a in sorted(nodes.items())]


def sd_port(query: str) -> int | None:
    """The one port a service-discovery request asks for, or None for any other query."""
    try:
        asked = parse_qs(query, strict_parsing=True, max_num_fields=4)
    except ValueError:
        return None
    ports = asked.get("port", [])
    if set(asked) != {"port"} or len(ports) != 1 or not re.fullmatch(r"[0-9]{1,5}", ports[0]):
        return None
    return int(ports[0]) if 0 < int(ports[0]) < 65536 else None


@dataclass
class Finished:
    """sacct's records of finished jobs, each counted once across scrapes: the cursor is the
    newest end time seen, and the runs (job, state) ending in that second (sacct's
    resolution)."""

    counts: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    waits: dict[str, list[int]] = field(default_factory=dict)  # class -> bucket counts
    wait_sums: Counter[str] = field(default_factory=Counter)
    cursor: float = 0.0
    at_cursor: set[str] = field(default_factory=set)

    def since(self) -> str:
        return datetime.fromtimestamp(self.cursor).strftime("%Y-%m-%dT%H:%M:%S")

    def add(self, text: str) -> None:
        newest, at_newest = self.cursor, set(self.at_cursor)
        for line in text.splitlines():
            parts = line.split("|")
            if len(parts) != 7:
                continue
            jid, team, klass, state, eligible, start, end = parts
            run, ended = f"{jid}|{state}", timestamp(end)
            if not state.split() or ended is None or ended < self.cursor or (
                    ended == self.cursor and run in self.at_cursor):
                continue  # no state is no finished run (one odd line must not fail a scrape)
            self.counts[(team, klass, state.split()[0])] += 1
            began, ready = timestamp(start), timestamp(eligible)
            if began is not None and ready is not None:
                self.observe(klass, max(0.0, began - ready))
            if ended > newest:
                newest, at_newest = ended, set()
            if ended == newest:
                at_newest.add(run)
        self.cursor, self.at_cursor = newest, at_newest

    def observe(self, klass: str, wait: float) -> None:
        buckets = self.waits.setdefault(klass, [0] * (len(WAIT_BUCKETS) + 1))
        for i, le in enumerate((*WAIT_BUCKETS, math.inf)):
            if wait <= le:
                buckets[i] += 1
        self.wait_sums[klass] += wait


class SlurmCollector:
    """Collects on scrape, at most once per MIN_INTERVAL_S; run: how commands are run."""

    def __init__(self, run: Run = run_command, clock: Callable[[], float] = time.time,
                 started: float | None = None) -> None:
        self.run, self.clock = run, clock
        self.finished = Finished(cursor=float(int(started if started is not None else clock())))
        self.errors: Counter[str] = Counter()
        self.hostnames: dict[str, list[str]] = {}
        self.lock = threading.Lock()
        self.last: tuple[float, list[Metric]] = (-math.inf, [])
        self.cloud_last: tuple[float, dict[str, str]] = (-math.inf, {})

    def cloud_nodes(self) -> dict[str, str]:
        """parse_cloud_nodes of Slurm's answer, at most once per MIN_INTERVAL_S; raises
        SlurmUnavailable when Slurm does not answer."""
        with self.lock:
            now = time.monotonic()
            if now - self.cloud_last[0] >= MIN_INTERVAL_S:
                self.cloud_last = (now, parse_cloud_nodes(self._call(SINFO_CLOUD)))
            return self.cloud_last[1]

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            now = time.monotonic()
            if now - self.last[0] >= MIN_INTERVAL_S:
                self.last = (now, self._collect())
            return iter(self.last[1])

    def _expand(self, hostlist: str, budget: list[int]) -> list[str]:
        if "[" not in hostlist:
            return hostlist.split(",")
        if hostlist not in self.hostnames and budget[0] > 0:
            budget[0] -= 1
            self.hostnames[hostlist] = self.run(["scontrol", "show", "hostnames", hostlist]
                                                ).split()
        return self.hostnames.get(hostlist, [])

    def _collect(self) -> list[Metric]:
        t0 = time.monotonic()
        up = GaugeMetricFamily("gpupool_slurm_up", "1 when every Slurm command answered")
        try:
            metrics = self._from_slurm()
            up.add_metric([], 1)
        except SlurmUnavailable as exc:
            log.error("collection failed: %s", exc)
            metrics = []
            up.add_metric([], 0)
        errors = CounterMetricFamily("gpupool_exporter_errors", "Failed collections by command",
                                     labels=["command"])
        for command, n in sorted(self.errors.items()):
            errors.add_metric([command], n)
        took = GaugeMetricFamily("gpupool_exporter_collect_seconds",
                                 "Seconds the last collection took")
        took.add_metric([], time.monotonic() - t0)
        return [*metrics, up, errors, took]

    def _call(self, argv: list[str]) -> str:
        try:
            return self.run(argv)
        except SlurmUnavailable:
            self.errors[argv[0]] += 1
            raise

    def _from_slurm(self) -> list[Metric]:
        jobs = {j.job_id: j for j in parse_squeue(self._call(SQUEUE))}
        details = parse_gpu_details(self._call(SCONTROL_JOBS))
        nodes = parse_sinfo(self._call(SINFO))
        self.finished.add(self._call([*SACCT, "-s", FINISHED, "-S", self.finished.since(),
                                      "-E", "now"]))
        now = self.clock()
        return [*self._allocation(jobs, details, nodes), *self._queue(jobs.values(), now),
                *self._finished(), self._node_states(nodes.values())]

    def _allocation(self, jobs: dict[str, Job], details: list[tuple[str, str, list[int]]],
                    nodes: dict[str, Node]) -> list[Metric]:
        held = GaugeMetricFamily("gpupool_job_gpu_allocated", "1 per GPU a running job holds",
                                 labels=["job_id", "team", "class", "Hostname", "gpu"])
        used: Counter[str] = Counter()
        budget = [MAX_HOSTLISTS_PER_SCRAPE]
        for jid, hostlist, gpus in details:
            job = jobs.get(jid)
            if job is None or job.state not in ("RUNNING", "COMPLETING"):
                continue
            for host in self._expand(hostlist, budget):
                used[host] += len(gpus)
                for gpu in gpus:
                    held.add_metric([jid, job.team, job.klass, host, str(gpu)], 1)
        per_node = GaugeMetricFamily("gpupool_node_gpus", "GPUs per node by use",
                                     labels=["node", "model", "state"])
        for node in nodes.values():
            if node.gpus:
                busy = min(used[node.name], node.gpus)
                per_node.add_metric([node.name, node.model, "allocated"], busy)
                per_node.add_metric([node.name, node.model, "idle"], node.gpus - busy)
        return [held, per_node]

    @staticmethod
    def _queue(jobs: Iterable[Job], now: float) -> list[Metric]:
        pending: Counter[tuple[str, str, str]] = Counter()
        oldest: dict[tuple[str, str], float] = {}
        for j in jobs:
            if j.state != "PENDING":
                continue
            pending[(j.team, j.klass, j.reason)] += 1
            if j.eligible is not None and j.eligible <= now:
                key = (j.team, j.klass)
                oldest[key] = max(oldest.get(key, 0.0), now - j.eligible)
        count = GaugeMetricFamily("gpupool_jobs_pending", "Pending jobs",
                                  labels=["team", "class", "reason"])
        for labels, n in sorted(pending.items()):
            count.add_metric(list(labels), n)
        wait = GaugeMetricFamily("gpupool_jobs_pending_wait_seconds_max",
                                 "How long the oldest eligible pending job has waited so far",
                                 labels=["team", "class"])
        for labels, seconds in sorted(oldest.items()):
            wait.add_metric(list(labels), seconds)
        return [count, wait]

    def _finished(self) -> list[Metric]:
        total = CounterMetricFamily("gpupool_jobs_finished", "Jobs finished, by final state",
                                    labels=["team", "class", "state"])
        for labels, n in sorted(self.finished.counts.items()):
            total.add_metric(list(labels), n)
        hist = HistogramMetricFamily("gpupool_queue_wait_seconds",
                                     "Eligible-to-start wait of jobs that started",
                                     labels=["class"])
        for klass, counts in sorted(self.finished.waits.items()):
            les = [*(f"{b:g}" for b in WAIT_BUCKETS), "+Inf"]
            hist.add_metric([klass], list(zip(les, counts, strict=True)),
                            self.finished.wait_sums[klass])
        return [total, hist]

    @staticmethod
    def _node_states(nodes: Iterable[Node]) -> Metric:
        state = GaugeMetricFamily("gpupool_node_state", "1 for the node's current Slurm state",
                                  labels=["node", "state", "power", "reason"])
        for n in nodes:
            state.add_metric([n.name, n.state, n.power, n.reason[:200]], 1)
        return state


def wsgi_app(collector: SlurmCollector, registry: CollectorRegistry
             ) -> Callable[..., Iterable[bytes]]:
    """The registry's metrics on every path (as prometheus_client serves them), and the
    burst nodes' targets (from collector) on SD_PATH."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != SD_PATH:
            return metrics(environ, start_response)
        port = sd_port(environ.get("QUERY_STRING", ""))
        if port is None:
            status, body = "400 Bad Request", b"ask for ?port=N (1-65535)\n"
        else:
            try:
                status = "200 OK"
                body = json.dumps(sd_targets(collector.cloud_nodes(), port)).encode()
            except SlurmUnavailable as exc:  # Prometheus keeps the targets it last had
                log.error("service discovery failed: %s", exc)
                status, body = "503 Service Unavailable", b"Slurm did not answer\n"
        start_response(status, [("Content-Type", "application/json" if status == "200 OK"
                                 else "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    return app


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in flight never holds the service's stop


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the base's parameter names
        """One line per scrape would fill the journal."""


def serve(collector: SlurmCollector, host: str, port: int,
          registry: CollectorRegistry = REGISTRY) -> WSGIServer:
    """Serve wsgi_app on host:port, on a thread, until the server is shut down or the
    process stops (port 0: any free one; server.server_port says which)."""
    server = make_server(host, port, wsgi_app(collector, registry),
                         _Server6 if ":" in host else _Server, _Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:9815", help="ADDRESS:PORT to serve on")
    p.add_argument("--once", action="store_true", help="print one scrape and exit")
    p.add_argument("--snapshot", metavar="FILE",
                   help="answer the job and node commands from this snapshot")
    p.add_argument("--max-age", type=float, default=SNAPSHOT_MAX_AGE_S, metavar="SECONDS",
                   help="a snapshot older than this is Slurm not answering")
    p.add_argument("--write-snapshot", metavar="DIR",
                   help=f"run the job and node commands once, write DIR/{SNAPSHOT_NAME}, exit")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if args.write_snapshot:
        try:
            write_snapshot(args.write_snapshot)
        except OSError as exc:  # prom_textfile.Refused too: nothing written
            log.error("snapshot not written: %s", exc)
            return 1
        return 0
    collector = SlurmCollector(SnapshotRun(args.snapshot, args.max_age) if args.snapshot
                               else run_command)
    if args.once:
        from prometheus_client import generate_latest  # noqa: PLC0415
        registry = CollectorRegistry()
        registry.register(collector)
        sys.stdout.write(generate_latest(registry).decode())
        return 0
    address, _, port = args.listen.rpartition(":")
    if not port.isdigit():
        p.error(f"--listen wants ADDRESS:PORT, not {args.listen!r}")
    REGISTRY.register(collector)
    serve(collector, address.strip("[]") or "127.0.0.1", int(port))
    log.info("serving the scheduler's metrics on %s", args.listen)
    threading.Event().wait()  # serve until systemd stops the service
    return 0


if __name__ == "__main__":
    sys.exit(main())
