"""Network: nothing open to the world, segments talk only along declared flows,
management only from the admin CIDRs."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from gpupool.render import cloud
from gpupool.spec.model import Description
from policies.core import Level, Res, resource_policy, tags_of
from policies.types import (
    AWS_EGRESS,
    AWS_INGRESS,
    AWS_LEGACY_RULE,
    AWS_SECURITY_GROUP,
    K8S_NETPOL,
)

ANYWHERE = ("0.0.0.0/0", "::/0")


def _port_text(r: dict) -> str:
    if r.get("ipProtocol") in ("-1", "all") or r.get("protocol") in ("-1", "all"):
        return "all traffic"
    return f"port {r.get('fromPort')}"


def _open_sources(r: Res) -> Iterator[tuple[str, str]]:
    """(source, what) pairs of r's ingress that admit the whole internet."""
    p = r.props
    if r.type == AWS_INGRESS:
        for cidr in (p.get("cidrIpv4"), p.get("cidrIpv6")):
            if cidr in ANYWHERE:
                yield cidr, _port_text(p)
    elif r.type == AWS_LEGACY_RULE and p.get("type") == "ingress":
        for cidr in [*(p.get("cidrBlocks") or []), *(p.get("ipv6CidrBlocks") or [])]:
            if cidr in ANYWHERE:
                yield cidr, _port_text(p)
    elif r.type == AWS_SECURITY_GROUP:
        for rule in p.get("ingress") or []:
            for cidr in [*(rule.get("cidrBlocks") or []), *(rule.get("ipv6CidrBlocks") or [])]:
                if cidr in ANYWHERE:
                    yield cidr, _port_text(rule)
    elif r.type == K8S_NETPOL:
        for rule in (p.get("spec") or {}).get("ingress") or []:
            for peer in rule.get("from") or []:
                cidr = (peer.get("ipBlock") or {}).get("cidr")
                if cidr in ANYWHERE:
                    yield cidr, "pods"


@resource_policy("network-no-open-ingress", "network", Level.MANDATORY,
                 "No ingress from 0.0.0.0/0 or ::/0, in security groups or network policies.")
def no_open_ingress(r: Res, desc: Description) -> Iterator[str]:
    for cidr, what in _open_sources(r):
        yield f"ingress from {cidr} (the whole internet) to {what}"


def _allowed(desc: Description) -> set[tuple[str, str, str, str, int | None]]:
    allowed = {(f.segment, f.direction, f.peer_segment or f.peer_cidr or "", f.protocol, f.port)
               for f in cloud.firewall_rules(desc)}
    allowed |= cloud.service_rules(desc)
    return allowed


@resource_policy("network-declared-flows-only", "network", Level.MANDATORY,
                 "Security group rules open exactly the flows the description declares.",
                 (AWS_INGRESS, AWS_EGRESS))
def declared_flows(r: Res, desc: Description) -> Iterator[str]:
    p, tags = r.props, tags_of(r)
    direction = "ingress" if r.type == AWS_INGRESS else "egress"
    segment = tags.get("segment")
    if segment is None:
        yield f"{direction} rule has no segment tag, so no declared flow can justify it"
        return
    peer = p.get("cidrIpv4") or p.get("cidrIpv6") or tags.get("peer", "")
    port = p.get("fromPort")
    if p.get("toPort", port) != port:
        yield f"{direction} rule opens the port range {port}-{p.get('toPort')}; flows name ports"
    key = (segment, direction, peer, p.get("ipProtocol"), port)
    if key not in _allowed(desc):
        yield (f"{direction} rule on segment {segment} with {peer or 'an unknown peer'} "
               f"({p.get('ipProtocol')} {port if port is not None else 'all'}) matches no "
               "declared flow")


def management_ports(desc: Description) -> set[int]:
    """Ports only management flows use: SSH, daemons, exporters."""
    mgmt = {p for f in desc.network.flows if f.from_ == "management" for p in f.ports}
    other = {p for f in desc.network.flows if f.from_ != "management" for p in f.ports}
    return mgmt - other


def _within(cidr: str, blocks: list[str]) -> bool:
    net = ipaddress.ip_network(cidr, strict=False)
    return any(net.version == ipaddress.ip_network(b).version
               and net.subnet_of(ipaddress.ip_network(b)) for b in blocks)


@resource_policy("network-management-from-admin-cidrs", "network", Level.MANDATORY,
                 "Management ports (SSH, daemons, exporters) accept address blocks only "
                 "inside the declared admin CIDRs (or the cloud management segment).",
                 (AWS_INGRESS,))
def management_from_admin(r: Res, desc: Description) -> Iterator[str]:
    cidr = r.props.get("cidrIpv4") or r.props.get("cidrIpv6")
    port = r.props.get("fromPort")
    if cidr is None or port not in management_ports(desc):
        return
    mgmt = desc.network.segments.get("management")
    blocks = list(desc.network.admin_cidrs) + ([mgmt.cloud_cidr] if mgmt and mgmt.cloud_cidr
                                               else [])
    if not _within(cidr, blocks):
        yield (f"management port {port} is reachable from {cidr}, outside the admin CIDRs "
               f"{', '.join(desc.network.admin_cidrs)}")
