"""Failure drills on the lab's real Slurm, with the reference training job.

Each drill interrupts the reference job the way production does (preemption, a node
dying, the controller restarting, checkpoint storage going away, a node failing its
health check, checkpoints restored from the archive tier) and measures what it cost:
time to resume, steps lost, and whether the result equals an uninterrupted run's
(computed here, on this machine, by the same deterministic job).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from gpupool.exercise.context import Context
from gpupool.lab import hosts
from gpupool.lab.slurm_cluster import SlurmLab, SlurmLabError, onprem_nodes, playbook, wait_for
from gpupool.spec.model import Description, Purpose

STEPS = 120
EVERY = 10
# The whole job: 30 s of "training"; every drill waits for events (checkpoints, states),
# never for a time, so a busy machine stretches a drill but does not break it.
STEP_S = 0.25
JOB_TIMEOUT_S = 240
Drill = Callable[["Context"], dict[str, Any]]
DRILLS: dict[str, Drill] = {}


def drill(name: str) -> Callable[[Drill], Drill]:
    def register(fn: Drill) -> Drill:
        DRILLS[name] = fn
        return fn

    return register


def convention_step(command: str) -> str:
    """The lines of a batch script that run `command` (no single quotes) as the job
    convention says (runbooks/job-convention.md): in a job step whose shell traps SIGTERM,
    lets the command save, and hands a preempted job back to the queue at once
    (PreemptTime set), which frees its GPUs without waiting for GraceTime; a cancelled job
    just ends. Slurm 22.05 sends a preemption's SIGTERM to the job's steps, not to its batch
    shell: a trap there fires only at the kill, GraceTime later (measured on the lab).

    The step's trap is set before the command starts. A step the signal ends before its
    trap is set (a job preempted just as it starts) exits 143, and the batch shell, which
    the signal did not reach, hands the job back instead: otherwise it ends FAILED (a
    saturated replay once ended with 1 job of 24 failed, which this window explains; the
    job's state was not kept)."""
    requeue = ("scontrol show job $SLURM_JOB_ID | grep -q PreemptTime=None"
               " || scontrol requeue $SLURM_JOB_ID")
    # In the trap's double quotes, \\$ defers each expansion to when the trap runs.
    deferred = requeue.replace("$", "\\$")
    return f"""srun bash -c 'trap "kill -TERM \\$pid 2>/dev/null; wait; {deferred}; exit 0" TERM
{command} & pid=$!
wait $pid' || {{ rc=$?; {requeue}; exit $rc; }}
"""


def job_script(ctx: Context, name: str, steps: int = STEPS) -> str:
    """The batch script of the reference job, following the job convention."""
    ckpt = f"{ctx.root}/{ctx.team}/{name}"
    return f"""#!/bin/bash
export GPUPOOL_CKPT_DIR={ckpt} GPUPOOL_STEPS={steps} GPUPOOL_CKPT_EVERY={EVERY}
export GPUPOOL_STEP_SECONDS={STEP_S} GPUPOOL_STORAGE_WAIT_S=60
""" + convention_step(f"python3 -u {ctx.root}/.gpupool/reference_train.py")


def install_job(ctx: Context) -> None:
    code = resources.files("gpupool.onhost").joinpath("reference_train.py").read_text()
    ctx.slurm.write(f"{ctx.root}/.gpupool/reference_train.py", code)
    ctx.slurm.sh(f"mkdir -p {ctx.root}/.gpupool/logs {ctx.root}/{ctx.team}")


def reference_result(steps: int = STEPS) -> dict[str, Any]:
    """The uninterrupted run, on this machine."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GPUPOOL_CKPT_DIR": tmp, "GPUPOOL_STEPS": str(steps),
               "GPUPOOL_CKPT_EVERY": str(EVERY), "GPUPOOL_STEP_SECONDS": "0"}
        module = resources.files("gpupool.onhost").joinpath("reference_train.py")
        subprocess.run([sys.executable, str(module)], env=env, check=True,
                       capture_output=True, timeout=60)
        return json.loads((Path(tmp) / "result.json").read_text())


def submit(ctx: Context, name: str, task_class: str, *extra: str, fresh: bool = True,
           steps: int = STEPS) -> str:
    if fresh:
        ctx.slurm.sh(f"rm -rf {ctx.root}/{ctx.team}/{name}")
    return ctx.slurm.sbatch(
        f"-p {task_class}", f"-A {ctx.team}", f"-J {name}", "--requeue", "-C onprem",
        f"-o {ctx.root}/.gpupool/logs/{name}-%j.out", "--open-mode=append", *extra,
        script=job_script(ctx, name, steps))


def log(ctx: Context, name: str, jid: str) -> str:
    return ctx.slurm.sh(f"cat {ctx.root}/.gpupool/logs/{name}-{jid}.out 2>/dev/null; true")


def result(ctx: Context, name: str) -> dict[str, Any] | None:
    text = ctx.slurm.sh(f"cat {ctx.root}/{ctx.team}/{name}/result.json 2>/dev/null; true")
    return json.loads(text) if text.strip() else None


def checkpoints(ctx: Context, name: str) -> int:
    out = ctx.slurm.sh(f"ls {ctx.root}/{ctx.team}/{name}/ 2>/dev/null | grep -c '^ckpt-'; true")
    return int(out.strip() or 0)


def starts(text: str) -> list[int]:
    return [int(s) for s in re.findall(r"start at step (\d+)", text)]


def node_of(ctx: Context, jid: str) -> str:
    return wait_for(f"job {jid} on a node", lambda: (
        (n := ctx.slurm.job(jid).get("NodeList", "(null)")) != "(null)" and n), 60)


def finish(ctx: Context, name: str, jid: str, steps: int = STEPS) -> dict[str, Any]:
    wait_for(f"{name} completed", lambda: ctx.slurm.state(jid) == "COMPLETED",
             JOB_TIMEOUT_S * steps / STEPS)
    text = log(ctx, name, jid)
    got = result(ctx, name)
    return {"result_parity": got == reference_result(steps), "starts_at_steps": starts(text),
            "restarts": int(ctx.slurm.job(jid).get("Restarts", 0)), "result": got}


def _last_step(text: str) -> int:
    steps = re.findall(r"checkpoint step (\d+)", text)
    return int(steps[-1]) if steps else 0


@drill("preemption")
def preemption(ctx: Context) -> dict[str, Any]:
    """An urgent job evicts the reference job on a full pool; it is requeued, resumes from
    the checkpoint it saved on the signal, and ends with the uninterrupted result."""
    top, _, low = ctx.classes()
    gpus = ctx.gpus_per_node()
    name = "drill-preemption"
    jid = submit(ctx, name, low, f"--gpus={gpus}")
    node = node_of(ctx, jid)
    fillers = [ctx.slurm.sbatch(f"-p {low}", f"-A {ctx.team}", f"--gpus={gpus}", "-C onprem",
                                f"-x {node}", script="#!/bin/bash\nsleep 40\n")
               for _ in onprem_nodes(ctx.desc)[1:]]
    wait_for("the reference job checkpointing", lambda: checkpoints(ctx, name) >= 1, 60)
    t0 = time.monotonic()
    urgent = ctx.slurm.sbatch(f"-p {top}", f"-A {ctx.team}", f"--gpus={gpus}", f"-w {node}",
                              script="#!/bin/bash\nsleep 5\n")
    wait_for("the urgent job running", lambda: ctx.slurm.state(urgent) in (
        "RUNNING", "COMPLETED"), 60)
    preempt_s = time.monotonic() - t0
    wait_for("the reference job requeued", lambda: len(starts(log(ctx, name, jid))) >= 2
             or ctx.slurm.state(jid) == "PENDING", 60)
    wait_for("the reference job running again", lambda: len(starts(log(ctx, name, jid))) >= 2,
             120)
    resume_s = time.monotonic() - t0
    text = log(ctx, name, jid)
    saved = [int(s) for s in re.findall(r"preempted at step (\d+)", text)]
    out = finish(ctx, name, jid)
    for f in fillers:
        ctx.slurm.sh(f"scancel {f}; true")
    resumed = out["starts_at_steps"][1]
    lost = (saved[0] - resumed) if saved else None
    return {"urgent_start_s": round(preempt_s, 2), "time_to_resume_s": round(resume_s, 2),
            "saved_at_step": saved[0] if saved else None, "resumed_at_step": resumed,
            "steps_lost": lost, "checkpoint_interval_steps": EVERY,
            "checks": {"saved_on_the_signal": bool(saved), "no_step_lost": lost == 0,
                       "requeued_and_resumed": out["restarts"] >= 1}, **out}


@drill("node-failure")
def node_failure(ctx: Context) -> dict[str, Any]:
    """The node running the reference job dies mid-run; Slurm requeues the job onto
    another node, where it resumes from its last checkpoint."""
    _, mid, _ = ctx.classes()
    name = "drill-node-failure"
    jid = submit(ctx, name, mid, "--gpus=1")
    node = node_of(ctx, jid)
    wait_for("two checkpoints", lambda: checkpoints(ctx, name) >= 2, 90)
    reached = _last_step(log(ctx, name, jid))
    t0 = time.monotonic()
    hosts.podman("kill", hosts.container_name(ctx.desc, node))
    try:
        wait_for("the job running on another node", lambda: (
            len(starts(log(ctx, name, jid))) >= 2
            and ctx.slurm.job(jid).get("NodeList") not in (node, "(null)")), 120)
        resume_s = time.monotonic() - t0
        out = finish(ctx, name, jid)
    finally:
        hosts.podman("start", hosts.container_name(ctx.desc, node))
        wait_for(f"{node} back", lambda: ctx.slurm.node_states().get(node) == "idle", 120)
    resumed = out["starts_at_steps"][1]
    # Steps done after the last checkpoint before the kill were redone: at most EVERY.
    return {"failed_node": node, "time_to_resume_s": round(resume_s, 2),
            "last_checkpoint_before_failure": reached, "resumed_at_step": resumed,
            "steps_lost_max": EVERY, "steps_redone_at_most": EVERY,
            "checkpoint_interval_steps": EVERY,
            "checks": {"lost_at_most_one_interval": resumed >= reached}, **out}


@drill("controller-restart")
def controller_restart(ctx: Context) -> dict[str, Any]:
    """slurmctld restarts mid-run: the job keeps running, is neither lost nor run twice."""
    _, mid, _ = ctx.classes()
    name = "drill-controller-restart"
    jid = submit(ctx, name, mid, "--gpus=1")
    wait_for("a checkpoint", lambda: checkpoints(ctx, name) >= 1, 60)
    t0 = time.monotonic()
    ctx.slurm.sh("systemctl restart slurmctld")
    wait_for("slurmctld answering", lambda: ctx.slurm.sh("scontrol ping", check=False)
             .count("UP") >= 1, 60)
    back_s = time.monotonic() - t0
    state_after = ctx.slurm.state(jid)
    out = finish(ctx, name, jid)
    return {"controller_back_s": round(back_s, 2), "job_state_after_restart": state_after,
            "checks": {"kept_running": state_after in ("RUNNING", "COMPLETING", "COMPLETED"),
                       "ran_once": out["starts_at_steps"] == [0] and out["restarts"] == 0},
            **out}


@drill("storage-outage")
def storage_outage(ctx: Context) -> dict[str, Any]:
    """The job's checkpoint directory disappears for a few seconds (as an NFS server
    restart looks to a client): saves fail and are retried, nothing is corrupted."""
    _, mid, _ = ctx.classes()
    name = "drill-storage-outage"
    real = f"{ctx.root}/.gpupool/store/{name}"
    link = f"{ctx.root}/{ctx.team}/{name}"
    ctx.slurm.sh(f"rm -rf {real} {link} && mkdir -p {real} && ln -sfn {real} {link}")
    jid = submit(ctx, name, mid, "--gpus=1", fresh=False)
    wait_for("a checkpoint", lambda: checkpoints(ctx, name) >= 1, 60)
    outage_s = 3 * EVERY * STEP_S  # spans at least two checkpoint attempts
    ctx.slurm.sh(f"ln -sfn {ctx.root}/.gpupool/gone {link}")
    time.sleep(outage_s)
    ctx.slurm.sh(f"ln -sfn {real} {link}")
    out = finish(ctx, name, jid)
    text = log(ctx, name, jid)
    return {"outage_s": outage_s, "failed_saves": text.count("failed ("),
            "checks": {"saves_failed_during_outage": text.count("failed (") >= 1,
                       "job_kept_running": out["restarts"] == 0}, **out}


# What the health-check drill breaks: a time sync service stopped and disabled, which the
# quick tier's system.time_sync check catches (and the repair undoes).
BREAK = "systemctl disable --now chrony"
REPAIR = "systemctl enable chrony"


def health_check_round(ctx: Context) -> dict[str, str]:
    """One run of the periodic health check (playbooks/health.yml); node -> Slurm state."""
    proc = playbook(ctx.desc, "health.yml")
    if proc.returncode != 0:
        raise SlurmLabError(f"health.yml failed:\n{proc.stdout[-3000:]}")
    return ctx.slurm.node_states()


@drill("health-check")
def health_check(ctx: Context) -> dict[str, Any]:
    """A node starts failing its health check: the periodic gate drains it and requeues
    its work, which resumes elsewhere; the node returns only once the gate passes it."""
    _, mid, _ = ctx.classes()
    name = "drill-health-check"
    steps = 3 * STEPS  # outlasts a gate round on a busy machine
    jid = submit(ctx, name, mid, "--gpus=1", steps=steps)
    node = node_of(ctx, jid)
    wait_for("a checkpoint", lambda: checkpoints(ctx, name) >= 1, 60)
    ctx.slurm.sh(BREAK, node=node)
    try:
        t0 = time.monotonic()
        states = health_check_round(ctx)
        drain_s = time.monotonic() - t0
        reason = ctx.slurm.sh(f"sinfo -h -n {node} -o %E").strip()
        wait_for("the job running elsewhere", lambda: len(starts(log(ctx, name, jid))) >= 2
                 and ctx.slurm.job(jid).get("NodeList") not in (node, "(null)"), 120)
        moved_s = time.monotonic() - t0
    finally:
        ctx.slurm.sh(REPAIR, node=node)
        back = health_check_round(ctx)  # the repaired node passes and comes back
    out = finish(ctx, name, jid, steps)
    return {"node": node, "state_while_failing": states.get(node), "drain_reason": reason,
            "health_check_s": round(drain_s, 2), "time_to_resume_s": round(moved_s, 2),
            "state_after_repair_and_gate": back.get(node),
            "checks": {"drained": "drain" in (states.get(node) or ""),
                       "reason_names_the_check": "system.time_sync" in reason,
                       "back_after_gate": (back.get(node) or "").rstrip("*") in (
                           "idle", "mixed", "allocated")}, **out}


@drill("disaster-recovery")
def disaster_recovery(ctx: Context) -> dict[str, Any]:
    """Checkpoints are lost on the hot tier; the newest one is restored from the archive
    tier (S3, a local endpoint in the lab) and training resumes with metric parity."""
    from gpupool.exercise import archive  # noqa: PLC0415 - boto3 and a local endpoint
    from gpupool.lab import localaws  # noqa: PLC0415 - boto3 and a local endpoint

    _, mid, _ = ctx.classes()
    name = "drill-disaster-recovery"
    jid = submit(ctx, name, mid, "--gpus=1")
    wait_for("three checkpoints", lambda: checkpoints(ctx, name) >= 3, 90)
    # Stop it for good: requeue it held (it saves on the signal), then cancel it pending.
    ctx.slurm.sh(f"scontrol requeuehold {jid}")
    wait_for("the job held", lambda: ctx.slurm.state(jid) == "PENDING", 60)
    ctx.slurm.sh(f"scancel {jid}")
    wait_for("the job gone", lambda: ctx.slurm.state(jid) == "CANCELLED", 60)
    with localaws.endpoint() as endpoint:
        src = hosts.lab_dir(ctx.desc) / "storage"
        tier = next(n for n, t in ctx.desc.storage_tiers.items()
                    if t.purpose is Purpose.CHECKPOINTS)
        job_dir = src / tier / ctx.team / name
        t0 = time.monotonic()
        archived = archive.archive_job(ctx.desc, endpoint, job_dir, f"{ctx.team}/{name}")
        ctx.slurm.sh(f"rm -rf {ctx.root}/{ctx.team}/{name}")  # the hot tier loses it
        restored = archive.restore_newest(ctx.desc, endpoint, f"{ctx.team}/{name}", job_dir)
        restore_s = time.monotonic() - t0
    jid2 = submit(ctx, name, mid, "--gpus=1", fresh=False)
    out = finish(ctx, name, jid2)
    return {"archived_checkpoints": archived, "restored": restored,
            "restore_s": round(restore_s, 2), "resumed_at_step": out["starts_at_steps"][0],
            "checks": {"resumed_from_the_archive": out["starts_at_steps"][0] > 0}, **out}


def run(desc: Description, slurm_lab: SlurmLab, names: list[str]) -> dict[str, Any]:
    ctx = Context(desc, slurm_lab)
    install_job(ctx)
    report: dict[str, Any] = {}
    for name in names:
        t0 = time.monotonic()
        try:
            figures = DRILLS[name](ctx)
            figures["passed"] = bool(figures.get("result_parity")) and all(
                figures["checks"].values())
        finally:
            slurm_lab.cancel_all()
        figures["drill_s"] = round(time.monotonic() - t0, 1)
        report[name] = figures
    return report
