"""Write an audit as Markdown with PNG plots (and the JSON beside it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: reports are written, never shown
import matplotlib.pyplot as plt

from gpupool.workload.audit import Job, concurrency

DPI = 120


def _plot_durations(jobs: list[Job], source: str, path: Path) -> None:
    """Durations as one CDF per class on a log axis: seconds-long and week-long jobs
    side by side, readable at a glance."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    by_class: dict[str, list[float]] = {}
    for j in jobs:
        by_class.setdefault(j.task_class, []).append(max(j.duration, 1.0) / 3600)
    for cls, hours in sorted(by_class.items()):
        hours.sort()
        ax.step(hours, [(i + 1) / len(hours) for i in range(len(hours))], where="post",
                label=f"{cls} ({len(hours)} jobs)")
    ax.set_xscale("log")
    ax.set_xlabel("duration (hours, log scale)")
    ax.set_ylabel("share of jobs at most this long")
    ax.set_ylim(0, 1.02)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    ax.set_title(f"Job durations by class: {source}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _plot_demand(jobs: list[Job], needed: int, source: str, path: Path) -> None:
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
    ax.set_title(f"GPU demand over time: {source}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def write(report: dict[str, Any], jobs: list[Job], out_dir: Path, source: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    name = Path(source).name
    _plot_durations(jobs, name, out_dir / "durations.png")
    _plot_demand(jobs, report["gpus_needed_for_target"], name, out_dir / "demand.png")
    (out_dir / "audit.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# Workload audit: {source}",
        "",
        f"{report['jobs']} GPU jobs. Observed wait p50 {report['observed_wait_s']['p50']} s, "
        f"p90 {report['observed_wait_s']['p90']} s.",
        "",
        f"**GPUs needed** to keep the p{report['wait_percentile']:g} wait at or under "
        f"{report['wait_target_s']:g} s "
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
    if report.get("class_mapping"):
        lines += ["", "## How the trace's classes were mapped", "",
                  "| trace class | task class | why |", "| --- | --- | --- |"]
        lines += [f"| {qos} | {m['class']} | {m['why']} |"
                  for qos, m in report["class_mapping"].items()]
    for key in ("teams_not_in_description", "classes_not_in_description"):
        if report.get(key):
            lines += ["", f"Not in the description: {key.split('_')[0]} "
                          f"{', '.join(report[key])}."]
    lines += ["", "## Recommended quotas", "",
              "Shares of the GPUs needed, in proportion to each team's p90 demand.", "",
              "| team | recommended | declared |", "| --- | ---: | ---: |"]
    for team, q in sorted(report["recommended_quota"].items()):
        lines.append(f"| {team} | {q} | {report['declared_quota'].get(team, '-')} |")
    lines += ["", "![Job durations](durations.png)", "", "![GPU demand](demand.png)", ""]
    path = out_dir / "audit.md"
    path.write_text("\n".join(lines))
    return path
