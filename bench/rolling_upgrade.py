"""The rolling driver upgrade on the lab with one node made to fail its gate: how long the
rollout ran before it stopped, every node's Slurm state after it, and the drain reason.

tests/integration/test_rolling_upgrade.py writes bench/results/rolling_upgrade.json; this
runs it.

    python -m bench rolling_upgrade
"""

from __future__ import annotations

import sys

import bench

TEST = "tests/integration/test_rolling_upgrade.py"
SHAPE = {"rollout_s": float, "states": {str: str}, "reason": str}


def main() -> int:
    return bench.run_tests(TEST)


if __name__ == "__main__":
    sys.exit(main())
