"""The replay's report: both policies side by side, in Markdown with plots and JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: reports are written, never shown
import matplotlib.pyplot as plt

from gpupool.workload.replay import Run, utilization_series

DPI = 120
CDF_FLOOR_S = 0.5  # a log axis has no 0: shorter waits are drawn here


def _plot_utilization(runs: dict[str, list[Run]], capacity: int, t0: float, trace: str,
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
    ax.set_title(f"GPUs busy over time: {trace}")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _plot_waits(waits: dict[str, dict[str, list[float]]], trace: str, path: Path) -> None:
    """One panel per class: each policy's wait CDF, on a log axis (waits span seconds to
    the whole replay)."""
    classes = sorted({c for w in waits.values() for c in w})
    fig, axes = plt.subplots(1, max(1, len(classes)), figsize=(3.2 * max(1, len(classes)), 3.5),
                             squeeze=False)
    for ax, cls in zip(axes[0], classes, strict=False):
        for policy, per_class in waits.items():
            values = sorted(max(w, CDF_FLOOR_S) for w in per_class.get(cls, []))
            if values:
                ax.step(values, [(i + 1) / len(values) for i in range(len(values))],
                        where="post", label=policy)
        ax.set_xscale("log")
        ax.set_xlabel(f"wait (s, log; under {CDF_FLOOR_S:g} s shown at it)")
        ax.set_ylabel("share of jobs")
        ax.set_ylim(0, 1.02)
        ax.set_title(cls)
        ax.legend(fontsize="small")
    fig.suptitle(f"Queue wait per class: {trace}")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def write(out_dir: Path, result: dict[str, Any], runs: dict[str, list[Run]],
          waits: dict[str, dict[str, list[float]]], t0: dict[str, float]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    capacity = next(iter(result["policies"].values()))["capacity_gpus"]
    # Both runs on one time axis: each measured from its own start.
    shifted = {p: [Run(r.job, r.task_class, r.team, r.gpus, r.eligible - t0[p],
                       r.start - t0[p] if r.start else None, r.end - t0[p] if r.end else None,
                       r.state) for r in rs] for p, rs in runs.items()}
    _plot_utilization(shifted, capacity, 0.0, result["trace"], out_dir / "utilization.png")
    _plot_waits(waits, result["trace"], out_dir / "waits.png")
    (out_dir / "replay.json").write_text(json.dumps(result, indent=2) + "\n")
    pol = result["policies"]
    rows = [("GPU utilization while demand exceeds capacity", "gpu_utilization_saturated"),
            ("makespan (s)", "makespan_s"), ("makespan in trace time (s)", "makespan_trace_s"),
            ("jobs completed", "completed"), ("share of jobs failed", "failed_share"),
            ("jobs it can never run (wider than the GPUs it gives the team)", "not_runnable"),
            ("preemptions and requeues", "preemptions_and_requeues"),
            ("work lost (GPU-s)", "work_lost_gpu_s"),
            ("work lost, share of all work", "work_lost_share"),
            ("work lost per preemption (s)", "work_lost_per_preemption_s")]
    lines = [f"# Policy replay: {result['trace']}", "",
             f"{result['jobs']} jobs on {capacity} GPUs, time compressed {result['speedup']}x.",
             "", "| | " + " | ".join(pol) + " |", "| --- |" + " ---: |" * len(pol)]
    lines += [f"| {label} | " + " | ".join(str(pol[p].get(key, "-")) for p in pol) + " |"
              for label, key in rows]
    for key, what in (("wait_s", "class"), ("wait_trace_s", "class, trace time"),
                      ("wait_s_by_team", "team")):
        for name in sorted({c for p in pol.values() for c in p[key]}):
            lines.append(f"| wait p50 / p95 (s), {what} {name} | " + " | ".join(
                "{p50} / {p95}".format(**pol[p][key].get(name, {"p50": "-", "p95": "-"}))
                for p in pol) + " |")
    for name in sorted({c for p in pol.values() for c in p.get("waited_on", {})}):
        lines.append(f"| jobs held back, per reason, class {name} | " + " | ".join(
            ", ".join(f"{r} {n}" for r, n in pol[p].get("waited_on", {}).get(name, {}).items())
            or "-" for p in pol) + " |")
    classes = result.get("classes", {})
    if classes:
        lines += ["", "## What the trace asks, per class", "",
                  "| class | jobs | offered load | wait p50 / p95 (s) with the pool to itself |",
                  "| --- | ---: | ---: | ---: |"]
        lines += ["| {} | {jobs} | {offered_load} | {p50} / {p95} |".format(
                      c, **f, **f["alone_wait_s"]) for c, f in classes.items()]
    verdicts = {True: "met", False: "missed", None: "no evidence"}
    lines += ["", "## Targets", "", "| target | value | verdict | why |",
              "| --- | --- | --- | --- |"]
    lines += [f"| {t['target']} | {t['value']} | {verdicts[t['met']]} | {t['why']} |"
              for t in result.get("targets", [])]
    lines += ["", "![Utilization](utilization.png)", "", "![Waits](waits.png)", ""]
    path = out_dir / "replay.md"
    path.write_text("\n".join(lines))
    return path
