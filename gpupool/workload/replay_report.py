"""The replay's report: both policies side by side, in Markdown with plots and JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: reports are written, never shown
import matplotlib.pyplot as plt

from gpupool.workload.replay import Run, utilization_series


def _plot_utilization(runs: dict[str, list[Run]], capacity: int, t0: float,
                      path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    t1 = max((r.end for rs in runs.values() for r in rs if r.end), default=t0 + 1)
    for policy, rs in runs.items():
        series = utilization_series(rs, capacity, t0, t1)
        ax.plot([t for t, _ in series], [u * 100 for _, u in series], label=policy)
    ax.set_xlabel("seconds since the first job was eligible")
    ax.set_ylabel("GPUs busy (%)")
    ax.set_ylim(0, 105)
    ax.legend()
    ax.set_title("GPU utilization over time")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _plot_waits(waits: dict[str, dict[str, list[float]]], path: Path) -> None:
    classes = sorted({c for w in waits.values() for c in w})
    fig, axes = plt.subplots(1, len(classes), figsize=(3 * len(classes), 3.5), squeeze=False)
    for ax, cls in zip(axes[0], classes, strict=True):
        data = [waits[p].get(cls, []) or [0.0] for p in waits]
        ax.boxplot(data, tick_labels=list(waits))
        ax.set_title(cls)
        ax.set_ylabel("wait (s)")
    fig.suptitle("Queue wait per class")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(out_dir: Path, result: dict[str, Any], runs: dict[str, list[Run]],
          waits: dict[str, dict[str, list[float]]], t0: dict[str, float]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    capacity = next(iter(result["policies"].values()))["capacity_gpus"]
    # Both runs on one time axis: each measured from its own start.
    shifted = {p: [Run(r.job, r.task_class, r.team, r.gpus, r.eligible - t0[p],
                       r.start - t0[p] if r.start else None, r.end - t0[p] if r.end else None,
                       r.state) for r in rs] for p, rs in runs.items()}
    _plot_utilization(shifted, capacity, 0.0, out_dir / "utilization.png")
    _plot_waits(waits, out_dir / "waits.png")
    (out_dir / "replay.json").write_text(json.dumps(result, indent=2) + "\n")
    pol = result["policies"]
    rows = [("GPU utilization while demand exceeds capacity", "gpu_utilization_saturated"),
            ("makespan (s)", "makespan_s"), ("jobs completed", "completed"),
            ("jobs it can never run (wider than the GPUs it gives the team)", "not_runnable"),
            ("preemptions and requeues", "preemptions_and_requeues"),
            ("work lost (GPU-s)", "work_lost_gpu_s")]
    lines = [f"# Policy replay: {result['trace']}", "",
             f"{result['jobs']} jobs on {capacity} GPUs, time compressed {result['speedup']}x.",
             "", "| | " + " | ".join(pol) + " |", "| --- |" + " ---: |" * len(pol)]
    lines += [f"| {label} | " + " | ".join(str(pol[p].get(key, "-")) for p in pol) + " |"
              for label, key in rows]
    for cls in sorted({c for p in pol.values() for c in p["wait_s"]}):
        lines.append(f"| wait p50 / p95 (s), {cls} | " + " | ".join(
            "{p50} / {p95}".format(**pol[p]["wait_s"].get(cls, {"p50": "-", "p95": "-"}))
            for p in pol) + " |")
    lines += ["", "![Utilization](utilization.png)", "", "![Waits](waits.png)", ""]
    path = out_dir / "replay.md"
    path.write_text("\n".join(lines))
    return path
