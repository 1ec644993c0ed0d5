"""What may talk to what, derived from the declared network flows.

A flow {from: X, to: Y, protocol, ports} lets any host that has an address in segment X
open connections to addresses in segment Y on those ports, from any of its addresses
(a training node reaches the storage tier through its storage interface). Burst nodes
take part through the source segment's cloud CIDR, and the admin CIDRs count as members
of the management segment. Everything else between pool hosts is dropped. The hardening
role's firewall and the acceptance gate's network checks both come from these functions.
"""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass

from gpupool.spec.model import Description

ALL_PORTS = "all"


@dataclass(frozen=True)
class Allowance:
    segment: str  # the destination segment (the interface a packet arrives on)
    sources: tuple[str, ...]  # addresses or CIDRs allowed in
    protocol: str  # tcp | udp | all
    ports: tuple[int, ...]  # empty with protocol all


def segment_members(desc: Description, segment: str) -> list[str]:
    return [n for n, node in desc.nodes.items() if segment in node.addresses]


def host_addresses(desc: Description, node: str) -> list[str]:
    return sorted(desc.nodes[node].addresses.values())


def inbound(desc: Description, node: str) -> list[Allowance]:
    """The inbound allowances of one node, per destination segment it sits on."""
    mine = desc.nodes[node].addresses
    out: list[Allowance] = []
    for flow in desc.network.flows:
        if flow.to not in mine:
            continue
        sources = {a for member in segment_members(desc, flow.from_)
                   for a in host_addresses(desc, member)}
        cloud = desc.network.segments[flow.from_].cloud_cidr
        if cloud:
            sources.add(cloud)
        if flow.from_ == "management":
            sources.update(desc.network.admin_cidrs)
        out.append(Allowance(flow.to, tuple(sorted(sources)), flow.protocol,
                             tuple(flow.ports)))
    return out


def allowed(desc: Description, src: str, dst: str, segment: str, port: int) -> bool:
    """May node src open a TCP connection to node dst's address in segment on port?"""
    src_addrs = [ipaddress.ip_address(a) for a in host_addresses(desc, src)]
    return any(
        a.segment == segment
        and any(ip in ipaddress.ip_network(s) for ip in src_addrs for s in a.sources)
        and (a.protocol == ALL_PORTS or (a.protocol == "tcp" and port in a.ports))
        for a in inbound(desc, dst))


def probe_ports(desc: Description) -> list[int]:
    """Ports worth probing: every declared TCP port plus one that no flow opens."""
    declared = {p for f in desc.network.flows for p in f.ports}
    canary = next(p for p in range(8081, 65535) if p not in declared)
    return sorted({*declared, canary})


def inbound_vars(desc: Description, node: str) -> list[dict[str, object]]:
    """inbound() as plain data for the hardening role's firewall template."""
    return [asdict(a) | {"address": desc.nodes[node].addresses[a.segment]}
            for a in inbound(desc, node)]
