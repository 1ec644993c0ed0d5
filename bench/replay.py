"""Policy replay benchmark: a saturated synthetic trace and a sample of the Alibaba GPU
trace, each replayed on the lab's Slurm under gpupool's policy and the baseline.
Figures: bench/results/replay.json (written by `gpupool replay`)."""

from __future__ import annotations

from gpupool import cli
from gpupool.paths import DATA

ALIBABA = DATA / "traces" / "alibaba-gpu-2023" / "openb_pod_list_default.csv"


def main() -> None:
    cli.main(["replay", "--stack", "lab", "--jobs", "80", "--horizon", "150", "--load", "1.6"])
    cli.main(["replay", "--stack", "lab", "--alibaba", str(ALIBABA), "--jobs", "60",
              "--horizon", "150"])


if __name__ == "__main__":
    main()
