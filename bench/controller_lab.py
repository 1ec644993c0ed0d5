"""The controller lost and rebuilt on the lab: how long a backup takes, how long the
rebuild from a bare host takes (site.yml), how long the restore takes
(playbooks/controller_restore.yml, with slurm.yml after it), and the time to recover, from
the host's loss to Slurm accepting jobs with its queue, accounts and usage back.

The integration test measures these as it proves the restore and writes
bench/results/controller_lab.json; this runs it.

    python -m bench controller_lab
"""

from __future__ import annotations

import sys

import bench

TEST = "tests/integration/test_controller_lab.py"
SHAPE = {"backup_s": float, "backup_bytes": int, "rebuild_s": float, "restore_s": float,
         "time_to_recover_s": float, "hosts": int}


def main() -> int:
    return bench.run_tests(TEST)


if __name__ == "__main__":
    sys.exit(main())
