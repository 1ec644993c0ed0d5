"""The job convention's batch lines (gpupool.exercise.drills.convention_step), run by bash
against FIXTURE `srun` and `scontrol` stand-ins (no Slurm here; the lab's Slurm proofs and
drills run them for real): a preempted job is handed back to the queue once, whether the
signal finds the step's trap or ends the step before it is set; a job that fails on its
own, or is cancelled, is not."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpupool.exercise.drills import convention_step

# FIXTURE srun: runs the step's command (its last argument) with bash, as srun's task does;
# with SRUN_DIES set, the step ends from SIGTERM before its shell runs a line.
SRUN = """#!/bin/bash
[ -n "$SRUN_DIES" ] && exit 143
exec bash -c "${@: -1}"
"""
# FIXTURE scontrol: `show job` reports PREEMPT_TIME; `requeue` is logged.
SCONTROL = """#!/bin/bash
case "$1" in
  show) echo "JobId=$3 PreemptTime=$PREEMPT_TIME" ;;
  requeue) echo "requeue $2" >> "$LOG" ;;
esac
"""


def _tools(tmp: Path) -> dict[str, str]:
    bin_ = tmp / "bin"
    bin_.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_JOB_ID": "42",
            "LOG": str(tmp / "log")}


def _requeues(tmp: Path) -> list[str]:
    log = tmp / "log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize(("preempt", "requeued"), [("2026-12-05T02:00:00", ["requeue 42"]),
                                                   ("None", [])])
def test_a_step_ended_before_its_trap_is_handed_back_only_when_preempted(
        tmp_path: Path, preempt: str, requeued: list[str]) -> None:
    env = {**_tools(tmp_path), "SRUN_DIES": "1", "PREEMPT_TIME": preempt}
    script = "#!/bin/bash\n" + convention_step("sleep 30")
    done = subprocess.run(["bash", "-c", script], env=env, timeout=30, check=False)
    assert done.returncode == 143  # the step's own status, kept
    assert _requeues(tmp_path) == requeued


@pytest.mark.parametrize(("preempt", "requeued"), [("2026-12-05T02:00:00", ["requeue 42"]),
                                                   ("None", [])])
def test_the_steps_trap_lets_the_work_stop_then_hands_a_preempted_job_back_once(
        tmp_path: Path, preempt: str, requeued: list[str]) -> None:
    env = {**_tools(tmp_path), "PREEMPT_TIME": preempt}
    stopped, trapping = tmp_path / "stopped", tmp_path / "trapping"
    # The work says when its trap is set: a process that merely exists may not have read
    # its first line yet, and a signal then ends it by default (the lab's proofs wait for
    # the same word from their steps).
    work = (f"trap \"touch {stopped}; exit 143\" TERM; touch {trapping}; "
            "while :; do sleep 0.05; done")
    (tmp_path / "work.sh").write_text(work)
    script = "#!/bin/bash\n" + convention_step(f"bash {tmp_path}/work.sh")
    job = subprocess.Popen(["bash", "-c", script], env=env, start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not trapping.exists():
        time.sleep(0.05)
    # Slurm signals the step's processes, not the batch shell: here every bash but the job's.
    steps = subprocess.run(["pgrep", "-s", str(job.pid)], capture_output=True, text=True,
                           check=False).stdout.split()
    for pid in (int(p) for p in steps if int(p) != job.pid):
        with contextlib.suppress(ProcessLookupError):  # a `sleep 0.05` may end meanwhile
            os.kill(pid, signal.SIGTERM)
    assert job.wait(timeout=20) == 0
    assert stopped.exists()
    assert _requeues(tmp_path) == requeued
