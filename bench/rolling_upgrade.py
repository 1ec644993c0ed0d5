"""The rolling NVIDIA stack upgrade on the lab between two real driver builds (Debian 12's
535.309.01 and 535.261.03): the whole pool moved to the other build in one batch, then the
upgrade back to the lock node by node with a job requeued off the canary, then a rollout
whose canary fails its gate and is rolled back.

tests/integration/test_rolling_upgrade.py writes bench/results/rolling_upgrade.json; this
runs it.

    python -m bench rolling_upgrade
"""

from __future__ import annotations

import sys

import bench

TEST = "tests/integration/test_rolling_upgrade.py"
# Seconds of whole playbook runs (every node's drain, install, gate and resume); the job's
# sacct records in order; where and why the failing rollout stopped.
SHAPE = {"from": str, "to": str, "nodes": int, "move_all_s?": float, "upgrade_s?": float,
         "job_records?": [str], "rollback_s?": float, "stopped_at?": str, "why?": str}


def main() -> int:
    return bench.run_tests(TEST)


if __name__ == "__main__":
    sys.exit(main())
