#!/usr/bin/env python3
"""The reference training job: small, deterministic, CPU-only, standard library only.

It follows gpupool's job convention (runbooks/job-convention.md), which any team's
training script can adopt:

- GPUPOOL_CKPT_DIR     where checkpoints go (default: /checkpoints/<team>/<job name>)
- GPUPOOL_CKPT_EVERY   steps between checkpoints (the most work a failure can cost)
- GPUPOOL_STEPS        total steps; GPUPOOL_STEP_SECONDS simulated compute per step
- Checkpoints are `ckpt-<step>.json`, written to a temporary file, fsynced, renamed into
  place, and carry a SHA-256 of their payload. The newest valid one is resumed from; a
  corrupt or truncated one is skipped in favour of the one before.
- On SIGTERM (Slurm's preemption or shutdown signal, sent GraceTime before the kill)
  the job saves a checkpoint at once and exits 143, so a requeue loses nothing.
- A checkpoint that cannot be written (storage briefly unavailable) is reported and
  tried again at the next interval; the previous checkpoints stay valid meanwhile.
- When done it writes result.json (final step, loss and a digest of the weights) and
  exits 0. Same seed and steps give the same result however often it was interrupted.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

EXIT_PREEMPTED = 143  # 128 + SIGTERM: "saved, requeue me"
EXIT_STORAGE = 75  # EX_TEMPFAIL: storage stayed away; the last good checkpoint stands
KEEP = 3  # checkpoints kept: a corrupt newest one still leaves a fallback
DIM = 16


def _batch(seed: int, step: int) -> list[tuple[list[float], float]]:
    # Data for a step depends only on (seed, step): resuming replays exactly.
    rng = random.Random(seed * 1_000_003 + step)  # noqa: S311 - synthetic data, not crypto
    truth = [((i % 5) - 2) / 2 for i in range(DIM)]
    batch = []
    for _ in range(8):
        x = [rng.uniform(-1, 1) for _ in range(DIM)]
        batch.append((x, sum(a * b for a, b in zip(truth, x, strict=True))))
    return batch


def train_step(weights: list[float], seed: int, step: int, lr: float = 0.05) -> float:
    grad = [0.0] * DIM
    loss = 0.0
    for x, y in _batch(seed, step):
        err = sum(w * xi for w, xi in zip(weights, x, strict=True)) - y
        loss += err * err
        for i, xi in enumerate(x):
            grad[i] += 2 * err * xi
    for i in range(DIM):
        weights[i] -= lr * grad[i] / 8
    return loss / 8


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def save(ckpt_dir: Path, step: int, weights: list[float], loss: float) -> Path:
    payload = {"step": step, "weights": weights, "loss": loss, "saved_at": time.time()}
    final = ckpt_dir / f"ckpt-{step:08d}.json"
    tmp = ckpt_dir / f".{final.name}.tmp"
    with tmp.open("w") as fh:
        json.dump({"payload": payload, "sha256": _digest(payload)}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(final)
    dir_fd = os.open(ckpt_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself must survive a crash
    finally:
        os.close(dir_fd)
    for old in sorted(ckpt_dir.glob("ckpt-*.json"))[:-KEEP]:
        old.unlink(missing_ok=True)
    return final


def try_save(ckpt_dir: Path, step: int, weights: list[float], loss: float) -> bool:
    try:
        save(ckpt_dir, step, weights, loss)
    except OSError as exc:
        log(f"checkpoint at step {step} failed ({exc.strerror}); retrying at the next one")
        return False
    log(f"checkpoint step {step}")
    return True


def load_latest(ckpt_dir: Path) -> dict[str, Any] | None:
    """The newest checkpoint whose checksum holds; corrupt ones are reported and skipped."""
    for path in sorted(ckpt_dir.glob("ckpt-*.json"), reverse=True):
        try:
            doc = json.loads(path.read_text())
            if doc["sha256"] == _digest(doc["payload"]):
                return dict(doc["payload"])
        except (ValueError, KeyError, OSError):
            pass
        log(f"skipping corrupt checkpoint {path.name}")
    return None


def log(msg: str) -> None:
    print(f"[reference-train] {msg}", flush=True)


def _default_dir() -> Path:
    team = os.environ.get("SLURM_JOB_ACCOUNT", "default")
    name = os.environ.get("SLURM_JOB_NAME", "reference")
    return Path("/checkpoints") / team / name


def main() -> int:
    ckpt_dir = Path(os.environ.get("GPUPOOL_CKPT_DIR") or _default_dir())
    every = int(os.environ.get("GPUPOOL_CKPT_EVERY", "10"))
    steps = int(os.environ.get("GPUPOOL_STEPS", "100"))
    step_s = float(os.environ.get("GPUPOOL_STEP_SECONDS", "0"))
    seed = int(os.environ.get("GPUPOOL_SEED", "7"))
    ckpt_dir.mkdir(parents=True, exist_ok=True)

    stop = {"requested": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(requested=True))

    state = load_latest(ckpt_dir)
    step = state["step"] if state else 0
    weights = state["weights"] if state else [0.0] * DIM
    loss = state["loss"] if state else float("nan")
    log(f"start at step {step} of {steps} (restart {os.environ.get('SLURM_RESTART_COUNT', '0')})")
    while step < steps:
        if stop["requested"]:
            try_save(ckpt_dir, step, weights, loss)
            log(f"preempted at step {step}, exiting {EXIT_PREEMPTED}")
            return EXIT_PREEMPTED
        loss = train_step(weights, seed, step)
        step += 1
        if step % every == 0:
            try_save(ckpt_dir, step, weights, loss)
        if step_s:
            time.sleep(step_s)
    # The final checkpoint and the result must land: wait for storage, boundedly.
    deadline = time.monotonic() + float(os.environ.get("GPUPOOL_STORAGE_WAIT_S", "300"))
    while not try_save(ckpt_dir, step, weights, loss):
        if time.monotonic() > deadline:
            log("storage did not come back; exiting so the job can be requeued")
            return EXIT_STORAGE
        time.sleep(1)
    result = {"step": step, "loss": round(loss, 12),
              "weights_sha256": hashlib.sha256(json.dumps(weights).encode()).hexdigest()}
    (ckpt_dir / "result.json").write_text(json.dumps(result) + "\n")
    log(f"done: {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
