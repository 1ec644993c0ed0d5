"""Facts derived from a valid description, shared by every renderer (Pulumi, Ansible,
Slurm, Kueue, the acceptance gate). Nothing here may be typed twice elsewhere."""

from __future__ import annotations

import ipaddress
import re
from collections import defaultdict
from dataclasses import dataclass

from gpupool.spec.catalog import GPU_MODELS, INSTANCE_TYPES, InstanceType
from gpupool.spec.model import BurstGroup, Capacity, Description, NodeClass, NodeRole

ONPREM = "on-prem"
CAPACITY_TYPES = (ONPREM, Capacity.ON_DEMAND.value, Capacity.SPOT.value)


@dataclass(frozen=True)
class RackPlace:
    site: str
    leaf: str


def rack_places(desc: Description) -> dict[str, RackPlace]:
    return {
        rack: RackPlace(site, leaf)
        for site, s in desc.sites.items()
        for leaf, sw in s.leaf_switches.items()
        for rack in sw.racks
    }


def node_class(desc: Description, node: str) -> NodeClass:
    return desc.node_classes[desc.nodes[node].class_]


def gpu_nodes(desc: Description) -> list[str]:
    """Compute nodes that carry GPUs, in description order."""
    return [
        name for name, n in desc.nodes.items()
        if NodeRole.COMPUTE in n.roles and desc.node_classes[n.class_].gpu is not None
    ]


def controllers(desc: Description) -> list[str]:
    """The Slurm controllers in description order: the primary, then the backup (where
    failover is declared)."""
    return [n for n, node in desc.nodes.items() if NodeRole.CONTROLLER in node.roles]


def controller(desc: Description) -> str:
    """The primary controller: slurmdbd, the database, metrics and backups live there."""
    return controllers(desc)[0]


def burst_instance_types(group: BurstGroup) -> list[InstanceType]:
    return [INSTANCE_TYPES[t] for t in group.instance_types]


def burst_model(group: BurstGroup) -> str:
    return INSTANCE_TYPES[group.instance_types[0]].gpu_model


def burst_gpus_per_node(group: BurstGroup) -> int:
    # Validation guarantees every fallback type carries the same GPUs.
    return INSTANCE_TYPES[group.instance_types[0]].gpus


def burst_capacity_split(group: BurstGroup) -> dict[str, int]:
    """Maximum nodes of a burst group per capacity type."""
    spot = Capacity.SPOT in group.capacity
    on_demand = Capacity.ON_DEMAND in group.capacity
    if spot and on_demand:
        return {Capacity.ON_DEMAND.value: group.on_demand_base,
                Capacity.SPOT.value: group.max_nodes - group.on_demand_base}
    kind = Capacity.SPOT.value if spot else Capacity.ON_DEMAND.value
    return {kind: group.max_nodes}


def gpu_capacity(desc: Description) -> dict[str, dict[str, int]]:
    """GPUs per model and capacity type (on-prem, on-demand, spot)."""
    cap: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(CAPACITY_TYPES, 0))
    for node in desc.nodes.values():
        gpu = desc.node_classes[node.class_].gpu
        if gpu is not None and NodeRole.COMPUTE in node.roles:
            cap[gpu.model][ONPREM] += gpu.count
    for group in desc.burst_groups.values():
        per_node = burst_gpus_per_node(group)
        for kind, nodes in burst_capacity_split(group).items():
            cap[burst_model(group)][kind] += nodes * per_node
    return {m: dict(c) for m, c in sorted(cap.items())}


def total_gpus(desc: Description, model: str) -> int:
    return sum(gpu_capacity(desc).get(model, {}).values())


def gpu_product(model: str) -> str:
    return GPU_MODELS[model].product


# -- preemption: what the description asks for and what each scheduler can express -------

def preemption_wanted(desc: Description) -> set[tuple[str, str]]:
    """(preemptor, victim) task class pairs the description declares."""
    return {(name, victim) for name, c in desc.task_classes.items() for victim in c.preempts}


def preemption_slurm_expressible(desc: Description) -> set[tuple[str, str]]:
    """Slurm's partition_prio: every class preempts every preemptible class of lower
    priority (PriorityTier), and nothing else."""
    classes = desc.task_classes.items()
    return {(a, b) for a, ca in classes for b, cb in classes
            if ca.priority > cb.priority and cb.preemptible}


def preemption_kueue_expressible(desc: Description) -> set[tuple[str, str]]:
    """Kueue's cohort reclaim as gpupool renders it: every non-preemptible class preempts
    every preemptible class, and nothing else (or nothing preempts at all)."""
    classes = desc.task_classes.items()
    return {(a, b) for a, ca in classes if not ca.preemptible
            for b, cb in classes if cb.preemptible}


# A mount source's server part, before ":/": NFS's `host`, `[v6 address]`, or Lustre's
# NIDs (`10.0.0.1@tcp:10.0.0.2@tcp`, commas between a server's failover NIDs).
_SERVER_TOKEN = re.compile(r"\[[^\]]*\]|[^:,\[\]]+")


def mount_servers(source: str) -> list[str]:
    """The servers a network mount source names, as written (brackets and NID networks
    removed): `lab-filer:/x` -> [lab-filer], `[fd00::1]:/x` -> [fd00::1],
    `10.0.0.1@tcp:10.0.0.2@o2ib:/fs` -> [10.0.0.1, 10.0.0.2]."""
    servers = source.split(":/", 1)[0]
    return [tok.strip("[]").split("@", 1)[0] for tok in _SERVER_TOKEN.findall(servers)
            if tok.strip("[]").split("@", 1)[0]]


def node_named(desc: Description, host: str) -> str | None:
    """The node a host name or address means, however it is written: the node's name, its
    FQDN in the pool's domain (any case, a trailing dot or not), or any of its addresses
    (compared as addresses, so `fd00::0001` is `fd00::1`). None for anything else."""
    name = host.strip().rstrip(".").lower()
    if name in desc.nodes:
        return name
    suffix = "." + desc.pool.domain
    if name.endswith(suffix) and name.removesuffix(suffix) in desc.nodes:
        return name.removesuffix(suffix)
    try:
        address = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return None
    for node_name, node in desc.nodes.items():
        if any(ipaddress.ip_address(str(a)) == address for a in node.addresses.values()):
            return node_name
    return None
