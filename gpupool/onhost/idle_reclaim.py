"""Idle-GPU reclaim on the controller: a running job of a task class that declares
`idle_reclaim` whose GPUs all stayed at or below the class's threshold for its `after` is
warned; if they are still idle `warn` later, the job is cancelled or requeued, as the class
says. GPUs held and unused are what keeps a shared pool at 30-45 % while others queue.

Evidence comes from dcgm-exporter's per-job series (DCGM_FI_DEV_GPU_UTIL{hpc_job="<id>"},
which the dcgm role's prolog makes possible) through Prometheus; the jobs from squeue. No
evidence, no action: a job younger than the window, with fewer than MIN_SAMPLES samples per
GPU in it, or whose series are missing (exporter down, no job map), is left alone, and so
is every job when Prometheus or Slurm does not answer (the run exits 1 and says why).

What is recorded, for the user and for on-call: the job's AdminComment in Slurm (kept in
accounting: `sacct -o JobID,AdminComment`), a line in the journal per step, and
`gpupool_idle_reclaim_total{class, team, step}` (step: warned, cleared, cancelled,
requeued) for node_exporter's textfile collector. A warning also goes to the job's srun
or salloc with `scontrol notify`, where it has one.

What a cancel or requeue took back is counted too, as idle GPU-hours:
`gpupool_idle_reclaim_gpu_hours_total{class, team, step}` (step: cancelled, requeued) adds,
per action, the GPUs the job held (scontrol's AllocTRES gres/gpu) x the time they were
idle before it: the class's window before the warning (`after`) plus the time from the
warning to the action. That is idle time measured and ended, a lower bound of how long
the GPUs sat unused; it is not a forecast of what the job would still have held (its
time left). The journal line and the AdminComment of the action say the same figures. A
job whose GPUs scontrol does not show counts 0 GPU-hours.

State between runs (which jobs were warned, when, and the counts) is one JSON file,
replaced atomically. The roles/idle_reclaim timer runs this as root every minute:

    python3 idle_reclaim.py --config /etc/gpupool/idle-reclaim.json \
        --state /var/lib/gpupool/idle-reclaim/state.json \
        --textfile /var/lib/prometheus/node-exporter/gpupool_idle_reclaim.prom

The configuration: {"prometheus": "https://10.0.0.1:9090", "auth": {"user": "gpupool",
"password_file": "/etc/prometheus/web/password", "ca_file": "/etc/prometheus/web/tls.crt"},
"classes": {"interactive": {"after_s": 1800, "warn_s": 600, "action": "cancel",
"threshold_percent": 0}}}. Prometheus requires TLS and basic auth (role monitoring); a
password is never sent over plain http.

Like the other gpupool/onhost programs it runs with the system python3 and Debian's
python3-prometheus-client only, copied to the controller as is.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import math
import os
import re
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, write_to_textfile

log = logging.getLogger("gpupool-idle-reclaim")

COMMAND_TIMEOUT_S = 10.0
QUERY_TIMEOUT_S = 10.0
MIN_SAMPLES = 3  # per GPU series in the window: a gap in scraping is not idleness
# %A: the unique job id, also of an array task: the id the prolog maps GPUs to.
SQUEUE = ["squeue", "-h", "-a", "-t", "R", "-o", "%A|%P|%a|%S"]
METRIC = "DCGM_FI_DEV_GPU_UTIL"
JOB_ID = re.compile(r"[0-9]{1,12}")
NAME = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.]{0,62}")
URL = re.compile(r"https?://[A-Za-z0-9.:\[\]-]+")
USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
PATH = re.compile(r"(/[A-Za-z0-9_][-A-Za-z0-9_.]*)+")
STEPS = ("warned", "cleared", "cancelled", "requeued")
# scontrol -o show job: AllocTRES (TRES on older Slurm; never ReqTRES) and its GPU count.
TRES = re.compile(r"(?<![A-Za-z])(?:Alloc)?TRES=(\S*)")
GPUS = re.compile(r"(?:^|,)gres/gpu=([0-9]+)(?:,|$)")
DONE = {"cancel": "cancelled", "requeue": "requeued"}  # a class's action, as a step
COMMAND = {"cancelled": ["scancel"], "requeued": ["scontrol", "requeue"]}

Run = Callable[[list[str]], str]
Query = Callable[[str], dict[str, float]]


class Unavailable(RuntimeError):
    """Slurm or Prometheus did not answer, or answered something unreadable."""


@dataclass(frozen=True)
class Rule:
    after_s: int
    warn_s: int
    action: str  # cancel | requeue
    threshold_percent: int

    @property
    def window(self) -> tuple[int, int]:
        """What idle_jobs is asked: classes that share it share one pair of queries."""
        return self.after_s, self.threshold_percent


@dataclass(frozen=True)
class Job:
    id: str
    klass: str
    team: str
    start: float


@dataclass(frozen=True)
class Endpoint:
    """Prometheus' base URL and how to log in to it (its web configuration's basic auth,
    and the certificate its TLS is checked against: the system's CAs when empty)."""
    url: str
    user: str = ""
    password_file: str = ""
    ca_file: str = ""


def load_endpoint(url: object, auth: object) -> Endpoint:
    if not isinstance(url, str) or not URL.fullmatch(url):
        raise ValueError(f"prometheus {url!r} is not an http(s)://host:port URL")
    auth = {} if auth is None else auth
    if not isinstance(auth, dict) or set(auth) - {"user", "password_file", "ca_file"}:
        raise ValueError("auth: expected {user, password_file, ca_file}")
    user, password_file, ca_file = (auth.get(k, "") for k in
                                    ("user", "password_file", "ca_file"))
    if user and not (isinstance(user, str) and USER.fullmatch(user)):
        raise ValueError(f"auth: user {user!r} is not a user name")
    for name, path in (("password_file", password_file), ("ca_file", ca_file)):
        if path and not (isinstance(path, str) and PATH.fullmatch(path)):
            raise ValueError(f"auth: {name} {path!r} is not an absolute path")
    if bool(user) != bool(password_file):
        raise ValueError("auth: a user needs a password_file and a password_file a user")
    if user and not url.startswith("https://"):
        raise ValueError(f"auth: basic auth over {url} would send the password in clear")
    return Endpoint(url, user, password_file, ca_file)


def load_config(text: str) -> tuple[Endpoint, dict[str, Rule]]:
    """Prometheus' endpoint and the rules per class (gpupool_idle_reclaim, rendered from
    the description); ValueError names what is wrong."""
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("classes"), dict):
        raise ValueError("expected {prometheus: URL, auth: {...}, classes: {class: rule}}")
    endpoint = load_endpoint(data.get("prometheus"), data.get("auth"))
    rules = {}
    for name, raw in data["classes"].items():
        if not NAME.fullmatch(str(name)) or not isinstance(raw, dict):
            raise ValueError(f"class {name!r}: not a class name with a rule")
        try:
            rule = Rule(int(raw["after_s"]), int(raw["warn_s"]), str(raw["action"]),
                        int(raw["threshold_percent"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"class {name}: {e!r}") from e
        if rule.action not in DONE or rule.after_s < 1 or rule.warn_s < 0 \
                or not 0 <= rule.threshold_percent <= 100:
            raise ValueError(f"class {name}: {raw}")
        rules[name] = rule
    return endpoint, rules


def run_command(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unavailable(f"{argv[0]}: {e}") from e
    if proc.returncode != 0:
        raise Unavailable(f"{argv[0]} exited {proc.returncode}: {proc.stderr.strip()[:300]}")
    return proc.stdout


def running_jobs(run: Run, classes: set[str]) -> list[Job]:
    """Running jobs of the given classes (a class is a partition)."""
    jobs = []
    for line in run(SQUEUE).splitlines():
        parts = line.split("|")
        if len(parts) != 4 or not JOB_ID.fullmatch(parts[0]) or parts[1] not in classes:
            continue
        try:
            start = datetime.fromisoformat(parts[3]).timestamp()
        except ValueError:
            continue  # no start time: not judged
        jobs.append(Job(parts[0], parts[1], parts[2], start))
    return jobs


def prometheus_query(endpoint: Endpoint) -> Query:
    """A PromQL instant query against the endpoint: {hpc_job: value} of its vector."""
    base_url = endpoint.url
    headers = {}
    if endpoint.user:
        try:
            with open(endpoint.password_file, encoding="utf-8") as f:
                secret = f"{endpoint.user}:{f.read().strip()}".encode()
        except OSError as e:
            raise Unavailable(f"Prometheus {base_url}: password: {e}") from e
        headers["Authorization"] = "Basic " + base64.b64encode(secret).decode()
    context = ssl.create_default_context(cafile=endpoint.ca_file or None) \
        if base_url.startswith("https://") else None

    def query(promql: str) -> dict[str, float]:
        url = f"{base_url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        request = urllib.request.Request(url, headers=headers)  # noqa: S310 - URL checked
        try:
            with urllib.request.urlopen(request, timeout=QUERY_TIMEOUT_S,  # noqa: S310
                                        context=context) as resp:
                body = json.load(resp)
        except (OSError, ValueError, urllib.error.URLError) as e:
            raise Unavailable(f"Prometheus {base_url}: {e}") from e
        if not isinstance(body, dict) or body.get("status") != "success":
            raise Unavailable(f"Prometheus {base_url}: {str(body)[:300]}")
        out = {}
        for sample in body.get("data", {}).get("result", []):
            job = sample.get("metric", {}).get("hpc_job", "")
            try:
                out[job] = float(sample["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
        return out
    return query


def idle_jobs(query: Query, window_s: int, threshold: int) -> set[str]:
    """Jobs whose every GPU series has at least MIN_SAMPLES samples in the window and
    none above the threshold."""
    selector = f'{METRIC}{{hpc_job!=""}}[{window_s}s]'
    peak = query(f"max by (hpc_job) (max_over_time({selector}))")
    fewest = query(f"min by (hpc_job) (count_over_time({selector}))")
    return {j for j, v in peak.items()
            if v <= threshold and fewest.get(j, 0) >= MIN_SAMPLES and JOB_ID.fullmatch(j)}


def gpus_held(run: Run, job: Job) -> int:
    """The GPUs a job holds, from scontrol; 0 when Slurm does not say."""
    try:
        out = run(["scontrol", "-o", "show", "job", job.id])
    except Unavailable as e:
        log.info("job %s: GPUs held unknown (%s): counted 0 GPU-hours", job.id, e)
        return 0
    for m in TRES.finditer(out):
        if gpus := GPUS.search(m.group(1)):
            return int(gpus.group(1))
    return 0


def act(run: Run, job: Job, step: str, note: str) -> bool:
    """One step on a job, recorded in its AdminComment first; False when Slurm refused
    (the job ended meanwhile, say). A warning's notify is best effort: a batch job has no
    srun or salloc to tell."""
    comment = f"gpupool idle-reclaim {step} {time.strftime('%Y-%m-%dT%H:%M:%S')}: {note}"
    try:
        run(["scontrol", "update", f"JobId={job.id}", f"AdminComment={comment}"])
        if step in COMMAND:
            run([*COMMAND[step], job.id])
    except Unavailable as e:
        log.error("job %s: %s not taken: %s", job.id, step, e)
        return False
    if step == "warned":
        try:
            run(["scontrol", "notify", job.id, f"gpupool: {note}"])
        except Unavailable as e:
            log.info("job %s: no srun or salloc to notify (%s)", job.id, e)
    log.warning("job %s (class %s, team %s): %s: %s", job.id, job.klass, job.team, step, note)
    return True


def reclaim(rules: dict[str, Rule], state: dict[str, Any], run: Run, query: Query,
            now: float) -> dict[str, Any]:
    """One pass; returns the new state ({"warned": {job: epoch}, "counts": {...}}, and
    "gpu_hours": {class|team|step: idle GPU-hours} once an action counted some)."""
    warned: dict[str, float] = dict(state.get("warned", {}))
    counts: dict[str, int] = dict(state.get("counts", {}))
    gpu_hours: dict[str, float] = dict(state.get("gpu_hours", {}))
    jobs = running_jobs(run, set(rules))
    # Prometheus is asked only when there is a job to judge.
    windows = {rules[j.klass].window for j in jobs}
    idle = {w: idle_jobs(query, *w) for w in windows}
    for job in jobs:
        rule = rules[job.klass]
        hours = 0.0  # idle GPU-hours an action ends
        is_idle = job.id in idle[rule.window] \
            and now - job.start >= rule.after_s
        if job.id not in warned and is_idle:
            step = "warned"
            note = (f"its GPUs have been idle for {rule.after_s}s; the job will be "
                    f"{DONE[rule.action]} in {rule.warn_s}s unless they are used")
        elif job.id in warned and not is_idle:
            step, note = "cleared", "its GPUs are in use again"
        elif job.id in warned and now - warned[job.id] >= rule.warn_s:
            step = DONE[rule.action]
            # Idle GPU-hours ended by the action: GPUs held x (window + warning to now).
            idle_s = rule.after_s + max(0.0, now - warned[job.id])
            gpus = gpus_held(run, job)
            hours = gpus * idle_s / 3600
            note = (f"its GPUs stayed idle {rule.warn_s}s after the warning; "
                    f"{gpus} GPU(s) idle {idle_s:.0f}s: {hours:.3f} GPU-hours reclaimed")
        else:
            continue
        if not act(run, job, step, note):
            continue
        if step == "warned":
            warned[job.id] = now
        else:
            warned.pop(job.id, None)
        key = f"{job.klass}|{job.team}|{step}"
        counts[key] = counts.get(key, 0) + 1
        if step in COMMAND and hours > 0:
            gpu_hours[key] = gpu_hours.get(key, 0.0) + hours
    # A warned job that ended by itself is forgotten.
    running = {j.id for j in jobs}
    out: dict[str, Any] = {"warned": {j: t for j, t in warned.items() if j in running},
                           "counts": counts}
    if gpu_hours:
        out["gpu_hours"] = gpu_hours
    return out


def write_state(path: str, state: dict[str, Any]) -> None:
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".idle-reclaim.")
    with os.fdopen(fd, "w") as f:
        json.dump(state, f, sort_keys=True)
    os.replace(tmp, path)


def read_state(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.error("state %s unreadable (%s): starting afresh", path, e)
        return {}
    if not isinstance(data, dict):
        return {}
    # Only well-formed entries survive: a damaged file costs warnings, never a crash.
    def entries(key: str, kind: type | tuple[type, ...]) -> dict[str, Any]:
        raw = data.get(key)
        return {k: v for k, v in raw.items() if isinstance(v, kind) and not isinstance(v, bool)
                } if isinstance(raw, dict) else {}
    state: dict[str, Any] = {"warned": entries("warned", (int, float)),
                             "counts": entries("counts", int)}
    hours = {k: float(v) for k, v in entries("gpu_hours", (int, float)).items()
             if math.isfinite(v) and v >= 0}
    if hours:
        state["gpu_hours"] = hours
    last = data.get("last_success")
    if isinstance(last, (int, float)) and not isinstance(last, bool) and math.isfinite(last):
        state["last_success"] = float(last)
    return state


GPU_HOURS_HELP = ("Idle GPU-hours ended by idle reclaim's cancel or requeue, per class and "
                  "team: per action, the GPUs the job held x the time they were idle before "
                  "it (the class's window before the warning plus warning to action); not "
                  "the job's time left")
PREFIX = "gpupool_idle_reclaim_"
# The gauges beside the counter (the IdleReclaimNotRunning alert reads them).
SERIES = {f"{PREFIX}{k}": doc for k, doc in (
    ("up", "1 when the last run judged the jobs, 0 when Slurm or Prometheus did not answer"),
    ("last_success_seconds", "When a run last judged the jobs"))}


def write_textfile(path: str, counts: dict[str, int], up: bool = True,
                   last_success: float = 0.0, gpu_hours: dict[str, float] | None = None
                   ) -> None:
    """The steps taken and the idle GPU-hours the actions ended, and whether this run
    judged the jobs (up) and when one last did: the IdleReclaimNotRunning alert reads
    those two."""
    registry = CollectorRegistry()
    total = Counter("gpupool_idle_reclaim", "Idle-GPU reclaim steps taken, per class and team",
                    ["class", "team", "step"], registry=registry)
    for key, n in sorted(counts.items()):
        klass, team, step = [*key.split("|"), "", "", ""][:3]
        if step in STEPS:
            total.labels(klass, team, step).inc(n)
    hours = Counter("gpupool_idle_reclaim_gpu_hours", GPU_HOURS_HELP, ["class", "team", "step"],
                    registry=registry)
    for key, h in sorted((gpu_hours or {}).items()):
        klass, team, step = [*key.split("|"), "", "", ""][:3]
        if step in COMMAND:
            hours.labels(klass, team, step).inc(h)
    values = {"up": 1.0 if up else 0.0, "last_success_seconds": last_success}
    for name, doc in SERIES.items():
        Gauge(name, doc, registry=registry).set(values[name.removeprefix(PREFIX)])
    write_to_textfile(path, registry)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="idle_reclaim", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="JSON: Prometheus' URL, class -> rule")
    p.add_argument("--state", required=True, help="JSON state between runs")
    p.add_argument("--textfile", default="", help="node_exporter textfile to write")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        with open(args.config, encoding="utf-8") as f:
            endpoint, rules = load_config(f.read())
    except (OSError, ValueError) as e:
        log.error("configuration %s: %s", args.config, e)
        return 2
    state = read_state(args.state)
    now, failed = time.time(), None
    if rules:
        try:
            state = reclaim(rules, state, run_command, prometheus_query(endpoint), now)
        except Unavailable as e:
            failed = e
    if failed is None:
        state["last_success"] = now
        write_state(args.state, state)
    if args.textfile:
        write_textfile(args.textfile, state.get("counts", {}), up=failed is None,
                       last_success=state.get("last_success", 0.0),
                       gpu_hours=state.get("gpu_hours", {}))
    if failed is not None:
        # Exit 1: the unit tries again shortly (a controller restarting answers nothing
        # for a few seconds); the textfile's up=0 is what on-call is alerted on.
        log.error("nothing judged this time: %s", failed)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
