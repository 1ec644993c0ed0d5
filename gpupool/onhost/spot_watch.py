"""Spot interruption watcher: runs on each spot burst node and hands its jobs back to Slurm
before EC2 reclaims the instance.

It polls the instance metadata service (IMDSv2: a session token from
`PUT /latest/api/token`, refreshed before its TTL runs out) for

- `meta-data/spot/instance-action` (404 when there is none; 200 with
  `{"action": "terminate"|"stop"|"hibernate", "time": "2026-12-01T11:20:00Z"}` about two
  minutes before EC2 acts): an interruption notice. The node is drained with a reason, and
  every job running on it is requeued (see requeue_jobs for why `scontrol requeue` rather
  than a bare signal) so a job that follows the job convention (runbooks/job-convention.md)
  saves a checkpoint on the SIGTERM and runs again elsewhere, losing at most one
  checkpoint interval. Then the watcher exits: the instance is going away.
- `meta-data/events/recommendations/rebalance` (404 when there is none; 200 with
  `{"noticeTime": "..."}`): a rebalance recommendation, an early hint that the instance is
  at elevated risk. The node is only drained, so no new job lands on it and running ones
  go on until a real notice (or their end).

Each notice is acted on once (by its kind and time), however often it is polled.

The record for the controller is the drain reason itself, which slurmctld keeps and shows
(`sinfo -R`, `scontrol show node`); its format (RECORD, for the resume program to parse) is

    gpupool: spot interruption notice, terminating at <time> [instance-type=<t> zone=<z>]
    gpupool: spot rebalance recommendation at <time> [instance-type=<t> zone=<z>]

with the node being the one the reason is on, `<time>` EC2's UTC time (`%Y-%m-%dT%H:%M:%SZ`,
or `unknown`), and `<t>`/`<z>` the instance type and availability zone from IMDS (or
`unknown`). The verb follows the notice's action: terminating, stopping or hibernating.
A reason in Slurm is the one channel this node has to the controller (it talks to nothing
but IMDS and slurmctld), and it is where an operator looks first.

Every value read from IMDS is checked against what EC2 documents for it (instance type,
zone and time patterns; the action among the three) before it lands in a reason; a value
that does not match is replaced by `unknown` and logged, and the notice is still acted on,
since losing the jobs on a real notice is worse than draining on a malformed one. Network
goes only to the configured IMDS base (no proxy, no redirect); every command is an argv
list with a timeout; every request, retry and wait is bounded.

This file runs on the node with the system python3 and the standard library only (no
gpupool import), like gpupool/onhost/burst.py: it is copied to the node as is, e.g. to
/usr/local/sbin/gpupool-spot-watch, and run as root (scontrol update needs SlurmUser or
root) by a unit such as

    [Unit]
    Description=gpupool spot interruption watcher
    After=slurmd.service
    [Service]
    ExecStart=/usr/bin/python3 /usr/local/sbin/gpupool-spot-watch --node %H
    Restart=on-failure
    RestartSec=5

started on spot nodes only (`systemctl enable --now gpupool-spot-watch`), with `--node`
the node's Slurm name when it differs from its host name. It exits 0 after acting on an
interruption notice and 1 after IMDS failed MAX_FAILURES polls in a row (so systemd
restarts it with a pause rather than it spinning); `--once` polls once (for checks).
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from email.message import Message
from typing import IO

log = logging.getLogger("gpupool-spot-watch")

IMDS_BASE = "http://169.254.169.254"
INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
INSTANCE_TYPE_PATH = "/latest/meta-data/instance-type"
ZONE_PATH = "/latest/meta-data/placement/availability-zone"
TOKEN_PATH = "/latest/api/token"  # noqa: S105 - a path, not a secret
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"  # noqa: S105 - a name
TOKEN_HEADER = "X-aws-ec2-metadata-token"  # noqa: S105 - a header name
# A token lives this long; it is renewed TOKEN_MARGIN_S before, so no request carries one
# that expires in flight.
TOKEN_TTL_S = 300
TOKEN_MARGIN_S = 30
# IMDS is link-local and answers in milliseconds; longer means it is unreachable.
REQUEST_TIMEOUT_S = 2.0
# The notice comes two minutes ahead: polling every 5 s leaves nearly all of it for jobs.
INTERVAL_S = 5.0
# Consecutive failed polls before the watcher gives up (and systemd restarts it).
MAX_FAILURES = 12
# scontrol and squeue answer in well under this, or slurmctld is hung.
COMMAND_TIMEOUT_S = 20
# A body larger than this is not a metadata answer.
MAX_BODY = 4096

# What EC2 and Slurm accept, so nothing IMDS or the command line gives can carry a
# separator, a quote, an option or a shell word into a command or a reason.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}")
INSTANCE_TYPE = re.compile(r"[a-z0-9-]{1,32}\.[a-z0-9-]{1,32}")
ZONE = re.compile(r"[a-z]{2}(-[a-z]+)+-\d[a-z]")
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
JOB_ID = re.compile(r"\d{1,12}")
VERBS = {"terminate": "terminating", "stop": "stopping", "hibernate": "hibernating"}
UNKNOWN = "unknown"
# The record format above, for the resume program: it matches a node's reason.
RECORD = re.compile(
    r"gpupool: spot (?P<kind>interruption notice|rebalance recommendation)"
    r"(?:, (?P<verb>terminating|stopping|hibernating))? at (?P<time>\S+) "
    r"\[instance-type=(?P<instance_type>\S+) zone=(?P<zone>\S+)\]")


class ImdsError(RuntimeError):
    """IMDS did not answer, or answered something other than 200 or 404."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # IMDS never redirects; following one would send the token elsewhere.
    def redirect_request(  # noqa: PLR0917 - urllib calls it with these six
            self, req: urllib.request.Request, fp: IO[bytes], code: int,
            msg: str, headers: Message, newurl: str) -> None:
        return None


class Imds:
    """IMDSv2 at one base URL: GETs with a session token, renewed before it expires and
    once more when IMDS refuses it (401: IMDS restarted or the clock drifted)."""

    def __init__(self, base: str = IMDS_BASE, *, ttl_s: int = TOKEN_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        url = urllib.parse.urlsplit(base)
        if url.scheme != "http" or not url.hostname or url.path not in ("", "/") \
                or url.query or url.fragment or url.username:
            raise ValueError(f"IMDS base {base!r} is not http://HOST[:PORT]")
        self.base, self.ttl_s, self.clock = base.rstrip("/"), ttl_s, clock
        self.token, self.expires = "", 0.0
        # No proxy from the environment: IMDS is reached directly or not at all.
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                                  _NoRedirect())

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        # The base was checked to be http://HOST[:PORT] and path is one of ours.
        request = urllib.request.Request(self.base + path, method=method,  # noqa: S310
                                         headers=headers)
        try:
            with self.opener.open(request, timeout=REQUEST_TIMEOUT_S) as response:
                return response.status, response.read(MAX_BODY).decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            return e.code, ""
        # URLError, timeouts and resets are OSErrors; a truncated or garbled answer is an
        # HTTPException.
        except (OSError, ValueError, http.client.HTTPException) as e:
            raise ImdsError(f"{method} {path}: {e}") from e

    def _renew(self) -> None:
        issued = self.clock()
        status, body = self._request("PUT", TOKEN_PATH, {TOKEN_TTL_HEADER: str(self.ttl_s)})
        if status != 200 or not body:
            raise ImdsError(f"PUT {TOKEN_PATH}: HTTP {status}")
        self.token, self.expires = body.strip(), issued + self.ttl_s

    def get(self, path: str) -> str | None:
        """The body at path, or None when IMDS says there is none (404)."""
        if self.clock() >= self.expires - min(TOKEN_MARGIN_S, self.ttl_s / 2):
            self._renew()
        status, body = self._request("GET", path, {TOKEN_HEADER: self.token})
        if status == 401:
            self._renew()
            status, body = self._request("GET", path, {TOKEN_HEADER: self.token})
        if status == 404:
            return None
        if status != 200:
            raise ImdsError(f"GET {path}: HTTP {status}")
        return body


def _valid(pattern: re.Pattern[str], value: object, field: str) -> str:
    if isinstance(value, str) and pattern.fullmatch(value):
        return value
    log.warning("IMDS %s=%r does not match %s: recorded as %s", field, value,
                pattern.pattern, UNKNOWN)
    return UNKNOWN


def _valid_time(value: object, field: str) -> str:
    checked = _valid(TIME, value, field)
    if checked != UNKNOWN:
        try:  # the pattern admits month 13; the calendar does not
            datetime.strptime(checked, "%Y-%m-%dT%H:%M:%SZ")
        except ValueError:
            log.warning("IMDS %s=%r is not a date: recorded as %s", field, value, UNKNOWN)
            return UNKNOWN
    return checked


def _fields(body: str) -> dict[str, object]:
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        log.warning("IMDS notice %r is not a JSON object: its fields are %s", body, UNKNOWN)
        return {}
    return parsed


@dataclass(frozen=True)
class Notice:
    """One notice, with every field checked: `kind` is "interruption" or "rebalance"."""
    kind: str
    time: str
    action: str = ""

    def reason(self, instance_type: str, zone: str) -> str:
        record = f"[instance-type={instance_type} zone={zone}]"
        if self.kind == "rebalance":
            return f"gpupool: spot rebalance recommendation at {self.time} {record}"
        verb = VERBS.get(self.action, "terminating")  # terminate is the spot default
        return f"gpupool: spot interruption notice, {verb} at {self.time} {record}"


def notices(imds: Imds) -> list[Notice]:
    """The notices IMDS has now, the interruption (the one to act on fully) first."""
    found = []
    body = imds.get(INSTANCE_ACTION)
    if body is not None:
        fields = _fields(body)
        action = fields.get("action")
        if action not in VERBS:
            log.warning("IMDS action=%r is not one of %s", action, sorted(VERBS))
            action = ""
        found.append(Notice("interruption", _valid_time(fields.get("time"), "time"),
                            str(action)))
    body = imds.get(REBALANCE)
    if body is not None:
        found.append(Notice("rebalance", _valid_time(_fields(body).get("noticeTime"),
                                                     "noticeTime")))
    return found


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """argv's outcome; a command that hangs or is missing is a failure like any other, so
    one bad command never stops the watcher from trying the rest."""
    try:
        return subprocess.run(argv, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(argv, 1, "", str(e))


def drain(node: str, reason: str) -> bool:
    out = _run(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"])
    if out.returncode:
        log.error("drain %s: %s", node, out.stderr.strip())
    return out.returncode == 0


def jobs_on(node: str) -> list[str]:
    out = _run(["squeue", "--noheader", f"--nodelist={node}",
                "--states=RUNNING,SUSPENDED,CONFIGURING", "--format=%A"])
    if out.returncode:
        log.error("squeue on %s: %s", node, out.stderr.strip())
        return []
    return [j for j in out.stdout.split() if JOB_ID.fullmatch(j)]


def requeue_jobs(jobs: list[str]) -> None:
    """Hand each job back to the queue, letting it checkpoint first.

    `scontrol requeue` rather than `scancel --signal=TERM` (with or without --batch or
    --full): a signal alone does not requeue. A job that follows the convention traps the
    SIGTERM in its step, saves, and requeues itself only when `scontrol show job` has a
    PreemptTime, which an interruption never sets; so it would exit and end COMPLETED (or
    FAILED with 143), its work unfinished. Requeueing first makes slurmctld put the job
    back in the queue whatever its steps then do, and slurmd delivers SIGTERM to every
    step of it at once, SIGKILL KillWait later (30 s in the pool's slurm.conf): the
    checkpoint is taken well inside the two-minute warning, and the job can start on
    another node at once instead of after the instance is gone and slurmctld notices.
    Jobs Slurm will not requeue (submitted --no-requeue, or not batch jobs) get the
    SIGTERM alone (to their steps, not the batch shell), so they can at least save before
    the instance goes.
    """
    for job in jobs:
        out = _run(["scontrol", "requeue", job])
        if out.returncode == 0:
            log.info("requeued job %s", job)
            continue
        log.warning("job %s not requeued (%s): signalling it to save", job,
                    out.stderr.strip())
        signalled = _run(["scancel", "--signal=TERM", job])
        if signalled.returncode:
            log.error("signal job %s: %s", job, signalled.stderr.strip())


class Watcher:
    """Polls IMDS for one node and acts once on each notice."""

    def __init__(self, node: str, imds: Imds) -> None:
        if not NODE_NAME.fullmatch(node):
            raise ValueError(f"node name {node!r} does not match {NODE_NAME.pattern}")
        self.node, self.imds = node, imds
        self.acted: set[Notice] = set()
        self.placement: tuple[str, str] | None = None

    def _placement(self) -> tuple[str, str]:
        # Asked on the first notice only: a node without one never needs them, and they
        # do not change for the life of the instance.
        if self.placement is None:
            self.placement = (
                _valid(INSTANCE_TYPE, self.imds.get(INSTANCE_TYPE_PATH), "instance-type"),
                _valid(ZONE, self.imds.get(ZONE_PATH), "availability-zone"))
        return self.placement

    def poll(self) -> bool:
        """One look at IMDS, acting on what is new; True once the node was interrupted."""
        for notice in notices(self.imds):
            if notice in self.acted:
                continue
            reason = notice.reason(*self._placement())
            log.warning("%s: %s", self.node, reason)
            # Drain first, so nothing new starts here while the running jobs leave.
            if not drain(self.node, reason):
                continue  # not recorded as acted on: the next poll tries again
            self.acted.add(notice)
            if notice.kind == "interruption":
                requeue_jobs(jobs_on(self.node))
        return any(n.kind == "interruption" for n in self.acted)

    def run(self, interval_s: float, *, once: bool = False,
            sleep: Callable[[float], None] = time.sleep) -> int:
        """Poll until interrupted (0) or IMDS failed MAX_FAILURES times in a row (1)."""
        failures = 0
        while True:
            try:
                if self.poll():
                    return 0
                failures = 0
            except ImdsError as e:
                failures += 1
                log.error("IMDS failed (%d of %d): %s", failures, MAX_FAILURES, e)
                if once or failures >= MAX_FAILURES:
                    return 1
            if once:
                return 0
            sleep(interval_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", required=True, help="this node's Slurm name")
    parser.add_argument("--imds", default=IMDS_BASE, help="IMDS base URL")
    parser.add_argument("--interval", type=float, default=INTERVAL_S,
                        help="seconds between polls (at most 60)")
    parser.add_argument("--once", action="store_true", help="poll once and exit")
    args = parser.parse_args(argv)
    if not 0.05 <= args.interval <= 60:
        parser.error("--interval must be between 0.05 and 60 seconds")
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(levelname)s %(message)s")
    try:
        watcher = Watcher(args.node, Imds(args.imds))
    except ValueError as e:
        parser.error(str(e))
    return watcher.run(args.interval, once=args.once)


if __name__ == "__main__":
    sys.exit(main())
