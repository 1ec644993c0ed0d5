"""How long the Pulumi program takes to evaluate (under mocks), and its peak memory, for
synthetic pools of 10, 100 and 1,000 nodes grown from the example description.

Nodes cycle through the example's GPU node classes, 16 to a rack; teams grow with the
pool (one per 25 nodes, at least 2) and split the on-prem GPUs between them, so the
Kubernetes side grows too. On-prem nodes themselves declare no cloud resources (Ansible
configures them), so the count of resources grows with teams. Target (issue 3): 1,000
nodes in under 5 s, linear growth.
"""

from __future__ import annotations

import gc
import ipaddress
import resource
import time
import tracemalloc
from typing import Any

import yaml

import bench
from gpupool.preview import plan
from gpupool.spec import loader
from gpupool.spec.facts import gpu_capacity
from gpupool.spec.model import Description

SIZES = (10, 100, 1000)
RACK_SIZE = 16
NODES_PER_TEAM = 25


def synthetic(nodes: int) -> Description:
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
    # Capacity first, then quotas that fit it: every team gets an equal on-prem share.
    cap = gpu_capacity(loader.parse({**data, "teams": {"probe": {
        "cost_centre": "cc-0", "quota": {m: 0 for m in _models(data)}}}}))
    for team in data["teams"].values():
        for model, c in cap.items():
            share = c["on-prem"] // teams
            team["quota"][model] = share
            team["borrowing_limit"][model] = share
    return loader.parse(data)


def _models(data: dict[str, Any]) -> list[str]:
    return sorted({c["gpu"]["model"] for c in data["node_classes"].values() if c.get("gpu")})


def measure(nodes: int) -> dict[str, Any]:
    desc = synthetic(nodes)
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
            "seconds": round(seconds, 3),
            "ms_per_resource": round(1000 * seconds / len(run.resources), 3),
            "peak_traced_mib": round(peak / 2**20, 1)}


def main() -> dict[str, Any]:
    plan.declare(synthetic(SIZES[0]), "warmup")  # imports pulumi_aws modules once
    rows = [measure(n) for n in SIZES]
    for r in rows:
        print(f"{r['nodes']:>5} nodes {r['teams']:>3} teams {r['resources']:>5} resources "
              f"{r['seconds']:>7.3f} s {r['ms_per_resource']:>6.2f} ms/resource "
              f"peak {r['peak_traced_mib']:>6.1f} MiB")
    figures = {"sizes": rows,
               "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
               "target_1000_nodes_s": 5.0,
               "meets_target": rows[-1]["seconds"] < 5.0,
               "linear_ratio_1000_vs_100": round(
                   rows[-1]["ms_per_resource"] / rows[1]["ms_per_resource"], 2)}
    path = bench.write("plan", figures)
    print(f"wrote {path}")
    return figures
