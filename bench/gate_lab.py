"""Acceptance gate verdicts on the lab, healthy and deliberately broken hosts: per node the
verdict, the failed checks, the gate's duration and its counts.

The integration proofs (tests/integration/test_gate_lab.py) write
bench/results/gate_lab.json as they gate; this runs them.

    python -m bench gate_lab
"""

from __future__ import annotations

import sys

import bench

TEST = "tests/integration/test_gate_lab.py"
SHAPE = {str: {str: {"verdict": str, "failed": [str], "duration_s": float,
                     "counts": {str: int}}}}


def main() -> int:
    return bench.run_tests(TEST)


if __name__ == "__main__":
    sys.exit(main())
