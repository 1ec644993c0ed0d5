"""Write an audit as Markdown with PNG plots (and the JSON beside it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: reports are written, never shown
import matplotlib.pyplot as plt

from gpupool.workload.audit import Job, concurrency


def _plot_durations(jobs: list[Job], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    by_class: dict[str, list[float]] = {}
    for j in jobs:
        by_class.setdefault(j.task_class, []).append(max(j.duration, 1.0) / 3600)
    ax.hist(list(by_class.values()), bins=40, label=list(by_class), stacked=True, log=True)
    ax.set_xlabel("duration (hours)")
    ax.set_ylabel("jobs (log)")
    ax.legend()
    ax.set_title("Job duration by class")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _plot_demand(jobs: list[Job], needed: int, path: Path) -> None:
    steps = concurrency(jobs, "gpus")
    fig, ax = plt.subplots(figsize=(7, 3.5))
    if steps:
        t0 = steps[0][0]
        ax.step([(t - t0) / 3600 for t, _ in steps], [lvl for _, lvl in steps], where="post",
                label="GPUs in use (as recorded)")
    ax.axhline(needed, color="red", linestyle="--", label=f"GPUs for the wait target: {needed}")
    ax.set_xlabel("hours since first job")
    ax.set_ylabel("GPUs")
    ax.legend()
    ax.set_title("GPU demand over time")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(report: dict[str, Any], jobs: list[Job], out_dir: Path, source: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    _plot_durations(jobs, out_dir / "durations.png")
    _plot_demand(jobs, report["gpus_needed_for_target"], out_dir / "demand.png")
    (out_dir / "audit.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# Workload audit: {source}",
        "",
        f"{report['jobs']} GPU jobs. Observed wait p50 {report['observed_wait_s']['p50']} s, "
        f"p90 {report['observed_wait_s']['p90']} s.",
        "",
        f"**GPUs needed** to keep the p95 wait at or under {report['wait_target_p95_s']} s "
        f"(first come first served, node boundaries ignored): "
        f"**{report['gpus_needed_for_target']}**.",
        "",
        "| team | class | jobs | duration p50 / p90 (h) | GPUs/job p50 / max | parallel peak "
        "| GPUs in use p90 |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for g in report["groups"]:
        d, n = g["duration_s"], g["gpus_per_job"]
        lines.append(f"| {g['team']} | {g['class']} | {g['jobs']} | "
                     f"{d['p50'] / 3600:.2f} / {d['p90'] / 3600:.2f} | {n['p50']} / {n['max']} | "
                     f"{g['parallel_jobs_peak']:.0f} | {g['gpus_in_use_p90']} |")
    lines += ["", "## Recommended quotas", "",
              "Shares of the GPUs needed, in proportion to each team's p90 demand.", "",
              "| team | recommended | declared |", "| --- | ---: | ---: |"]
    for team, q in sorted(report["recommended_quota"].items()):
        lines.append(f"| {team} | {q} | {report['declared_quota'].get(team, '-')} |")
    lines += ["", "![Job durations](durations.png)", "", "![GPU demand](demand.png)", ""]
    path = out_dir / "audit.md"
    path.write_text("\n".join(lines))
    return path
