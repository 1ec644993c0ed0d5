"""Policy replay figures: a saturated synthetic trace and a sample of the Alibaba GPU trace
(at its own pace, and with its deferred pods first so preemption takes GPUs back), each
replayed by `gpupool replay` on the lab's Slurm under gpupool's policy and under the
manual-allocation baseline. Each replay's report (Markdown, plots, JSON) stays in
.cache/replay/<trace>/; the figures of all of them go to bench/results/replay.json.

    python -m bench replay
"""

from __future__ import annotations

import json
import sys

import bench
from gpupool import cli
from gpupool.paths import DATA

ALIBABA = DATA / "traces" / "alibaba-gpu-2023" / "openb_pod_list_default.csv"
REPORTS = bench.ROOT / ".cache" / "replay"
# Each replay: its name in the results and the arguments `gpupool replay` gets.
REPLAYS = {
    "synthetic": ["--jobs", "80", "--horizon", "150", "--load", "1.6"],
    # A window of the real trace, its durations stretched to an offered load of 1.6.
    "alibaba": ["--alibaba", str(ALIBABA.relative_to(bench.ROOT)), "--jobs", "60",
                "--horizon", "150", "--load", "1.6"],
    # The same window, its deferred pods arriving first: the pool fills with preemptible
    # work that the interactive and training pods after it take back.
    "alibaba-preemptible-first": ["--alibaba", str(ALIBABA.relative_to(bench.ROOT)),
                                  "--jobs", "60", "--horizon", "150", "--load", "1.6",
                                  "--preemptible-first"],
}
_WAIT = {"p50": float, "p95": float, "n": int}
_POLICY = {"jobs": int, "completed": int, "capacity_gpus": int, "saturated_s": int,
           "gpu_utilization_saturated": (float, None), "wait_s": {str: _WAIT},
           "wait_s_by_team": {str: _WAIT}, "wait_trace_s": {str: _WAIT},
           "makespan_s": (float, None), "makespan_trace_s": (float, None),
           "first_start_s": (float, None), "preemptions_and_requeues": int,
           "work_lost_gpu_s": float, "work_lost_share": float,
           "work_lost_per_preemption_s": (float, None), "failed_share": float,
           "not_runnable": int, "waited_on?": {str: {str: int}}}
_TARGET = {"target": str, "value": (float, None, [(float, None)]), "met": (bool, None),
           "why": str}
_CLASS = {"jobs": int, "offered_load": float, "alone_wait_s": _WAIT}
SHAPE = {str: {"arguments": [str], "trace": str, "jobs": int, "speedup": float,
               "offered_load": float, "classes?": {str: _CLASS}, "policies": {str: _POLICY},
               "targets": [_TARGET]}}


def main() -> int:
    figures, failed = {}, 0
    for name, args in REPLAYS.items():
        argv = ["replay", "--stack", "lab", "--out", str(REPORTS / name), *args]
        print(f"gpupool {' '.join(argv)}", flush=True)
        report = REPORTS / name / "replay.json"
        report.unlink(missing_ok=True)  # never the figures of an earlier run
        failed |= cli.main(argv)
        if report.exists():
            figures[name] = {"arguments": args, **json.loads(report.read_text())}
    print(f"wrote {bench.write('replay', figures, 'python -m bench replay')}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
