"""The figures, rendered from bench/results/ and nowhere else: bench/RESULTS.md (every file,
every figure, with the command and commit that wrote it) and the headline table between
the README's figure markers. `python -m bench` renders both after it measures;
tests/test_bench_results.py fails when either disagrees with the files.

    python -m bench.report          # render both now
"""

from __future__ import annotations

import importlib
import json
import re
from typing import Any

import bench

RESULTS_MD = bench.ROOT / "bench" / "RESULTS.md"
README = bench.ROOT / "README.md"
START = "<!-- figures: rendered by `python -m bench.report` from bench/results/; do not edit -->"
END = "<!-- /figures -->"

# The README's headline figures: (what, results file, path to the figure, unit).
HEADLINES = [
    ("`validate` on the lab stack (median CPU)", "cli_startup",
     "verbs.validate.cpu_s_median", "CPU-s"),
    ("`plan` on 1,000 nodes (whole command, CPU)", "plan", "plan_cpu_s_1000_nodes", "CPU-s"),
    ("gate, standard tier, every lab node at once", "gate",
     "tiers.standard.all_nodes_parallel_s", "s"),
    ("interactive job start on a full pool (by preemption)", "slurm_lab",
     "interactive_start_on_full_pool_s", "s"),
    ("preempted job: requeued to completed", "slurm_lab", "requeue_to_complete_s", "s"),
    ("burst node: resume to job done", "slurm_lab", "burst_resume_to_job_done_s", "s"),
    ("node failure: job running again elsewhere", "drills",
     "node-failure.time_to_resume_s", "s"),
    ("failing node drained by the health check", "drills",
     "health-check.health_check_s", "s"),
    ("one node onboarded, bare to admitted", "onboard", "runs.0.converge_s", "s"),
    ("scheduler exporter, one scrape of 10,000 jobs on 1,000 nodes", "exporter",
     "sizes.2.cpu_s_per_scrape", "CPU-s"),
    ("GPU utilization while saturated, gpupool / baseline", "replay",
     "synthetic.policies.gpupool.gpu_utilization_saturated "
     "synthetic.policies.baseline.gpu_utilization_saturated", ""),
]


def load() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(bench.RESULTS.glob("*.json"))}


def lookup(figures: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(figures, list) and part.isdigit() and int(part) < len(figures):
            figures = figures[int(part)]
        elif isinstance(figures, dict) and part in figures:
            figures = figures[part]
        else:
            return None
    return figures


def flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        return [row for k, v in value.items()
                for row in flatten(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(value, list) and value and any(isinstance(v, (dict, list)) for v in value):
        return [row for i, v in enumerate(value) for row in flatten(v, f"{prefix}[{i}]")]
    return [(prefix, value)]


def _cell(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text.replace("|", "\\|").replace("\n", " ")


def _origin(p: dict[str, Any]) -> str:
    changes = ", with local changes" if p["local_changes"] else ""
    return (f"`{p['command']}` at {p['commit'][:10]}{changes}, {p['date']}, "
            f"{p['cpus']} CPUs")


def _summary(name: str) -> str:
    doc = importlib.import_module(f"bench.{name}").__doc__ or ""
    return " ".join(doc.split("\n\n")[0].split())


def results_md(data: dict[str, dict[str, Any]]) -> str:
    lines = ["# Benchmark figures", "",
             "Rendered by `python -m bench.report` from `bench/results/*.json`, each written by "
             "the module of the same name in `bench/` (or the integration test it runs). "
             "Rerun one with its command; `make bench` reruns them all.", ""]
    for name, d in data.items():
        lines += [f"## {name}", "", _summary(name), "", f"Written by {_origin(d['provenance'])}.",
                  "", "| figure | value |", "| --- | ---: |"]
        lines += [f"| {_cell(k)} | {_cell(v)} |" for k, v in flatten(d["figures"])]
        lines.append("")
    return "\n".join(lines)


def readme_block(data: dict[str, dict[str, Any]]) -> str:
    rows = ["| figure | value | from |", "| --- | ---: | --- |"]
    for what, name, paths, unit in HEADLINES:
        d = data.get(name)
        values = [lookup(d["figures"], p) if d else None for p in paths.split()]
        shown = " / ".join("not measured" if v is None else f"{v:g}" if isinstance(v, float)
                           else str(v) for v in values)
        if unit and all(v is not None for v in values):
            shown += f" {unit}"
        origin = f"`{name}.json` at {d['provenance']['commit'][:10]}" if d else "no file yet"
        rows.append(f"| {what} | {shown} | {origin} |")
    return "\n".join([START, *rows, END])


def readme_with(block: str, text: str) -> str:
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"README.md has no figure markers ({START} ... {END})")
    return pattern.sub(lambda _: block, text)


def render_files() -> None:
    data = load()
    RESULTS_MD.write_text(results_md(data))
    README.write_text(readme_with(readme_block(data), README.read_text()))


if __name__ == "__main__":
    render_files()
