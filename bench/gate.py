"""Acceptance gate time per node, quick and standard tiers, on the lab.

Brings the lab up with its roles (site.yml, slurm.yml), then gates one node alone and
every node at once, and writes bench/results/gate.json.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from gpupool.gate import runner
from gpupool.lab import hosts, slurm_cluster
from gpupool.spec import loader

RESULTS = Path(__file__).parent / "results" / "gate.json"


def main() -> None:
    desc = loader.load_stack("lab")
    assert desc.source is not None
    figures: dict[str, object] = {}
    with hosts.lab_lock():
        slurm_cluster.bring_up(desc, site=True)
        inv = hosts.inventory_path(desc)
        nodes = list(desc.nodes)
        with tempfile.TemporaryDirectory() as tmp:
            for tier in ("quick", "standard"):
                t = time.monotonic()
                one = runner.gate(desc.source, [runner.ansible_target(nodes[-1], inv)], tier,
                                  Path(tmp) / f"{tier}-one")
                figures[f"{tier}_one_node_s"] = round(time.monotonic() - t, 2)
                t = time.monotonic()
                every = runner.gate(desc.source, [runner.ansible_target(n, inv) for n in nodes],
                                    tier, Path(tmp) / f"{tier}-all")
                figures[f"{tier}_all_{len(nodes)}_nodes_s"] = round(time.monotonic() - t, 2)
                figures[f"{tier}_verdicts"] = {r["node"]: r["verdict"] for r in one + every}
                figures[f"{tier}_checks_per_node"] = {r["node"]: r["counts"] for r in every}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    print(json.dumps(figures, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
