"""Acceptance gate time per node, quick and standard tiers, on the lab.

Brings the lab up with its roles (site.yml, slurm.yml), then gates one node alone and
every node at once, and writes bench/results/gate.json.

    python -m bench gate
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench
from gpupool.gate import runner
from gpupool.lab import hosts, slurm_cluster
from gpupool.spec import loader

TIERS = ("quick", "standard")
SHAPE = {"stack": str, "tiers": {str: {
    "nodes": int, "one_node_s": float, "all_nodes_parallel_s": float,
    "verdicts": {str: str}, "checks_per_node": {str: {str: int}}}}}


def main() -> int:
    desc = loader.load_stack("lab")
    assert desc.source is not None
    tiers: dict[str, Any] = {}
    with hosts.lab_lock():
        slurm_cluster.bring_up(desc, site=True)
        inv = hosts.inventory_path(desc)
        nodes = list(desc.nodes)
        with tempfile.TemporaryDirectory() as tmp:
            for tier in TIERS:
                t = time.monotonic()
                one = runner.gate(desc.source, [runner.ansible_target(nodes[-1], inv)], tier,
                                  Path(tmp) / f"{tier}-one")
                one_s = time.monotonic() - t
                t = time.monotonic()
                every = runner.gate(desc.source, [runner.ansible_target(n, inv) for n in nodes],
                                    tier, Path(tmp) / f"{tier}-all")
                tiers[tier] = {"nodes": len(nodes), "one_node_s": round(one_s, 2),
                               "all_nodes_parallel_s": round(time.monotonic() - t, 2),
                               "verdicts": {r["node"]: r["verdict"] for r in one + every},
                               "checks_per_node": {r["node"]: r["counts"] for r in every}}
    figures = {"stack": "lab", "tiers": tiers}
    print(f"wrote {bench.write('gate', figures, 'python -m bench gate')}")
    failed = [n for t in tiers.values() for n, v in t["verdicts"].items() if v != "pass"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
