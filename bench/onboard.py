"""Onboarding benchmark: bare lab hosts -> converged and admitted (playbooks/onboard.yml)
for 1, 3 and 5 new GPU nodes joining a running pool, and the idempotent re-run time.
Writes bench/results/onboard.json.

The pool the nodes join is converged first and is not timed: the controller (Slurm, the
verdict record) and one resident GPU node, which the acceptance gate uses as the new
nodes' probe peer on the training segment, as it would in a pool already serving.

Beside wall-clock time it records CPU time: the whole machine's busy time (/proc/stat),
each lab host's own (its cgroup), and the rest, which is the control side (Ansible, SSH,
podman). Every lab host shares this machine's cores; in a real pool each node runs its own
share on its own CPUs, so the split says which part of the work grows with hosts on the
control host and which part each node brings along. Each role's seconds come with them,
and each run's output with its slowest tasks stays in .cache/onboard/.

The benchmark pool is the lab stack widened to six GPU nodes (clones of lab-gpu1 with the
next addresses) and moved to its own address space (10.231.* -> 10.251.*) and name, so it
never collides with a running `make lab`. It takes the lab lock for its whole run.

    python -m bench onboard                   # sizes 1, 3 and 5
    python -m bench.onboard [--sizes 1 3 5]
"""

from __future__ import annotations

import argparse
import copy
import ipaddress
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import bench
from gpupool.lab import hosts as lab_hosts
from gpupool.spec import loader
from gpupool.spec.model import Description
from tests.integration.conftest import ROLE_TIME, ansible_playbook

TEMPLATE_NODE = "lab-gpu1"
_COST = {"wall_s": float, "machine_cpu_s": float, "cores_busy": float, "new_hosts_cpu_s": float,
         "pool_hosts_cpu_s": float, "control_cpu_s": float, "per_new_host_cpu_s": float,
         "control_cpu_per_new_host_s": float}
SHAPE = {"pool": str,
         "runs": [{"hosts": int, "lab_up_s": float, "converge_s": float, "rerun_s": float,
                   "converge": _COST, "rerun": _COST, "converge_roles_s": {str: float},
                   "rerun_roles_s": {str: float}, "converge_failed": int,
                   "rerun_changed": int, "rerun_failed": int}],
         "scaling": ({"largest": int, "ratio_to_1": float, "cpu_floor_ratio_to_1": float,
                      "target_ratio": float}, None)}


def bench_description(gpu_nodes: int) -> Description:
    raw = lab_hosts.relocate(
        yaml.safe_load(loader.description_path("lab", bench.ROOT).read_text()), "bench", 20)
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


@dataclass
class Sample:
    """Wall-clock and CPU seconds spent while one playbook ran."""

    wall_s: float
    machine_cpu_s: float
    host_cpu_s: dict[str, float]  # per lab host, from its cgroup

    def cpu(self, hosts: list[str]) -> float:
        return sum(self.host_cpu_s[h] for h in hosts)

    def as_dict(self, new: list[str]) -> dict[str, float]:
        control = self.machine_cpu_s - sum(self.host_cpu_s.values())
        return {"wall_s": round(self.wall_s, 1), "machine_cpu_s": round(self.machine_cpu_s, 1),
                "cores_busy": round(self.machine_cpu_s / self.wall_s, 2),
                "new_hosts_cpu_s": round(self.cpu(new), 1),
                "pool_hosts_cpu_s": round(sum(self.host_cpu_s.values()) - self.cpu(new), 1),
                "control_cpu_s": round(control, 1),
                "per_new_host_cpu_s": round(self.cpu(new) / len(new), 1),
                "control_cpu_per_new_host_s": round(control / len(new), 1)}


# Each role's time (profile_roles) goes with the figures; each task's (profile_tasks, the
# slowest 40) to the run's log in LOGS, beside its whole output, to see where it went.
PROFILE = {"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_roles,ansible.posix.profile_tasks",
           "PROFILE_ROLES_SUMMARY_ONLY": "true", "PROFILE_TASKS_SUMMARY_ONLY": "true",
           "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "40"}
LOGS = bench.ROOT / ".cache" / "onboard"


def onboard(inv: Path, hosts: list[str], log: str) -> Any:
    """onboard.yml for hosts, profiled; its output kept in LOGS/<log>.log."""
    out = ansible_playbook(inv, "playbooks/onboard.yml", "--limit", ",".join(hosts), env=PROFILE)
    LOGS.mkdir(parents=True, exist_ok=True)
    (LOGS / f"{log}.log").write_text(out.output)
    return out


def roles_s(output: str) -> dict[str, float]:
    """profile_roles' summary: seconds per role of the project (task lines are not roles)."""
    return {m[1]: float(m[2]) for m in ROLE_TIME.finditer(output)
            if (bench.ROOT / "roles" / m[1]).is_dir()}


def timed(desc: Description, fn: Any, *args: Any) -> tuple[Any, Sample]:
    """fn(*args) and what it cost: wall-clock, the machine's and each running host's CPU."""
    def hosts() -> dict[str, float]:
        return {n: c for n in desc.nodes if (c := lab_hosts.host_cpu_s(desc, n)) is not None}

    t, c, h = time.monotonic(), cpu_busy_s(), hosts()
    out = fn(*args)
    after = hosts()
    return out, Sample(time.monotonic() - t, cpu_busy_s() - c,
                       {n: after[n] - h.get(n, 0.0) for n in after})


def run(sizes: list[int]) -> dict[str, Any]:
    # The widened description is a temporary file that the inventory and the gate read
    # during the run; it goes with the run.
    desc = bench_description(max(sizes) + 1)
    try:
        return measure(desc, sizes)
    finally:
        if desc.source is not None:
            desc.source.unlink(missing_ok=True)


def measure(desc: Description, sizes: list[int]) -> dict[str, Any]:
    gpu = [n for n, node in desc.nodes.items() if desc.node_classes[node.class_].gpu]
    # The first GPU node is the resident peer: the gate probes from the first other node
    # on a segment, so every new node's training-segment peer is a converged one.
    pool = [n for n in desc.nodes if n not in gpu] + gpu[:1]
    results: dict[str, Any] = {"pool": "lab stack widened to 6 GPU nodes: the controller and "
                                       "one resident GPU node converged, then N new nodes "
                                       "onboarded", "runs": [], "scaling": None}
    with lab_hosts.lab_lock():
        lab_hosts.down(desc)
        for n in sizes:
            hosts = gpu[1:n + 1]
            t0 = time.monotonic()
            lab_hosts.up(desc, nodes=pool + hosts)
            up_s = time.monotonic() - t0
            inv = lab_hosts.inventory_path(desc)
            ready = ansible_playbook(inv, "playbooks/site.yml", "--limit", ",".join(pool))
            if ready.rc != 0:
                raise SystemExit(f"the pool did not converge:\n{ready.output[-3000:]}")
            first, converge = timed(desc, onboard, inv, hosts, f"{n}-converge")
            again, rerun = timed(desc, onboard, inv, hosts, f"{n}-rerun")
            row = {"hosts": n, "lab_up_s": round(up_s, 1), "converge_s": round(converge.wall_s, 1),
                   "rerun_s": round(rerun.wall_s, 1),
                   "converge": converge.as_dict(hosts), "rerun": rerun.as_dict(hosts),
                   "converge_roles_s": roles_s(first.output),
                   "rerun_roles_s": roles_s(again.output),
                   "converge_failed": first.total("failed"),
                   "rerun_changed": again.total("changed"),
                   "rerun_failed": again.total("failed")}
            print(json.dumps(row), flush=True)
            if first.rc != 0:
                print(first.output[-3000:])
            results["runs"].append(row)
            lab_hosts.down(desc)
    by = {r["hosts"]: r for r in results["runs"]}
    if 1 in by and (top := max(sizes)) in by:
        one, many, cores = by[1], by[top], os.cpu_count() or 1
        # The best ratio these cores allow for the CPU work measured: N hosts' work spread
        # over every core, or the one-host time, whichever is longer.
        floor = max(one["converge_s"], many["converge"]["machine_cpu_s"] / cores)
        results["scaling"] = {
            "largest": top, "ratio_to_1": round(many["converge_s"] / one["converge_s"], 2),
            "cpu_floor_ratio_to_1": round(floor / one["converge_s"], 2), "target_ratio": 1.5}
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 3, 5])
    args = p.parse_args(argv or [])
    results = run(sorted(args.sizes))
    sizes = " ".join(map(str, sorted(args.sizes)))
    print(f"wrote {bench.write('onboard', results, f'python -m bench.onboard --sizes {sizes}')}")
    failed = any(r["converge_failed"] or r["rerun_failed"] or r["rerun_changed"]
                 for r in results["runs"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
