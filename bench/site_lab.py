"""site.yml on the lab's fresh hosts: the converge, the second run (idempotence) and the
check-mode run, each as wall seconds and as seconds per role (ansible.posix's
profile_roles: the time of each role's tasks over all hosts, a task counted once).

The session fixture `site` (tests/integration/conftest.py) measures these as it converges
and writes bench/results/site_lab.json; this runs the tests that use it.

    python -m bench site_lab
"""

from __future__ import annotations

import sys

import bench

TEST = "tests/integration/test_roles.py"
RUNS = ("converge", "idempotence", "check")
SHAPE = {"hosts": int, **{f"{run}_s": float for run in RUNS},
         "roles_s": {run: {str: float} for run in RUNS}}


def main() -> int:
    return bench.run_tests(TEST)


if __name__ == "__main__":
    sys.exit(main())
