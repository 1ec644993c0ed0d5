"""Write an audit as Markdown with PNG plots (and the JSON beside it): the durations, the
GPU demand over time against each model's capacity, demand per model and the rows of
history that were not counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: reports are written, never shown
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from gpupool.workload.audit import Job, capacity_text, concurrency

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


def _hours(steps: list[tuple[float, float]], t0: float) -> list[float]:
    return [(t - t0) / 3600 for t, _ in steps]


def demand_figure(report: dict[str, Any], jobs: list[Job], source: str) -> Figure:
    """GPUs in use over time, all jobs and (where the history names models) each model's,
    with each model's capacity as a horizontal line in the model's colour: a model's
    shortage shows against its own line, not against the pool's sum. The caller saves
    and closes it."""
    steps = concurrency(jobs, "gpus")
    t0 = steps[0][0] if steps else 0.0
    fig, ax = plt.subplots(figsize=(7, 3.5))
    if steps:
        ax.step(_hours(steps, t0), [lvl for _, lvl in steps], where="post", color="black",
                label="GPUs in use (as recorded)")
    for i, row in enumerate(r for r in report["capacity_by_model"] if r["model"]):
        colour = f"C{i}"
        model_steps = concurrency((j for j in jobs if j.gpu_model == row["model"]), "gpus")
        if model_steps:
            ax.step(_hours(model_steps, t0), [lvl for _, lvl in model_steps], where="post",
                    color=colour, label=f"{row['model']} GPUs in use")
        ax.axhline(row["capacity"], color=colour, linestyle=":",
                   label=f"{row['model']} capacity: {row['capacity']}")
    needed = report["gpus_needed_for_target"]
    ax.axhline(needed, color="red", linestyle="--", label=f"GPUs for the wait target: {needed}")
    ax.set_xlabel("hours since first job")
    ax.set_ylabel("GPUs")
    ax.legend(fontsize=7)
    ax.set_title(f"GPU demand over time: {source}", fontsize=10)
    fig.tight_layout()
    return fig


def write(report: dict[str, Any], jobs: list[Job], out_dir: Path, source: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    name = Path(source).name
    _plot_durations(jobs, name, out_dir / "durations.png")
    fig = demand_figure(report, jobs, name)
    fig.savefig(out_dir / "demand.png", dpi=DPI)
    plt.close(fig)
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
    if report.get("capacity_by_model"):
        lines += ["", "## Demand against capacity per GPU model", "",
                  "GPUs in use at once (time-weighted p95 over the whole history) against "
                  "the pool's GPUs of the model, every capacity type together. Jobs that "
                  "name no model share the whole pool with every other job.", "",
                  "| model | jobs | peak | p95 | capacity | over capacity (share, h, "
                  "episodes) |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for row in report["capacity_by_model"]:
            over = (f"**{row['exceeded_share']:.0%}**, {row['exceeded_s'] / 3600:.1f}, "
                    f"{row['exceeded_episodes']}" if row["exceeded"] else "never")
            model = row["model"] or f"any of {', '.join(row['served_by']) or 'none'}"
            lines.append(f"| {model} | {row['jobs']} | {row['peak_gpus']:g} | "
                         f"{row['p95_gpus']:g} | {row['capacity']} | {over} |")
        short = [f"- {capacity_text(row)}" for row in report["capacity_by_model"]
                 if row["exceeded"]]
        lines += ["", *short] if short else []
    if report.get("dropped_total"):
        lines += ["", "## Rows not counted", "",
                  f"{report['dropped_total']} rows of the history were not counted "
                  "(each for the first reason that applies).", "",
                  "| reason | rows | why | names |", "| --- | ---: | --- | --- |"]
        lines += [f"| {reason} | {count} | {report['drop_reasons'][reason]} | "
                  f"{', '.join(report['dropped_names'].get(reason, {}))} |"
                  for reason, count in report["dropped"].items() if count]
        lines += [f"- `{where}`" for where in report["unparsable_examples"]]
    lines += ["", "## Recommended quotas", "",
              "Shares of the GPUs needed, in proportion to each team's p90 demand.", "",
              "| team | recommended | declared |", "| --- | ---: | ---: |"]
    for team, q in sorted(report["recommended_quota"].items()):
        lines.append(f"| {team} | {q} | {report['declared_quota'].get(team, '-')} |")
    lines += ["", "![Job durations](durations.png)", "", "![GPU demand](demand.png)", ""]
    path = out_dir / "audit.md"
    path.write_text("\n".join(lines))
    return path
