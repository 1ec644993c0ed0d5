"""What a node must look like, derived from the pool description (never typed twice)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.render.flows import allowed, probe_ports
from gpupool.spec.catalog import GPU_MODELS
from gpupool.spec.facts import node_class, rack_places
from gpupool.spec.mig import is_partitioned
from gpupool.spec.model import Description, Interconnect, NodeRole


@dataclass(frozen=True)
class GpuExpect:
    model: str
    product: str
    count: int
    memory_gib: int
    nvswitch: bool
    min_bf16_tflops: float
    min_mem_bw_gbps: float
    # The class's MIG layout, instances per profile on every GPU; () where MIG is off.
    mig: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class MountExpect:
    tier: str
    path: str
    fstype: str
    options: tuple[str, ...]
    writable: bool


@dataclass(frozen=True)
class Probe:
    """A connection from a peer to this node's address on a segment they share."""

    peer: str
    segment: str
    address: str  # this node's address on the segment
    port: int
    allowed: bool

    @property
    def id(self) -> str:
        return f"{self.peer}/{self.segment}:{self.port}"


@dataclass(frozen=True)
class NodeExpect:
    node: str
    environment: str
    node_class: str
    roles: tuple[str, ...]
    leaf: str
    addresses: dict[str, str]
    mtu: dict[str, int]
    gpu: GpuExpect | None
    software: dict[str, str]
    mounts: tuple[MountExpect, ...]
    teams: tuple[str, ...]
    probes: tuple[Probe, ...] = field(default=())

    @property
    def lab(self) -> bool:
        return self.environment == "lab"


def _gpu(desc: Description, node: str) -> GpuExpect | None:
    gpu = node_class(desc, node).gpu
    if gpu is None or NodeRole.COMPUTE not in desc.nodes[node].roles:
        return None
    model = GPU_MODELS[gpu.model]
    layout = tuple(sorted(gpu.mig_profiles.items())) if is_partitioned(gpu) else ()
    return GpuExpect(gpu.model, model.product, gpu.count, gpu.memory_gib,
                     gpu.interconnect is Interconnect.NVSWITCH, model.min_bf16_tflops,
                     model.min_mem_bw_gbps, layout)


def node_expect(desc: Description, node: str) -> NodeExpect:
    n = desc.nodes[node]
    compute = NodeRole.COMPUTE in n.roles
    mounts = tuple(
        MountExpect(name, t.mount.path, t.mount.fstype.value, tuple(t.mount.options),
                    "ro" not in t.mount.options)
        for name, t in desc.storage_tiers.items()
        if t.mount is not None and compute)
    # Inbound: what this node's own firewall lets in, probed from one peer per segment.
    probes = tuple(
        Probe(peer, seg, addr, port, allowed(desc, peer, node, seg, port))
        for seg, addr in n.addresses.items()
        for peer in [next((p for p, pn in desc.nodes.items()
                           if p != node and seg in pn.addresses), None)] if peer
        for port in probe_ports(desc))
    return NodeExpect(
        node=node,
        environment=desc.pool.environment,
        node_class=n.class_,
        roles=tuple(r.value for r in n.roles),
        leaf=rack_places(desc)[n.rack].leaf,
        addresses=dict(n.addresses),
        mtu={s: desc.network.segments[s].mtu for s in n.addresses},
        gpu=_gpu(desc, node),
        software=desc.software.model_dump(exclude={"blocklist"}),
        mounts=mounts,
        teams=tuple(desc.teams),
        probes=probes,
    )
