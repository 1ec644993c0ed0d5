"""What may talk to what, derived from the declared network flows.

A flow {from: X, to: Y, protocol, ports} lets the hosts of segment X open connections to
addresses in segment Y on those ports, from their address in X: a source is a host's
address in the flow's source segment, never all its addresses (a node's management address
is no training source). A host reaching a segment it sits on speaks from its own address
there, so NFS from a node's storage interface is a storage-to-storage flow. Burst nodes
take part through the source segment's cloud CIDR, and the admin CIDRs count as members
of the management segment. A flow of protocol `all` from any segment but management leaves
the management plane's ports closed (catalog.MANAGEMENT_PLANE_PORTS: sshd, Slurm's daemons,
the exporters); only a flow naming one opens it. Everything else between pool hosts is
dropped. The hardening role's firewall and the acceptance gate's network checks both come
from these functions.

Sources are kept per source segment (`segment_sources`, computed once per render) and
allowances name the segment they come from, so the inventory grows linearly with the pool:
every host's firewall refers to the pool-wide sets instead of carrying its own copy.

Slurm adds one: srun's ports (catalog.SRUN_PORTS, slurm.conf SrunPortRange) on the hosts
that run srun (login nodes, and compute nodes, where a batch script launches its steps),
from every Slurm host's management address (slurmctld, and the slurmstepd of each node
of a step, connect back to srun) and the burst nodes' block. Without it a step spanning
nodes never hears from the far node's tasks, and srun waits forever.

A declared Kubernetes cluster adds its own allowances, on the nodes' management
addresses (kubelet's node IP) and only on the nodes of the cluster: the API server from
the cluster's nodes and the admin ranges, etcd between control-plane nodes, kubelet from
the control plane, and the pod network's ports between the cluster's nodes. Their sources
are the pseudo segments KUBERNETES_* in segment_sources(). Burst nodes, workers too, come
from their subnets' block; their security groups' side is cloud.network.kubernetes_rules().

A declared image registry adds its port on its host's management address, from the
compute and login nodes' management addresses and the burst nodes' block (REGISTRY_CLIENTS).

A burst node's own host firewall (the image's) is burst_inbound(): the same allowances on
the burst segment, for any of its addresses, since an image serves every node. Its
security groups cannot leave ports out of a flow of protocol `all`; this keeps the
management plane closed there as on-prem.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from gpupool.spec.catalog import (
    API_SERVER_PORT,
    BGP_PORT,
    BURST_SEGMENT,
    CILIUM_HEALTH_PORT,
    ETCD_PORTS,
    KUBELET_PORT,
    MANAGEMENT_SEGMENT,
    SRUN_PORTS,
    VXLAN_PORT,
    closed_to_all_flows,
)
from gpupool.spec.model import Cni, Description, NodeRole

ALL_PORTS = "all"
# Kubernetes' ports (gpupool/spec/catalog.py, which validation reads too).
API_SERVER = API_SERVER_PORT
KUBELET = KUBELET_PORT
ETCD = ETCD_PORTS
# The pod network's node-to-node ports, per CNI: flannel's and Cilium's VXLAN use the
# Linux default port 8472 (not IANA's 4789); Calico here routes pods natively over BGP
# (no IP-in-IP or VXLAN encapsulation); Cilium's agents health-check each other on 4240.
CNI_PORTS: dict[Cni, tuple[tuple[str, tuple[int, ...]], ...]] = {
    Cni.FLANNEL: (("udp", (VXLAN_PORT,)),),
    Cni.CALICO: (("tcp", (BGP_PORT,)),),
    Cni.CILIUM: (("udp", (VXLAN_PORT,)), ("tcp", (CILIUM_HEALTH_PORT,))),
}
KUBERNETES_NODES = "kubernetes-nodes"
KUBERNETES_CONTROL_PLANE = "kubernetes-control-plane"
KUBERNETES_API_CLIENTS = "kubernetes-api-clients"
KUBERNETES_SEGMENT = "management"  # where kubelet's node IP and the API server live


@dataclass(frozen=True)
class Allowance:
    segment: str  # the destination segment (the interface a packet arrives on)
    source_segment: str  # the flow's source: its addresses are segment_sources()[it]
    sources: tuple[str, ...]  # addresses or CIDRs allowed in
    protocol: str  # tcp | udp | all
    ports: tuple[int, ...]  # empty with protocol all
    closed: tuple[int, ...] = ()  # with protocol all: TCP ports it leaves closed
    port_ranges: tuple[tuple[int, int], ...] = ()  # first and last port, each included

    def admits(self, port: int) -> bool:
        """Does it let a TCP connection to this port in?"""
        if self.protocol == ALL_PORTS:
            return port not in self.closed
        return self.protocol == "tcp" and (
            port in self.ports or any(lo <= port <= hi for lo, hi in self.port_ranges))


def host_addresses(desc: Description, node: str) -> list[str]:
    return sorted(desc.nodes[node].addresses.values())


def segment_sources(desc: Description) -> dict[str, tuple[str, ...]]:
    """Per segment that is a flow's source: each host's address in it, its cloud CIDR
    (burst nodes), and for management the admin CIDRs. One pass over the hosts."""
    wanted = {f.from_ for f in desc.network.flows}
    found: dict[str, set[str]] = {s: set() for s in sorted(wanted)}
    for node in desc.nodes.values():
        for segment in wanted & node.addresses.keys():
            found[segment].add(node.addresses[segment])
    for segment, addresses in found.items():
        cloud = desc.network.segments[segment].cloud_cidr if (
            segment in desc.network.segments) else None
        if cloud:
            addresses.add(cloud)
        if segment == "management":
            addresses.update(desc.network.admin_cidrs)
    out = {s: tuple(sorted(a)) for s, a in found.items()}
    return out | slurm_sources(desc) | kubernetes_sources(desc) | registry_sources(desc)


SLURM_HOSTS = "slurm-hosts"  # pseudo segment: where srun's steps and slurmctld answer from


def _burst_block(desc: Description) -> list[str]:
    """The block burst nodes' one address comes from, where the pool bursts."""
    segment = desc.network.segments.get(BURST_SEGMENT)
    return ([segment.cloud_cidr] if desc.burst_groups and segment is not None
            and segment.cloud_cidr else [])


def slurm_sources(desc: Description) -> dict[str, tuple[str, ...]]:
    """Who connects to srun's ports: every Slurm host's management address and the burst
    nodes' block."""
    hosts = {n.addresses[MANAGEMENT_SEGMENT] for n in desc.nodes.values()
             if MANAGEMENT_SEGMENT in n.addresses}
    return {SLURM_HOSTS: tuple(sorted(hosts | set(_burst_block(desc))))}


def _srun(segment: str, sources: dict[str, tuple[str, ...]]) -> Allowance:
    return Allowance(segment, SLURM_HOSTS, sources[SLURM_HOSTS], "tcp", (),
                     port_ranges=(SRUN_PORTS,))


def slurm_inbound(desc: Description, node: str,
                  sources: dict[str, tuple[str, ...]]) -> list[Allowance]:
    """srun's ports on a host that runs srun: a login node, or a compute node (its batch
    scripts' steps); nothing on a controller-only host."""
    n = desc.nodes[node]
    if not {NodeRole.COMPUTE, NodeRole.LOGIN} & set(n.roles) or (
            MANAGEMENT_SEGMENT not in n.addresses):
        return []
    return [_srun(MANAGEMENT_SEGMENT, sources)]


REGISTRY_CLIENTS = "registry-clients"  # pseudo segment: the nodes that pull images


def registry_sources(desc: Description) -> dict[str, tuple[str, ...]]:
    """Who pulls from the declared image registry: the compute and login nodes' management
    addresses and the burst nodes' block (over the hybrid link); none without a registry."""
    if desc.image_registry is None:
        return {}
    hosts = {n.addresses[MANAGEMENT_SEGMENT] for n in desc.nodes.values()
             if {NodeRole.COMPUTE, NodeRole.LOGIN} & set(n.roles)
             and MANAGEMENT_SEGMENT in n.addresses}
    return {REGISTRY_CLIENTS: tuple(sorted(hosts | set(_burst_block(desc))))}


def registry_inbound(desc: Description, node: str,
                     sources: dict[str, tuple[str, ...]]) -> list[Allowance]:
    """The registry's port on its host's management address, from the nodes that pull;
    nothing on other hosts."""
    reg = desc.image_registry
    if reg is None or reg.host != node:
        return []
    return [Allowance(MANAGEMENT_SEGMENT, REGISTRY_CLIENTS, sources[REGISTRY_CLIENTS], "tcp",
                      (reg.port,))]


def kubernetes_member(desc: Description, node: str) -> bool:
    """Is an on-prem node one of the declared cluster's: control plane or compute?"""
    k8s = desc.kubernetes
    return k8s is not None and (node in k8s.control_plane
                                or NodeRole.COMPUTE in desc.nodes[node].roles)


def kubernetes_sources(desc: Description) -> dict[str, tuple[str, ...]]:
    """The Kubernetes pseudo segments' addresses; none without a declared cluster."""
    k8s = desc.kubernetes
    if k8s is None:
        return {}
    # Burst nodes are workers too: kubelet's node IP is their one address, in a subnet of
    # the burst segment's cloud block.
    cloud = _burst_block(desc)
    nodes = sorted({desc.nodes[n].addresses[KUBERNETES_SEGMENT]
                    for n in desc.nodes if kubernetes_member(desc, n)} | set(cloud))
    control = sorted({desc.nodes[n].addresses[KUBERNETES_SEGMENT] for n in k8s.control_plane})
    return {KUBERNETES_NODES: tuple(nodes), KUBERNETES_CONTROL_PLANE: tuple(control),
            KUBERNETES_API_CLIENTS: tuple(sorted({*nodes, *desc.network.admin_cidrs}))}


def kubernetes_inbound(desc: Description, node: str,
                       sources: dict[str, tuple[str, ...]]) -> list[Allowance]:
    """What one node of the cluster must let in for Kubernetes; nothing on other nodes."""
    k8s = desc.kubernetes
    if k8s is None or not kubernetes_member(desc, node):
        return []
    out = []
    if node in k8s.control_plane:
        out += [Allowance(KUBERNETES_SEGMENT, source, sources[source], "tcp", ports)
                for source, ports in ((KUBERNETES_API_CLIENTS, (API_SERVER,)),
                                      (KUBERNETES_CONTROL_PLANE, ETCD))]
    return out + _kubernetes_worker(k8s.cni, KUBERNETES_SEGMENT, sources)


def _kubernetes_worker(cni: Cni, segment: str,
                       sources: dict[str, tuple[str, ...]]) -> list[Allowance]:
    """A worker's part, on its kubelet node IP's segment: kubelet from the control plane,
    the pod network from the cluster's nodes."""
    return [Allowance(segment, KUBERNETES_CONTROL_PLANE, sources[KUBERNETES_CONTROL_PLANE],
                      "tcp", (KUBELET,)),
            *(Allowance(segment, KUBERNETES_NODES, sources[KUBERNETES_NODES], protocol, ports)
              for protocol, ports in CNI_PORTS[cni])]


def _flows_into(desc: Description, segments: set[str],
                sources: dict[str, tuple[str, ...]]) -> list[Allowance]:
    """The declared flows to addresses in these segments."""
    return [Allowance(flow.to, flow.from_, sources[flow.from_], flow.protocol,
                      tuple(flow.ports),
                      closed_to_all_flows(flow.from_) if flow.protocol == ALL_PORTS else ())
            for flow in desc.network.flows if flow.to in segments]


def inbound(desc: Description, node: str,
            sources: dict[str, tuple[str, ...]] | None = None) -> list[Allowance]:
    """The inbound allowances of one node, per destination segment it sits on. Pass the
    render's segment_sources() when calling this for many nodes."""
    sources = segment_sources(desc) if sources is None else sources
    return (_flows_into(desc, set(desc.nodes[node].addresses), sources)
            + slurm_inbound(desc, node, sources) + kubernetes_inbound(desc, node, sources)
            + registry_inbound(desc, node, sources))


def burst_inbound(desc: Description,
                  sources: dict[str, tuple[str, ...]] | None = None) -> list[Allowance]:
    """A burst node's inbound, on its one address (in the burst segment's cloud block):
    the flows to the burst segment, srun's ports, and, where a cluster is declared, a
    worker's Kubernetes ports. Its security groups (cloud.network.firewall_rules) admit the same
    at the segment's grain; this, its host firewall, keeps what they cannot say: a flow of
    protocol `all` leaves the management plane's ports closed, as on-prem. Empty where the
    pool does not burst."""
    if not desc.burst_groups or BURST_SEGMENT not in desc.network.segments:
        return []
    sources = segment_sources(desc) if sources is None else sources
    out = [*_flows_into(desc, {BURST_SEGMENT}, sources), _srun(BURST_SEGMENT, sources)]
    if desc.kubernetes is not None:
        out += _kubernetes_worker(desc.kubernetes.cni, BURST_SEGMENT, sources)
    return out


def allowed(desc: Description, src: str, dst: str, segment: str, port: int) -> bool:
    """May node src open a TCP connection to node dst's address in segment on port? src
    speaks from its own address in that segment where it has one (the kernel picks the
    interface on the destination's subnet), else from any of its addresses."""
    mine = desc.nodes[src].addresses
    src_addrs = [ipaddress.ip_address(a) for a in (
        [mine[segment]] if segment in mine else host_addresses(desc, src))]
    return any(
        a.segment == segment
        and any(ip in ipaddress.ip_network(s) for ip in src_addrs for s in a.sources)
        and a.admits(port)
        for a in inbound(desc, dst))


def canary_port(desc: Description) -> int:
    """A TCP port no flow names: open only where a flow of protocol `all` admits it."""
    declared = {p for f in desc.network.flows for p in f.ports}
    return next(p for p in range(8081, 65535) if p not in declared)


def probe_ports(desc: Description) -> list[int]:
    """Ports worth probing: every declared TCP port plus one that no flow names."""
    return sorted({*(p for f in desc.network.flows for p in f.ports), canary_port(desc)})


def _as_vars(a: Allowance, address: str) -> dict[str, object]:
    return {"segment": a.segment, "source_segment": a.source_segment,
            "protocol": a.protocol,
            "ports": [*a.ports, *(f"{lo}-{hi}" for lo, hi in a.port_ranges)],
            "closed": list(a.closed), "address": address}


def inbound_vars(desc: Description, node: str,
                 sources: dict[str, tuple[str, ...]]) -> list[dict[str, object]]:
    """inbound() as plain data for the hardening role's firewall template: without the
    source addresses, which the template takes from the pool-wide gpupool_flow_sources."""
    return [_as_vars(a, desc.nodes[node].addresses[a.segment])
            for a in inbound(desc, node, sources)]


def burst_inbound_vars(desc: Description,
                       sources: dict[str, tuple[str, ...]]) -> list[dict[str, object]]:
    """burst_inbound() for the template, with no address: an image serves every burst node,
    whose one address EC2 gives at launch (the template then matches any destination)."""
    return [_as_vars(a, "") for a in burst_inbound(desc, sources)]
