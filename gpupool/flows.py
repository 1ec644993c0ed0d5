"""What may talk to what, derived from the declared network flows.

A flow {from: X, to: Y, protocol, ports} lets any host that has an address in segment X
open connections to addresses in segment Y on those ports, from any of its addresses
(a training node reaches the storage tier through its storage interface). Admin CIDRs
may reach the management segment on the ports of management-to-management flows.
Everything else between pool hosts is dropped. The hardening role's firewall and the
acceptance gate's network checks both come from this one function set.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.model import Description

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
        sources = sorted({a for member in segment_members(desc, flow.from_)
                          for a in host_addresses(desc, member)})
        if flow.from_ == "management" and flow.to == "management":
            sources = sorted({*sources, *desc.network.admin_cidrs})
        out.append(Allowance(flow.to, tuple(sources), flow.protocol, tuple(flow.ports)))
    return out


def allowed(desc: Description, src: str, dst: str, segment: str, port: int) -> bool:
    """May node src open a TCP connection to node dst's address in segment on port?"""
    src_addrs = set(host_addresses(desc, src))
    return any(
        a.segment == segment and src_addrs & set(a.sources)
        and (a.protocol == ALL_PORTS or (a.protocol == "tcp" and port in a.ports))
        for a in inbound(desc, dst))


def probe_ports(desc: Description) -> list[int]:
    """Ports worth probing: every declared TCP port plus one that no flow opens."""
    declared = {p for f in desc.network.flows for p in f.ports}
    canary = next(p for p in range(8081, 65535) if p not in declared)
    return sorted({*declared, canary})
