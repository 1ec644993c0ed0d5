"""Onboarding benchmark: bare lab hosts -> converged (playbooks/onboard.yml) for 1, 3 and 5
GPU nodes, and the idempotent re-run time. Writes bench/results/onboard.json.

Beside wall-clock time it records the CPU time the whole machine spent busy (from
/proc/stat: the controller's Ansible, SSH and every lab host), so a ratio can be read
against what the cores allow: converging N hosts costs N hosts' CPU work, and on a machine
with fewer cores than hosts that work, not the playbook, sets the floor.

The benchmark pool is the lab stack widened to five GPU nodes (clones of lab-gpu1 with the
next addresses) and moved to its own address space (10.231.* -> 10.251.*) and name, so it
never collides with a running `make lab`. It takes the lab lock for its whole run.

    python -m bench.onboard [--sizes 1 3 5]
"""

from __future__ import annotations

import argparse
import copy
import ipaddress
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from gpupool import lab, loader
from gpupool.model import Description
from tests.integration.conftest import ansible_playbook

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "onboard.json"
TEMPLATE_NODE = "lab-gpu1"


def bench_description(gpu_nodes: int) -> Description:
    raw = yaml.safe_load(loader.description_path("lab", ROOT).read_text())
    raw = yaml.safe_load(yaml.safe_dump(raw).replace("10.231.", "10.251."))
    raw["pool"]["name"] = "bench"
    template = raw["nodes"][TEMPLATE_NODE]
    gpus = [n for n in raw["nodes"] if n != TEMPLATE_NODE and "class" in raw["nodes"][n]
            and raw["nodes"][n]["class"] == template["class"]]
    for i in range(len(gpus) + 2, gpu_nodes + 1):
        node: dict[str, Any] = copy.deepcopy(template)
        node["addresses"] = {seg: str(ipaddress.ip_address(a) + i - 1)
                             for seg, a in template["addresses"].items()}
        raw["nodes"][f"lab-gpu{i}"] = node
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump(raw, fh)
    return loader.load_file(Path(fh.name))


def cpu_busy_s() -> float:
    """CPU seconds the machine has spent busy since boot, all cores together."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def timed(fn: Any, *args: Any) -> tuple[Any, float, float]:
    """fn(*args), its wall-clock seconds and the machine's busy CPU seconds meanwhile."""
    t, c = time.monotonic(), cpu_busy_s()
    out = fn(*args)
    return out, time.monotonic() - t, cpu_busy_s() - c


def run(sizes: list[int]) -> dict[str, Any]:
    desc = bench_description(max(sizes))
    gpu = [n for n, node in desc.nodes.items() if desc.node_classes[node.class_].gpu]
    others = [n for n in desc.nodes if n not in gpu]
    results: dict[str, Any] = {"pool": "lab stack widened to 5 GPU nodes", "runs": [],
                               "machine": {"cpus": os.cpu_count(),
                                           "python": platform.python_version()}}
    with lab.lab_lock():
        lab.down(desc)
        for n in sizes:
            hosts = gpu[:n]
            t0 = time.monotonic()
            lab.up(desc, nodes=others + hosts)
            up_s = time.monotonic() - t0
            inv = lab.inventory_path(desc)
            book = ("playbooks/onboard.yml", "--limit", ",".join(hosts))
            first, converge_s, converge_cpu = timed(ansible_playbook, inv, *book)
            again, rerun_s, rerun_cpu = timed(ansible_playbook, inv, *book)
            row = {"hosts": n, "lab_up_s": round(up_s, 1), "converge_s": round(converge_s, 1),
                   "converge_cpu_s": round(converge_cpu, 1),
                   "converge_cores_busy": round(converge_cpu / converge_s, 2),
                   "rerun_s": round(rerun_s, 1), "rerun_cpu_s": round(rerun_cpu, 1),
                   "converge_failed": first.total("failed"),
                   "rerun_changed": again.total("changed")}
            print(json.dumps(row), flush=True)
            if first.rc != 0:
                print(first.output[-3000:])
            results["runs"].append(row)
            lab.down(desc)
    by = {r["hosts"]: r for r in results["runs"]}
    if 1 in by and (top := max(sizes)) in by:
        one, many, cores = by[1], by[top], os.cpu_count() or 1
        results[f"ratio_{top}_to_1"] = round(many["converge_s"] / one["converge_s"], 2)
        # The best ratio these cores allow for the CPU work measured: N hosts' work spread
        # over every core, or the one-host time, whichever is longer.
        floor = max(one["converge_s"], many["converge_cpu_s"] / cores) / one["converge_s"]
        results[f"cpu_floor_ratio_{top}_to_1"] = round(floor, 2)
        results["target_ratio"] = 1.5
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 3, 5])
    args = p.parse_args()
    results = run(sorted(args.sizes))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
