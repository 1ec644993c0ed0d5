"""The scheduler exporter's cost per scrape against the size of the Slurm state: 100 to
10,000 jobs in the queue (half running, each on one node with its GPUs, half pending) on
100 to 1,000 nodes, with as many finished runs since the last scrape as running jobs.

Slurm's answers are generated in its own formats (squeue, scontrol -d show job, sinfo,
sacct) and handed to the exporter's collector in process, so what is measured is the
exporter's parsing and the series it builds, not Slurm's commands (on a real controller
those cost what squeue and sacct cost there). CPU seconds per scrape, the median of RUNS.

    python -m bench exporter        # writes bench/results/exporter.json
"""

from __future__ import annotations

import statistics
import sys
import time
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

import bench
from gpupool.onhost import slurm_exporter as ex

SIZES = ((100, 100), (1000, 100), (10000, 1000))  # (jobs, nodes)
RUNS = 5
GPUS_PER_NODE = 8
NOW = datetime(2026, 12, 1, 12, 0, 0)
SHAPE = {"runs": int, "sizes": [{"jobs": int, "nodes": int, "series": int,
                                  "cpu_s_per_scrape": float, "bytes": int}]}


def slurm_state(jobs: int, nodes: int) -> dict[str, str]:
    """squeue, scontrol, sinfo and sacct output for the pool, keyed by command."""
    t = NOW.strftime("%Y-%m-%dT%H:%M:%S")
    earlier = (NOW - timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M:%S")
    teams, classes = ("vision", "nlp", "speech"), ("interactive", "training", "deferred")
    squeue, scontrol, sacct = [], [], []
    for i in range(jobs):
        team, cls = teams[i % 3], classes[i % 3]
        if i % 2 == 0:
            node, gpus = f"gpu{(i // 2) % nodes:04d}", 1 + i % GPUS_PER_NODE
            squeue.append(f"{i}|RUNNING|{cls}|{team}|{earlier}|{t}|None")
            scontrol.append(f"JobId={i} JobName=job{i}\n   JobState=RUNNING Reason=None\n"
                            f"   JOB_GRES=gpu:h100:{gpus}\n     Nodes={node} CPU_IDs=0-7 "
                            f"Mem=0 GRES=gpu:h100:{gpus}(IDX:0-{gpus - 1})")
            sacct.append(f"{jobs + i}|{team}|{cls}|COMPLETED|{earlier}|{earlier}|{t}")
        else:
            squeue.append(f"{i}|PENDING|{cls}|{team}|{earlier}|N/A|(Resources)")
            scontrol.append(f"JobId={i} JobName=job{i}\n   JobState=PENDING Reason=Resources")
    sinfo = [f"gpu{n:04d}|mixed|gpu:h100:{GPUS_PER_NODE}(S:0-1)|none" for n in range(nodes)]
    return {"squeue": "\n".join(squeue) + "\n", "scontrol": "\n".join(scontrol) + "\n",
            "sinfo": "\n".join(sinfo) + "\n", "sacct": "\n".join(sacct) + "\n"}


def measure(jobs: int, nodes: int) -> dict[str, Any]:
    state = slurm_state(jobs, nodes)
    samples, size, series = [], 0, 0
    for _ in range(RUNS):
        # A fresh collector each time, so the finished runs count as new on every scrape.
        collector = ex.SlurmCollector(run=lambda argv: state[argv[0]],
                                      clock=NOW.timestamp,
                                      started=(NOW - timedelta(hours=1)).timestamp())
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        collector.last = (float("-inf"), [])
        t = time.process_time()
        text = generate_latest(registry)
        samples.append(time.process_time() - t)
        size = len(text)
        series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    return {"jobs": jobs, "nodes": nodes, "series": series, "bytes": size,
            "cpu_s_per_scrape": round(statistics.median(samples), 4)}


def main() -> int:
    rows = [measure(j, n) for j, n in SIZES]
    for r in rows:
        print(f"{r['jobs']:>6} jobs {r['nodes']:>5} nodes: {r['series']:>6} series, "
              f"{r['bytes'] / 1024:8.0f} KiB, {r['cpu_s_per_scrape']:.3f} CPU-s per scrape")
    path = bench.write("exporter", {"runs": RUNS, "sizes": rows}, "python -m bench exporter")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
