"""The backup controller's takeover on the lab: from the primary's slurmctld killed to the
backup accepting a new job (takeover_s, which includes the declared SlurmctldTimeout,
takeover_after_s), to that job done (first_job_done_after_kill_s), and from the primary
started again to it being in control with the running job intact (failback_s).

The integration test measures these as it proves the takeover and writes
bench/results/failover_lab.json; this runs it.

    python -m bench failover_lab
"""

from __future__ import annotations

import sys

import bench

TEST = ("tests/integration/test_controller_lab.py::"
        "test_the_backup_controller_takes_over_and_gives_control_back")
SHAPE = {"takeover_s": float, "first_job_done_after_kill_s": float, "failback_s": float,
         "takeover_after_s": int}


def main() -> int:
    return bench.run_tests(TEST)


if __name__ == "__main__":
    sys.exit(main())
