"""How the Ansible inventory scales: `ansible-inventory --list` over synthetic pools of 100,
1,000 and 3,000 nodes (bench/plan.py's), as AWX and Semaphore sync an inventory, through
the inventory plugin of a project `gpupool init` made and through the static file
`gpupool inventory -o` writes; `--list --export` beside it (group variables written once).
Each is one process, measured by its own rusage: CPU seconds, peak memory and the size of
what it printed. Targets (issue 52): under 10 CPU-s and 1 GiB at 1,000 nodes through the
plugin, and linear growth (3,000 nodes: about 3x).

    python -m bench inventory        # writes bench/results/inventory.json
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

import bench
from bench.plan import synthetic_raw

SIZES = (100, 1000, 3000)
STACK = "bench"
TARGET_CPU_S, TARGET_RSS_MIB = 10.0, 1024.0
TIMEOUT_S = 900
# What is listed: (name, ansible-inventory arguments after the binary).
LISTINGS = {"plugin --list": ["--list"], "plugin --list --export": ["--list", "--export"],
            "static --list": ["-i", "inventory.yml", "--list"]}
MEASURE = {"wall_s": float, "cpu_s": float, "peak_rss_mib": float, "output_mib": float,
           "exit": int}
SHAPE = {"sizes": [{"nodes": int, "listings": {str: MEASURE}}],
         "target_cpu_s_1000_nodes": float, "target_rss_mib_1000_nodes": float,
         "plugin_list_cpu_s_1000_nodes": float, "plugin_list_rss_mib_1000_nodes": float,
         "meets_target": bool, "cpu_growth_3000_vs_1000": {str: float}}


def project(folder: Path, nodes: int) -> Path:
    """A pool project as `gpupool init` makes it, its stack's description a synthetic pool,
    and the static inventory `gpupool inventory -o` writes beside it."""
    gpupool = [sys.executable, "-m", "gpupool"]
    where = folder / f"pool-{nodes}"
    bench.measured([*gpupool, "init", str(where), "--stack", STACK], folder, TIMEOUT_S)
    (where / "pools" / f"{STACK}.yaml").write_text(
        yaml.safe_dump(synthetic_raw(nodes), sort_keys=False))
    bench.measured([*gpupool, "inventory", "--stack", STACK, "-o", "inventory.yml"], where,
                   TIMEOUT_S)
    return where


def measure(nodes: int, folder: Path) -> dict[str, Any]:
    where = project(folder, nodes)
    ansible_inventory = str(Path(sys.executable).parent / "ansible-inventory")
    listings = {name: bench.measured([ansible_inventory, *args], where, TIMEOUT_S,
                                     stdout=folder / "listing.json")
                for name, args in LISTINGS.items()}
    return {"nodes": nodes, "listings": listings}


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(n, Path(tmp)) for n in SIZES]
    for r in rows:
        print(f"{r['nodes']:>5} nodes: " + "  ".join(
            f"{name} {m['cpu_s']:.1f} CPU-s {m['peak_rss_mib']:.0f} MiB, "
            f"{m['output_mib']:.1f} MiB out"             for name, m in r["listings"].items()))
    by_size = {r["nodes"]: r["listings"] for r in rows}
    plugin = by_size[1000]["plugin --list"]
    figures = {
        "sizes": rows, "target_cpu_s_1000_nodes": TARGET_CPU_S,
        "target_rss_mib_1000_nodes": TARGET_RSS_MIB,
        "plugin_list_cpu_s_1000_nodes": plugin["cpu_s"],
        "plugin_list_rss_mib_1000_nodes": plugin["peak_rss_mib"],
        "meets_target": (plugin["exit"] == 0 and plugin["cpu_s"] < TARGET_CPU_S
                         and plugin["peak_rss_mib"] < TARGET_RSS_MIB),
        # 3.0 is linear: three times the nodes, three times the CPU.
        "cpu_growth_3000_vs_1000": {
            name: round(by_size[3000][name]["cpu_s"] / by_size[1000][name]["cpu_s"], 2)
            for name in LISTINGS}}
    failed = [f"{n} nodes {name}" for n, listed in by_size.items()
              for name, m in listed.items() if m["exit"]]
    print(f"wrote {bench.write('inventory', figures, 'python -m bench inventory')}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
