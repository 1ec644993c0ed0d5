"""Failure drill figures on the lab's real Slurm with the reference training job: per drill
whether it passed, its checks, the result's parity with an uninterrupted run, where the job
(re)started, and the drill's own measurements (time to resume, steps lost, ...).

tests/integration/test_drills.py runs every drill (gpupool.exercise.drills) and writes
bench/results/drills.json; this runs it.

    python -m bench drills
"""

from __future__ import annotations

import sys

import bench

TEST = "tests/integration/test_drills.py"
SHAPE = {str: {"passed": bool, "drill_s": float, "checks": {str: bool}, "result_parity": bool,
               "starts_at_steps": [int], "restarts": int,
               "result": ({"loss": float, "step": int, "weights_sha256": str}, None),
               ...: (float, str, bool, None)}}


def main() -> int:
    return bench.run_tests(TEST)


if __name__ == "__main__":
    sys.exit(main())
