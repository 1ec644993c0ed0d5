"""How the description's verbs scale: the whole command a user runs (validate, inventory,
slurm render, plan, policy: a fresh `gpupool` process each, wall and CPU seconds) at 10,
100, 1,000 and 3,000 nodes, and the Pulumi program's own evaluation (under mocks, in
process after a warm-up) with its peak traced memory.

Synthetic pools grow from the example description: nodes cycle through its GPU node
classes, 16 to a rack; teams grow with the pool (one per 25 nodes, at least 2) and split
the on-prem GPUs between them, so the Kubernetes side grows too. On-prem nodes declare no
cloud resources (Ansible configures them), so the count of resources grows with teams.
Targets (issues 3 and 18): `gpupool plan` on 1,000 nodes under 5 CPU-seconds, linear growth.

    python -m bench plan        # writes bench/results/plan.json
"""

from __future__ import annotations

import gc
import ipaddress
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import yaml

import bench
from gpupool.preview import plan
from gpupool.spec import loader
from gpupool.spec.facts import gpu_capacity
from gpupool.spec.model import Description

SIZES = (10, 100, 1000, 3000)
# Each verb's arguments after `--file POOL`; {out} is a scratch folder.
VERBS = {"validate": ["validate"], "inventory": ["inventory"],
         "slurm render": ["slurm", "--out", "{out}", "render"], "plan": ["plan", "--json"],
         "policy": ["policy", "--json"]}
TARGET_PLAN_CPU_S = 5.0
COMMAND_TIMEOUT_S = 600
SHAPE = {"sizes": [{"nodes": int, "teams": int, "resources": int,
                    "program_s": float, "ms_per_resource": float, "peak_traced_mib": float,
                    "commands": {str: {"wall_s": float, "cpu_s": float, "peak_rss_mib": float,
                                       "exit": int}}}],
         "max_rss_mib": float, "target_plan_cpu_s_1000_nodes": float,
         "plan_cpu_s_1000_nodes": float, "meets_target": bool,
         "linear_ratio_1000_vs_100": float,
         "cpu_growth_3000_vs_1000": {str: float}}
RACK_SIZE = 16
NODES_PER_TEAM = 25


def synthetic(nodes: int) -> Description:
    return loader.parse(synthetic_raw(nodes))


def synthetic_raw(nodes: int) -> dict[str, Any]:
    data = yaml.safe_load(loader.description_path("example").read_text())
    controller = next(n for n, v in data["nodes"].items() if "controller" in v["roles"])
    gpu_classes = [n for n, c in data["node_classes"].items() if c.get("gpu")]
    segments = {n: ipaddress.ip_network(s["cidr"]) for n, s in
                data["network"]["segments"].items()}
    racks = [f"r{i:03d}" for i in range(-(-nodes // RACK_SIZE))]
    data["sites"] = {"dc1": {"leaf_switches": {
        f"leaf-{i:03d}": {"racks": [r]} for i, r in enumerate(racks)}}}
    data["sites"]["dc1"]["leaf_switches"]["leaf-000"]["racks"].append(
        data["nodes"][controller]["rack"])
    out = {controller: data["nodes"][controller]}
    for i in range(nodes):
        host = i + 16384  # clear of the controller's addresses (10.x.9.y in the example)
        out[f"n{i:04d}"] = {"class": gpu_classes[i % len(gpu_classes)],
                            "rack": racks[i // RACK_SIZE],
                            "addresses": {s: str(net[host]) for s, net in segments.items()}}
    data["nodes"] = out
    teams = max(2, nodes // NODES_PER_TEAM)
    data["teams"] = {f"team-{t:03d}": {"cost_centre": f"cc-{t:04d}", "quota": {},
                                        "borrowing_limit": {},
                                        "members": {"researcher": [f"user{t:03d}"]}}
                     for t in range(teams)}
    # The example's operators are admins of teams replaced here: its synthetic teams have
    # researchers only, so the pool has no operators.
    data["pool"]["operators"] = []
    # Fixed ids grow with the teams, as a directory's would.
    data["ids"] = {"users": {f"user{t:03d}": 20000 + t for t in range(teams)},
                   "teams": {f"team-{t:03d}": 40000 + t for t in range(teams)}}
    # Capacity first, then quotas that fit it: every team gets an equal on-prem share.
    cap = gpu_capacity(loader.parse({**data, "ids": {}, "teams": {"probe": {
        "cost_centre": "cc-0", "quota": {m: 0 for m in _models(data)}}}}))
    for team in data["teams"].values():
        for model, c in cap.items():
            share = c["on-prem"] // teams
            team["quota"][model] = share
            team["borrowing_limit"][model] = share
    return data


def _models(data: dict[str, Any]) -> list[str]:
    return sorted({c["gpu"]["model"] for c in data["node_classes"].values() if c.get("gpu")})


def command(argv: list[str]) -> dict[str, Any]:
    """One `gpupool` command as a user runs it (bench.measured)."""
    return bench.measured([sys.executable, "-m", "gpupool", *argv], bench.ROOT,
                          COMMAND_TIMEOUT_S, ok=(0, 1))  # 1: problems found, a full run


def measure(nodes: int, folder: Path) -> dict[str, Any]:
    raw = synthetic_raw(nodes)
    desc = loader.parse(raw)
    path = folder / f"pool-{nodes}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    out = str(folder / f"slurm-{nodes}")
    commands = {verb: command([argv[0], "--file", str(path),
                               *(a.format(out=out) for a in argv[1:])])
                for verb, argv in VERBS.items()}
    gc.collect()
    start = time.perf_counter()
    run = plan.declare(desc, f"bench-{nodes}")
    seconds = time.perf_counter() - start
    gc.collect()
    tracemalloc.start()
    plan.declare(desc, f"bench-{nodes}")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"nodes": nodes, "teams": len(desc.teams), "resources": len(run.resources),
            "program_s": round(seconds, 3),
            "ms_per_resource": round(1000 * seconds / len(run.resources), 3),
            "peak_traced_mib": round(peak / 2**20, 1), "commands": commands}


def main() -> int:
    # Two untimed runs: the bytecode cache and the program's pulumi_aws imports warm.
    command(["validate", "--stack", "example"])
    plan.declare(synthetic(SIZES[0]), "warmup")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(n, Path(tmp)) for n in SIZES]
    for r in rows:
        cmds = "  ".join(f"{v} {c['cpu_s']:.2f}" for v, c in r["commands"].items())
        print(f"{r['nodes']:>5} nodes {r['teams']:>3} teams {r['resources']:>5} resources "
              f"program {r['program_s']:>6.3f} s, CPU-s per command: {cmds}")
    at_1000 = next(r for r in rows if r["nodes"] == 1000)
    at_100 = next(r for r in rows if r["nodes"] == 100)
    at_3000 = next(r for r in rows if r["nodes"] == 3000)
    plan_cpu = at_1000["commands"]["plan"]["cpu_s"]
    figures = {"sizes": rows,
               "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
               "target_plan_cpu_s_1000_nodes": TARGET_PLAN_CPU_S,
               "plan_cpu_s_1000_nodes": plan_cpu,
               "meets_target": plan_cpu < TARGET_PLAN_CPU_S,
               "linear_ratio_1000_vs_100": round(
                   at_1000["ms_per_resource"] / at_100["ms_per_resource"], 2),
               # 3.0 is linear: three times the nodes, three times the CPU.
               "cpu_growth_3000_vs_1000": {
                   v: round(at_3000["commands"][v]["cpu_s"] / at_1000["commands"][v]["cpu_s"], 2)
                   for v in VERBS}}
    print(f"wrote {bench.write('plan', figures, 'python -m bench plan')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
