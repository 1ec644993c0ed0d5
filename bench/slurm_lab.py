"""Slurm lab figures: bring-up and converge time, interactive start on a full pool (by
preemption), requeue-to-complete of the victim, burst resume-to-done and idle-to-suspended.

The integration proofs (tests/integration/test_slurm_lab.py) measure these while they run
real jobs; this runs them and prints bench/results/slurm_lab.json.

    python -m bench.slurm_lab
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "slurm_lab.json"


def main() -> int:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "integration",
                           "tests/integration/test_slurm_lab.py"], cwd=ROOT, check=False)
    if RESULTS.exists():
        print(RESULTS.read_text())
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
