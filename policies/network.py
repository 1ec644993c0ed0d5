"""Network: nothing open to the world, segments talk only along declared flows,
management only from the admin CIDRs."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from gpupool.render.cloud import launch, network
from gpupool.spec.model import Description
from policies.core import Level, Res, Stack, resource_policy, stack_policy, tags_of
from policies.types import (
    AWS_EGRESS,
    AWS_INGRESS,
    AWS_INSTANCE,
    AWS_LAUNCH_TEMPLATE,
    AWS_LEGACY_RULE,
    AWS_ROUTE_TABLE,
    AWS_ROUTE_TABLE_ASSOCIATION,
    AWS_SECURITY_GROUP,
    AWS_SUBNET,
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


def _allowed(desc: Description) -> set[tuple[str, str, str, str, int | None, int | None]]:
    """(segment, direction, peer, protocol, first port, last port) of every rule allowed."""
    allowed = {(f.segment, f.direction, f.peer, f.protocol, f.port, f.last_port)
               for f in network.firewall_rules(desc)}
    allowed |= {(*r, r[-1]) for r in network.service_rules(desc)}
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
    last = p.get("toPort", port)
    key = (segment, direction, peer, p.get("ipProtocol"), port, last)
    if key in _allowed(desc):
        return
    if last != port:
        # Only a service's own range (srun's) is one; flows name ports.
        yield (f"{direction} rule on segment {segment} with {peer or 'an unknown peer'} "
               f"opens the port range {port}-{last}, which no declared flow or service names")
    else:
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
    first = r.props.get("fromPort")
    last = r.props.get("toPort", first)
    # A range counts for every port in it.
    opened = sorted(p for p in management_ports(desc)
                    if first is not None and first <= p <= (last or first))
    if cidr is None or not opened:
        return
    port = opened[0]
    mgmt = desc.network.segments.get("management")
    blocks = list(desc.network.admin_cidrs) + ([mgmt.cloud_cidr] if mgmt and mgmt.cloud_cidr
                                               else [])
    if not _within(cidr, blocks):
        yield (f"management port {port} is reachable from {cidr}, outside the admin CIDRs "
               f"{', '.join(desc.network.admin_cidrs)}")


# Route fields that send traffic over a hybrid link (a virtual private gateway, for a VPN
# or Direct Connect, or a Transit Gateway).
LINK_TARGETS = ("gatewayId", "transitGatewayId")


def _routes_to(table: Res, address: str) -> bool:
    ip = ipaddress.ip_address(address)
    for route in table.props.get("routes") or []:
        cidr = route.get("cidrBlock")
        if not cidr or not any(route.get(t) for t in LINK_TARGETS):
            continue
        net = ipaddress.ip_network(cidr, strict=False)
        if net.version == ip.version and ip in net and net.prefixlen > 0:
            return True
    return False


@stack_policy("network-burst-subnet-routes-to-controller", "network", Level.MANDATORY,
              "Every burst subnet is associated with a route table that sends each "
              "controller's on-prem segment over the hybrid link.")
def burst_subnet_routes(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    ctls = launch.controller_addresses(desc)  # the backup too: a burst node turns to it
    tables = {r.name: r for r in stack.of_type(AWS_ROUTE_TABLE)}
    associated = {r.name for r in stack.of_type(AWS_ROUTE_TABLE_ASSOCIATION)}
    for subnet in stack.of_type(AWS_SUBNET):
        tags = tags_of(subnet)
        if tags.get("segment") not in desc.network.segments:
            continue  # not a burst subnet (the NAT gateway's public one)
        where = f"burst subnet {tags.get('Name', subnet.name)}"
        table = tables.get(tags.get("route-table", ""))
        if table is None:
            yield subnet.urn, (f"{where} names no declared route table (route-table tag "
                               f"{tags.get('route-table')!r})")
        elif subnet.name not in associated:
            yield subnet.urn, f"{where} is not associated with its route table {table.name}"
        elif missing := [f"{n} ({a})" for n, a in ctls if not _routes_to(table, a)]:
            yield subnet.urn, (f"{where} has no route to the controller {' or '.join(missing)} "
                               f"through the hybrid link: route table {table.name} sends "
                               "nothing covering it to a gateway")


def _public_ip_flags(r: Res) -> Iterator[str]:
    p = r.props
    if r.type == AWS_SUBNET and p.get("mapPublicIpOnLaunch") in (True, "true"):
        yield "maps a public IP to every instance launched in it (mapPublicIpOnLaunch)"
    elif r.type == AWS_LAUNCH_TEMPLATE:
        for i, nic in enumerate(p.get("networkInterfaces") or []):
            if str(nic.get("associatePublicIpAddress")).lower() == "true":
                yield f"network interface {i} asks for a public IP (associatePublicIpAddress)"
    elif r.type == AWS_INSTANCE and p.get("associatePublicIpAddress") in (True, "true"):
        yield "asks for a public IP (associatePublicIpAddress)"


@resource_policy("network-no-public-ips", "network", Level.MANDATORY,
                 "No subnet maps public IPs on launch and no launch template or instance asks "
                 "for one: nodes are reached over the hybrid link only.",
                 (AWS_SUBNET, AWS_LAUNCH_TEMPLATE, AWS_INSTANCE))
def no_public_ips(r: Res, desc: Description) -> Iterator[str]:
    yield from _public_ip_flags(r)
