"""Alerting on the lab, end to end: from a node drained in the lab's real Slurm to the
NodeDrained alert arriving at a webhook receiver through the lab's real Prometheus and
Alertmanager (the alert's `for:` shortened to the lab's pace, stated in the figures), and
from the node's resume to the alert resolved in Alertmanager.

The integration proof (tests/integration/test_monitoring_lab.py) writes
bench/results/monitoring_lab.json as it measures; this runs it.

    python -m bench monitoring_lab
"""

from __future__ import annotations

import sys

import bench

TEST = "tests/integration/test_monitoring_lab.py"
SHAPE = {"alert": str, "alert_for": str, "scrape_interval": str, "group_wait": str,
         "drain_to_webhook_s": float, "resume_to_resolved_s": float}


def main() -> int:
    return bench.run_tests(TEST)


if __name__ == "__main__":
    sys.exit(main())
