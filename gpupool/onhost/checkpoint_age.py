"""Checkpoint age of the batch jobs running on this node, written for node_exporter's
textfile collector: the `gpupool_checkpoint_age_seconds` series the CheckpointStale alert
(monitoring/rules) reads.

Why on the node: the checkpoint tier is mounted on compute nodes, not on the controller,
and each team's directory is closed to everyone but the team (mode 2770), so neither the
scheduler exporter nor node_exporter can read it. A root oneshot on each compute node, run
by a timer (role storage), can; it puts no load on slurmctld: the jobs come from the node's
own slurmd (`scontrol listpids`), and only the node running a job's batch script reports
it, so every job has one series.

Which directory: the job convention's (runbooks/job-convention.md, and
gpupool/onhost/reference_train.py): `GPUPOOL_CKPT_DIR` when the job sets it, otherwise
`<tier>/<SLURM_JOB_ACCOUNT>/<SLURM_JOB_NAME>`, read from the job's processes' environment
(only those three variables are kept). A directory that resolves outside the tier
(`..`, a symbolic link) is refused and the convention's is used: the collector runs as
root and must not be pointed at the rest of the file system.

What is measured: seconds since the newest change in that directory: its own mtime (a file
renamed into it) and its entries' (a checkpoint written as a subdirectory), without
following links, at most MAX_ENTRIES entries. A job with no checkpoint yet is as old as
its batch step's first process: a training job that never checkpoints alerts too.

Series (labels):
- gpupool_checkpoint_age_seconds{job_id, team}
- gpupool_checkpoint_age_up: 0 when slurmd did not answer (the file then holds no job, so
  nothing stale is served; alert CheckpointAgeNotMeasured)
- gpupool_checkpoint_age_unanswered_steps: steps with a socket in slurmd's spool directory
  whose slurmstepd did not answer. A step killed outright (its node's container or cgroup
  killed, an OOM kill of slurmstepd) leaves its socket behind; scontrol then exits 1 but
  still lists every other step, so those jobs are measured. Slurm removes such a socket only
  when a root Slurm process (slurmd, scontrol) outside this sandbox finds it refused and
  ten minutes old: the collector, read-only, never does, and counts it here instead.

    python3 checkpoint_age.py --tier /checkpoints \
        --output /var/lib/prometheus/node-exporter/gpupool_checkpoint_age.prom

This file runs on the node with the system python3 and prometheus_client (Debian's
python3-prometheus-client) only, like the other gpupool/onhost programs: it is copied to
the node as is, with prom_textfile.py beside it (the textfile is written without following
links: a root program must not write through a link planted in node_exporter's directory).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, generate_latest

# Root writes into node_exporter's directory without following a planted link (see there).
try:  # in the package: the tests, the lab's control host
    from gpupool.onhost import prom_textfile
except ImportError:  # on the node, where role storage copies it beside this file
    import prom_textfile  # type: ignore[no-redef]

log = logging.getLogger("gpupool-checkpoint-age")

LISTPIDS = ["scontrol", "listpids"]
# What slurmd answers (exit 1) when the node runs no job: an empty list, not an error.
NO_STEPS = "No job steps exist on this node"
# What scontrol prints for one step it could not ask (Slurm's _list_pids_one_step): a socket
# whose slurmstepd is gone ("Unable to connect to slurmstepd: Connection refused"), or a step
# that ended between the listing and the question ("StepId=8.0 does not exist on this node.",
# "Job step 8.0 ..." before 20.11). It goes on with the other steps and exits 1 at the end.
STEP_UNANSWERED = re.compile(r"Unable to connect to slurmstepd\b.*|.{1,200} does not exist "
                             r"on this node\.")
COMMAND_TIMEOUT_S = 10.0
MAX_ENTRIES = 10_000  # directory entries looked at per job: the cost of one run is bounded
MAX_PIDS = 64  # processes of a job whose environment is read
MAX_ENVIRON = 1 << 20  # bytes of one process's environment
WANTED = ("SLURM_JOB_ACCOUNT", "SLURM_JOB_NAME", "GPUPOOL_CKPT_DIR")
JOB_ID_RE = re.compile(r"[0-9]{1,20}(_[0-9]{1,20})?")
# A Slurm account as gpupool names teams, and a job name as a single path component.
TEAM_RE = re.compile(r"[a-z][a-z0-9_-]{0,63}")
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")

class SlurmdUnavailable(RuntimeError):
    """scontrol listpids failed or timed out."""


@dataclass(frozen=True)
class Listing:
    """What `scontrol listpids` printed: its table, and how many steps did not answer."""
    table: str
    unanswered: int = 0


Run = Callable[[list[str]], Listing]


@dataclass(frozen=True)
class Job:
    job_id: str
    pids: tuple[int, ...]


def run_command(argv: list[str]) -> Listing:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmdUnavailable(f"{argv[0]}: {exc}") from exc
    return read_listing(" ".join(argv), proc.returncode, proc.stdout, proc.stderr)


def read_listing(command: str, returncode: int, stdout: str, stderr: str) -> Listing:
    """The table of a `scontrol listpids` run. Exit 1 with only per-step complaints on
    stderr is a whole table for every step that answered; anything else on stderr means
    slurmd itself could not be asked."""
    if returncode == 0:
        return Listing(stdout)
    if NO_STEPS in stderr + stdout:
        return Listing("")
    complaints = [line.strip() for line in stderr.splitlines() if line.strip()]
    if complaints and all(STEP_UNANSWERED.fullmatch(line) for line in complaints):
        log.warning("%d step(s) listed by slurmd did not answer: %s", len(complaints),
                    "; ".join(complaints)[:300])
        return Listing(stdout, len(complaints))
    raise SlurmdUnavailable(f"{command}: exit {returncode}: {stderr.strip()[:200]}")


def batch_jobs(listpids: str) -> list[Job]:
    """The jobs whose batch step runs here, from `scontrol listpids`
    (`PID JOBID STEPID LOCALID GLOBALID`), with their processes. Lines that do not parse
    (the header, another version's extra columns) are skipped."""
    pids: dict[str, list[int]] = {}
    for line in listpids.splitlines():
        fields = line.split()
        if len(fields) < 3 or not fields[0].isdigit() or fields[2] != "batch":
            continue
        if not JOB_ID_RE.fullmatch(fields[1]):
            continue
        pids.setdefault(fields[1], []).append(int(fields[0]))
    return [Job(job, tuple(sorted(p))) for job, p in sorted(pids.items())]


def job_environment(pids: Iterable[int], proc: Path) -> dict[str, str]:
    """The WANTED variables, each from the first of the job's processes that has it."""
    found: dict[str, str] = {}
    for pid in list(pids)[:MAX_PIDS]:
        try:
            with open(proc / str(pid) / "environ", "rb") as f:
                raw = f.read(MAX_ENVIRON)
        except OSError:
            continue  # the process ended, or is not readable: the next one may be
        for item in raw.split(b"\0"):
            key, sep, value = item.partition(b"=")
            name = key.decode("ascii", "replace")
            if sep and name in WANTED and name not in found:
                found[name] = value.decode("utf-8", "replace")
        if len(found) == len(WANTED):
            break
    return found


def checkpoint_dir(env: dict[str, str], tier: Path) -> Path | None:
    """The job's checkpoint directory, resolved and inside the tier, or None when the
    convention's names are missing or not plain names."""
    tier = tier.resolve()
    given = env.get("GPUPOOL_CKPT_DIR", "")
    if given:
        inside = _inside(tier / given, tier)  # an absolute value replaces the tier
        if inside is not None:
            return inside
        log.warning("GPUPOOL_CKPT_DIR %r is outside the checkpoint tier %s: the job "
                    "convention's directory is used", given[:200], tier)
    team, name = env.get("SLURM_JOB_ACCOUNT", ""), env.get("SLURM_JOB_NAME", "")
    if not (TEAM_RE.fullmatch(team) and NAME_RE.fullmatch(name)) or name in (".", ".."):
        return None
    return _inside(tier / team / name, tier)


def _inside(path: Path, tier: Path) -> Path | None:
    """path with every link and `..` resolved, when that is still inside the tier."""
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError, ValueError):  # a link loop, a NUL byte
        return None
    return resolved if resolved.is_relative_to(tier) else None


def newest_change(directory: Path) -> float | None:
    """The newest mtime of the directory and its entries (links not followed), or None
    when it does not exist or holds nothing."""
    try:
        newest = directory.stat().st_mtime
        seen = 0
        with os.scandir(directory) as entries:
            for entry in entries:
                if seen >= MAX_ENTRIES:
                    break
                seen += 1
                try:
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
                except OSError:
                    continue  # removed while scanned: an older checkpoint being rotated
    except OSError:
        return None
    return newest if seen else None


def process_start(pid: int, proc: Path) -> float | None:
    """When a process started (epoch seconds), from /proc/PID/stat and the boot time."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        boot = next(float(line.split()[1]) for line in (proc / "stat").read_text().splitlines()
                    if line.startswith("btime "))
        # Field 22, counted after the command's closing parenthesis (the name may hold spaces).
        ticks = float(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def team_label(env: dict[str, str]) -> str:
    team = env.get("SLURM_JOB_ACCOUNT", "")
    return team if TEAM_RE.fullmatch(team) else "unknown"


def collect(tier: Path, run: Run = run_command, proc: Path = Path("/proc"),
            now: Callable[[], float] = time.time) -> CollectorRegistry:
    registry = CollectorRegistry()
    up = Gauge("gpupool_checkpoint_age_up", "1 when this node's slurmd listed its jobs",
               registry=registry)
    age = Gauge("gpupool_checkpoint_age_seconds",
                "Seconds since a running batch job's newest checkpoint (or its start, when "
                "it has none yet)", ["job_id", "team"], registry=registry)
    try:
        listing = run(LISTPIDS)
    except SlurmdUnavailable as exc:
        log.error("%s", exc)
        up.set(0)
        return registry  # no count of unanswered steps either: nothing was asked
    up.set(1)
    Gauge("gpupool_checkpoint_age_unanswered_steps",
          "Steps in slurmd's spool directory whose slurmstepd did not answer (a killed "
          "step's socket, or a step ending while listed)",
          registry=registry).set(listing.unanswered)
    jobs = batch_jobs(listing.table)
    for job in jobs:
        env = job_environment(job.pids, proc)
        directory = checkpoint_dir(env, tier)
        changed = newest_change(directory) if directory is not None else None
        if changed is None:
            changed = min(filter(None, (process_start(p, proc) for p in job.pids[:MAX_PIDS])),
                          default=None)
        if changed is None:
            continue  # the job ended while it was looked at
        age.labels(job_id=job.job_id, team=team_label(env)).set(max(0.0, now() - changed))
    return registry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tier", type=Path, required=True,
                        help="mount path of the checkpoint tier")
    parser.add_argument("--output", type=Path, default=None,
                        help="the .prom file to write (atomically); stdout when absent")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    registry = collect(args.tier, run=run_command)
    if args.output is None:
        sys.stdout.write(generate_latest(registry).decode())
        return 0
    try:
        prom_textfile.write(args.output.parent, args.output.name, generate_latest(registry))
    except OSError as exc:  # prom_textfile.Refused too: logged, nothing written
        log.error("cannot write %s: %s", args.output, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
