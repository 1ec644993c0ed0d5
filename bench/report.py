"""The figures, rendered from bench/results/ and nowhere else: bench/RESULTS.md (every file,
every figure, with the command and commit that wrote it), the headline table between the
README's figure markers and each runbook's measured times to recover, between the same
markers. `python -m bench` renders them after it measures; tests/test_bench_results.py
fails when any disagrees with the files.

    python -m bench.report          # render them now
"""

from __future__ import annotations

import importlib
import json
import re
from typing import Any

import bench
from gpupool.preview.walk import walk

RESULTS_MD = bench.ROOT / "bench" / "RESULTS.md"
README = bench.ROOT / "README.md"
RUNBOOKS = bench.ROOT / "runbooks"
START = "<!-- figures: rendered by `python -m bench.report` from bench/results/; do not edit -->"
END = "<!-- /figures -->"

# A figure shown in a table: (what, results file, path(s) to the figure, unit).
Figure = tuple[str, str, str, str]
# The README's headline figures.
HEADLINES: list[Figure] = [
    ("`validate` on the lab stack (median CPU)", "cli_startup",
     "verbs.validate.cpu_s_median", "CPU-s"),
    ("`plan` on 1,000 nodes (whole command, CPU)", "plan", "plan_cpu_s_1000_nodes", "CPU-s"),
    ("`ansible-inventory --list` on 1,000 nodes through the plugin (CPU / peak memory)",
     "inventory", "plugin_list_cpu_s_1000_nodes plugin_list_rss_mib_1000_nodes",
     "CPU-s / MiB"),
    ("gate, standard tier, every lab node at once", "gate",
     "tiers.standard.all_nodes_parallel_s", "s"),
    ("interactive job start on a full pool (by preemption)", "slurm_lab",
     "interactive_start_on_full_pool_s", "s"),
    ("preempted job: requeued to completed", "slurm_lab", "requeue_to_complete_s", "s"),
    ("burst node: resume to job done", "slurm_lab", "burst_resume_to_job_done_s", "s"),
    ("burst image built from bare / a host of it booted to its job running", "slurm_lab",
     "burst_image_ready_s burst_boot_to_job_running_s", "s"),
    ("node failure: job running again elsewhere", "drills",
     "node-failure.time_to_resume_s", "s"),
    ("failing node drained by the health check", "drills",
     "health-check.health_check_s", "s"),
    ("one node onboarded, bare to admitted", "onboard", "runs.0.converge_s", "s"),
    ("Debian 13 lab (controller, GPU node): converge from bare / re-run", "debian13_lab",
     "converge_s idempotence_s", "s"),
    ("job in an OCI bundle (Slurm 24.11, crun): bundle unpacked / first job / second job",
     "debian13_lab", "oci_bundle_s oci_job_s oci_job_again_s", "s"),
    ("environment image from the pool's registry: pull cold / pull cached / job in it",
     "debian13_lab", "registry_pull_cold_s registry_pull_cached_s registry_job_s", "s"),
    ("scheduler exporter, one scrape of 10,000 jobs on 1,000 nodes", "exporter",
     "sizes.2.cpu_s_per_scrape", "CPU-s"),
    ("GPU utilization while saturated, gpupool / baseline", "replay",
     "synthetic.policies.gpupool.gpu_utilization_saturated "
     "synthetic.policies.baseline.gpu_utilization_saturated", ""),
]

# Each runbook's measured figures, shown under its "Expected time to recover".
RUNBOOK_FIGURES: dict[str, list[Figure]] = {
    "node-failure.md": [
        ("node killed: its job running again on another node", "drills",
         "node-failure.time_to_resume_s", "s"),
        ("steps redone at most / checkpoint interval", "drills",
         "node-failure.steps_redone_at_most node-failure.checkpoint_interval_steps", "steps"),
    ],
    "gpu-xid-or-ecc-errors.md": [
        ("failing node drained by the periodic health check", "drills",
         "health-check.health_check_s", "s"),
        ("its job running again elsewhere", "drills", "health-check.time_to_resume_s", "s"),
    ],
    "network-degradation.md": [
        ("a failed node's job running again elsewhere", "drills",
         "node-failure.time_to_resume_s", "s"),
    ],
    "queue-overflow-or-starvation.md": [
        ("interactive job start on a full pool (by preemption)", "slurm_lab",
         "interactive_start_on_full_pool_s", "s"),
        ("preempted job: requeued to completed", "slurm_lab", "requeue_to_complete_s", "s"),
        ("drill: urgent job started / victim running again", "drills",
         "preemption.urgent_start_s preemption.time_to_resume_s", "s"),
        ("drill: steps the victim lost", "drills", "preemption.steps_lost", "steps"),
    ],
    "debian-release-upgrade.md": [
        ("Debian 13 controller and GPU node: converge from bare / re-run", "debian13_lab",
         "converge_s idempotence_s", "s"),
        ("Debian 13 nodes: standard gate, every node", "debian13_lab", "gate_s", "s"),
    ],
    "driver-upgrade.md": [
        ("upgrade to the lock, node by node, a job requeued", "rolling_upgrade",
         "upgrade_s", "s"),
        ("canary fails its gate: stopped and rolled back", "rolling_upgrade", "rollback_s",
         "s"),
    ],
    "adding-and-removing-nodes.md": [
        ("one node, bare to admitted / re-run", "onboard",
         "runs.0.converge_s runs.0.rerun_s", "s"),
    ],
    "checkpoint-restore.md": [
        ("newest valid checkpoint fetched and verified", "drills",
         "disaster-recovery.restore_s", "s"),
        ("restored job resumed at step", "drills", "disaster-recovery.resumed_at_step", ""),
    ],
    "registry-node-cannot-pull.md": [
        ("declared image pulled cold into a bundle / again, cached", "debian13_lab",
         "registry_pull_cold_s registry_pull_cached_s", "s"),
    ],
    "environment-image-broken.md": [
        ("a version already on the node: pulled (cached) / a job in it", "debian13_lab",
         "registry_pull_cached_s registry_job_cached_s", "s"),
    ],
    "storage-full.md": [
        ("storage outage / checkpoint saves that failed in it", "drills",
         "storage-outage.outage_s storage-outage.failed_saves", ""),
    ],
    "burst-capacity-unavailable.md": [
        ("burst node: resume to job done", "slurm_lab", "burst_resume_to_job_done_s", "s"),
        ("burst node: idle to suspended", "slurm_lab", "burst_idle_to_suspended_s", "s"),
    ],
    "burst-node-never-joins.md": [
        ("burst node: launch (resume program)", "slurm_lab", "burst_launch_s", "s"),
        ("burst node: host boot to job running", "slurm_lab", "burst_boot_to_job_running_s",
         "s"),
        ("burst node, split: boot / gate / registration", "slurm_lab",
         "burst_boot_s burst_gate_s burst_registration_s", "s"),
    ],
    "controller-recovery.md": [
        ("controller rebuilt from bare (site.yml) / restored", "controller_lab",
         "rebuild_s restore_s", "s"),
        ("host lost to Slurm with its queue and usage back", "controller_lab",
         "time_to_recover_s", "s"),
        ("one backup taken and shipped", "controller_lab", "backup_s", "s"),
        ("primary killed to the backup accepting jobs / primary back in control",
         "failover_lab", "takeover_s failback_s", "s"),
    ],
    "spot-interruption.md": [
        ("spot notice: job requeued / running again", "slurm_lab",
         "spot_notice_to_requeued_s spot_notice_to_running_again_s", "s"),
    ],
}


def load() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(bench.RESULTS.glob("*.json"))}


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
    strategy = p.get("ansible_strategy", "linear")
    playbooks = "" if strategy == "linear" else f", playbooks under the {strategy} strategy"
    return (f"`{p['command']}` at {p['commit'][:10]}{changes}, {p['date']}, "
            f"{p['cpus']} CPUs{playbooks}")


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


def readme_block(data: dict[str, dict[str, Any]], figures: list[Figure] = HEADLINES) -> str:
    """The marked table of figures (the README's headlines unless others are given)."""
    rows = ["| figure | value | from |", "| --- | ---: | --- |"]
    for what, name, paths, unit in figures:
        d = data.get(name)
        values = [walk(d["figures"], p) if d else None for p in paths.split()]
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
        raise ValueError(f"no figure markers ({START} ... {END})")
    return pattern.sub(lambda _: block, text)


def render_files() -> None:
    data = load()
    RESULTS_MD.write_text(results_md(data))
    README.write_text(readme_with(readme_block(data), README.read_text()))
    for name, figures in RUNBOOK_FIGURES.items():
        path = RUNBOOKS / name
        path.write_text(readme_with(readme_block(data, figures), path.read_text()))


if __name__ == "__main__":
    render_files()
