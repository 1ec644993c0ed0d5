"""The reference training job: checkpoints, preemption signal, resume and fallback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpupool.onhost import reference_train

SCRIPT = Path(reference_train.__file__)
WAIT_S = 30


def _env(ckpt: Path, steps: int = 60, every: int = 5, step_s: float = 0.0) -> dict[str, str]:
    return {**os.environ, "GPUPOOL_CKPT_DIR": str(ckpt), "GPUPOOL_STEPS": str(steps),
            "GPUPOOL_CKPT_EVERY": str(every), "GPUPOOL_STEP_SECONDS": str(step_s)}


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True,
                          text=True, timeout=WAIT_S, check=False)


def _start_and_wait_for(env: dict[str, str], ckpt: Path, n_ckpts: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, str(SCRIPT)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + WAIT_S
    while len(list(ckpt.glob("ckpt-*.json"))) < n_ckpts:
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail("the job made no checkpoints in time")
        time.sleep(0.02)
    return proc


@pytest.fixture
def reference_result(tmp_path: Path) -> dict:
    ckpt = tmp_path / "uninterrupted"
    assert _run(_env(ckpt)).returncode == 0
    return json.loads((ckpt / "result.json").read_text())


def test_preemption_saves_and_resumes_to_identical_result(
        tmp_path: Path, reference_result: dict) -> None:
    ckpt = tmp_path / "preempted"
    env = _env(ckpt, step_s=0.01)
    proc = _start_and_wait_for(env, ckpt, 2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == reference_train.EXIT_PREEMPTED, out
    saved = reference_train.load_latest(ckpt)
    assert saved is not None and 0 < saved["step"] < 60
    resumed = _run(env)
    assert resumed.returncode == 0
    assert f"start at step {saved['step']}" in resumed.stdout
    assert json.loads((ckpt / "result.json").read_text()) == reference_result


def test_crash_loses_at_most_one_interval_and_skips_corrupt_checkpoint(
        tmp_path: Path, reference_result: dict) -> None:
    ckpt = tmp_path / "crashed"
    env = _env(ckpt, step_s=0.01)
    proc = _start_and_wait_for(env, ckpt, 3)
    proc.kill()  # no chance to save: a node failure
    proc.communicate(timeout=WAIT_S)
    newest = sorted(ckpt.glob("ckpt-*.json"))[-1]
    previous = sorted(ckpt.glob("ckpt-*.json"))[-2]
    newest.write_text(newest.read_text()[:-20])  # truncated by the crash
    resumed = _run(env)
    assert resumed.returncode == 0
    assert f"skipping corrupt checkpoint {newest.name}" in resumed.stdout
    prev_step = int(previous.stem.split("-")[1])
    assert f"start at step {prev_step}" in resumed.stdout
    assert json.loads((ckpt / "result.json").read_text()) == reference_result


def test_checkpoints_are_atomic_and_bounded(tmp_path: Path) -> None:
    ckpt = tmp_path / "c"
    assert _run(_env(ckpt, steps=40, every=5)).returncode == 0
    names = sorted(p.name for p in ckpt.iterdir())
    assert names == ["ckpt-00000030.json", "ckpt-00000035.json", "ckpt-00000040.json",
                     "result.json"]  # no temporary files left, only KEEP checkpoints


def test_storage_outage_neither_crashes_nor_corrupts(
        tmp_path: Path, reference_result: dict) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "ckpt"
    link.symlink_to(real)
    env = _env(link, step_s=0.01)
    proc = _start_and_wait_for(env, real, 2)
    link.unlink()  # the file system goes away under the job
    link.symlink_to(tmp_path / "gone")
    time.sleep(0.15)
    link.unlink()
    link.symlink_to(real)  # and comes back
    out, _ = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, out
    assert "failed" in out and "retrying at the next one" in out
    for ckpt in real.glob("ckpt-*.json"):
        assert reference_train.load_latest(ckpt.parent) is not None
    assert json.loads((real / "result.json").read_text()) == reference_result
