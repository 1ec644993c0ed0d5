"""The burst regions' networks as plain data: subnets, security group rules (the declared
flows, Kubernetes' and Slurm's), managed prefix lists, VPC endpoints and their policies,
the hybrid link's routes and the NAT gateway's subnet; network_plan gathers a region's.

infra/network.py and infra/hybrid.py declare them from that plan; policies/network.py
checks resources against them.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from typing import Any

from gpupool.render import flows
from gpupool.render.cloud.names import (
    bucket_name,
    munge_secret_name,
    region_zones,
    regions,
    tags,
)
from gpupool.render.cloud.storage import bucket_tiers
from gpupool.spec.catalog import (
    BURST_SEGMENT,
    MANAGEMENT_SEGMENT,
    SRUN_PORTS,
)
from gpupool.spec.model import Description, Egress, HybridLink

S3_ENDPOINT_PEER = "s3-endpoint"  # the peer tag of the one rule that is not a flow
S3_ENDPOINT_PORT = 443


def subnets(desc: Description, region: str) -> dict[tuple[str, str], str]:
    """(segment, zone) -> CIDR: each segment's cloud CIDR split into equal blocks, one
    per zone in sorted order (at least 4 blocks, so a zone can be added later)."""
    zones = region_zones(desc, region)
    out: dict[tuple[str, str], str] = {}
    for seg, s in sorted(desc.network.segments.items()):
        if s.cloud_cidr is None:
            continue
        net = ipaddress.ip_network(s.cloud_cidr)
        bits = max(2, math.ceil(math.log2(max(1, len(zones)))))
        parts = list(net.subnets(prefixlen_diff=bits))
        for i, zone in enumerate(zones):
            out[(seg, zone)] = str(parts[i])
    return out


def vpc_cidrs(desc: Description) -> list[str]:
    return [s.cloud_cidr for _, s in sorted(desc.network.segments.items()) if s.cloud_cidr]


# What a rule that is no declared flow's serves (FirewallRule.service, its "flow" tag).
KUBERNETES = "kubernetes"
SLURM = "slurm"


@dataclass(frozen=True)
class FirewallRule:
    """One allowed path into a segment's security group (or out of one, for egress)."""

    segment: str  # the security group the rule belongs to
    direction: str  # ingress | egress
    peer_segment: str | None  # the other side's security group, or
    peer_cidr: str | None  # the other side's address block
    protocol: str  # tcp | udp | -1 (all)
    port: int | None
    flow: int | None  # index into network.flows; None: a service's (below)
    peer_list: str | None = None  # or a managed prefix list of prefix_lists()
    service: str | None = None  # KUBERNETES or SLURM where flow is None
    to_port: int | None = None  # the last port of a range from port; None: port alone

    @property
    def peer(self) -> str:
        return self.peer_segment or self.peer_cidr or self.peer_list or ""

    @property
    def last_port(self) -> int | None:
        return self.port if self.to_port is None else self.to_port

    @property
    def key(self) -> str:
        port = "all" if self.port is None else str(self.port)
        if self.to_port is not None:
            port += f"-{self.to_port}"
        peer = self.peer.replace("/", "_").replace(".", "-")
        return f"{self.segment}-{self.direction[:2]}-{peer}-{self.protocol}-{port}"


def onprem_sources(desc: Description, segment: str) -> list[str]:
    """On-prem address blocks a segment's traffic comes from: management comes only from
    the declared admin CIDRs; other segments from their on-prem CIDR."""
    if segment == "management":
        return list(desc.network.admin_cidrs)
    return [desc.network.segments[segment].cidr]


def firewall_rules(desc: Description) -> list[FirewallRule]:
    """Security group rules, exactly the declared flows: ingress on the target segment from
    the source segment's group and on-prem blocks, egress mirrored on the source."""
    rules: set[FirewallRule] = set()
    for i, flow in enumerate(desc.network.flows):
        protocol = "-1" if flow.protocol == "all" else flow.protocol
        ports: list[int | None] = [None] if protocol == "-1" else list(flow.ports)
        for port in ports:
            rules.add(FirewallRule(flow.to, "ingress", flow.from_, None, protocol, port, i))
            rules.add(FirewallRule(flow.from_, "egress", flow.to, None, protocol, port, i))
            for cidr in onprem_sources(desc, flow.from_):
                rules.add(FirewallRule(flow.to, "ingress", None, cidr, protocol, port, i))
            for cidr in onprem_sources(desc, flow.to):
                rules.add(FirewallRule(flow.from_, "egress", None, cidr, protocol, port, i))
    rules |= kubernetes_rules(desc) | slurm_rules(desc)
    # Two flows can imply the same rule; keep the first flow's (a flow's before Kubernetes').
    first: dict[str, FirewallRule] = {}
    for r in sorted(rules, key=lambda r: (r.flow is None, r.flow or 0, r.key)):
        first.setdefault(r.key, r)
    return sorted(first.values(), key=lambda r: r.key)


def rule_description(desc: Description, rule: FirewallRule) -> str:
    """The security group rule's description: its flow's, or what Kubernetes needs it for."""
    if rule.service == SLURM:
        return "Slurm: srun's ports (SrunPortRange), where a step's tasks connect back"
    if rule.flow is None:
        cni = desc.kubernetes.cni.value if desc.kubernetes else ""
        what = {flows.KUBELET: "kubelet from the control plane",
                flows.API_SERVER: "the API server"}.get(rule.port or 0, f"{cni} pod network")
        return f"Kubernetes: {what}"
    flow = desc.network.flows[rule.flow]
    return (flow.description or f"flow {flow.from_} to {flow.to}")[:255]


def prefix_lists(desc: Description) -> dict[str, dict[str, str]]:
    """Managed prefix lists the burst regions' security groups refer to, name -> address
    block -> node: the declared Kubernetes cluster's control plane and its on-prem nodes,
    each by its management address (kubelet's node IP). Empty without a cluster or bursting."""
    k8s = desc.kubernetes
    if k8s is None or not desc.burst_groups or BURST_SEGMENT not in desc.network.segments:
        return {}
    seg = flows.KUBERNETES_SEGMENT
    members = [n for n in desc.nodes if flows.kubernetes_member(desc, n)]
    return {name: {f"{desc.nodes[n].addresses[seg]}/32": n for n in nodes}
            for name, nodes in ((flows.KUBERNETES_CONTROL_PLANE, k8s.control_plane),
                                (flows.KUBERNETES_NODES, members))}


def kubernetes_rules(desc: Description) -> set[FirewallRule]:
    """Burst nodes as workers of the declared Kubernetes cluster, on their burst-segment
    group (kubelet's node IP is their one address): kubelet in from the control plane, the
    API server out to it, and the pod network's ports both ways with the other burst nodes
    (the group itself) and the cluster's on-prem nodes. The on-prem side is a prefix list
    of exactly those nodes' addresses (prefix_lists), not the management block: login and
    storage hosts there are no pod network peers. AWS counts a list's size against the
    group's rule quota (1,000 at most per interface), which bounds the cluster's on-prem
    size a burst node can peer with."""
    k8s = desc.kubernetes
    if k8s is None or not prefix_lists(desc):
        return set()
    control, nodes = flows.KUBERNETES_CONTROL_PLANE, flows.KUBERNETES_NODES

    def rule(direction: str, protocol: str, port: int, *, segment: str | None = None,
             listed: str | None = None) -> FirewallRule:
        return FirewallRule(BURST_SEGMENT, direction, segment, None, protocol, port, None,
                            listed, KUBERNETES)

    out = {rule("ingress", "tcp", flows.KUBELET, listed=control),
           rule("egress", "tcp", flows.API_SERVER, listed=control)}
    for protocol, ports in flows.CNI_PORTS[k8s.cni]:
        out |= {rule(d, protocol, p, **peer) for d in ("ingress", "egress") for p in ports
                for peer in ({"segment": BURST_SEGMENT}, {"listed": nodes})}
    return out


def slurm_rules(desc: Description) -> set[FirewallRule]:
    """srun's ports on the burst nodes' group (flows.burst_inbound is the image's host
    firewall behind it): a step's tasks on other nodes, and slurmctld, connect back to the
    srun that launched it (flows.slurm_inbound is the on-prem hosts' side). In from and out
    to the group itself (a batch script's steps across burst nodes) and the on-prem
    management block, where every Slurm host's management address lies (the controller
    reaching a burst srun; a burst node's tasks reaching an on-prem login node's srun).
    One block, not a list of hosts: a prefix list counts its size against the group's rule
    quota, and the on-prem hosts' own firewalls admit only the Slurm hosts."""
    mgmt = desc.network.segments.get(MANAGEMENT_SEGMENT)
    if not desc.burst_groups or BURST_SEGMENT not in desc.network.segments or mgmt is None:
        return set()
    lo, hi = SRUN_PORTS
    return {FirewallRule(BURST_SEGMENT, direction, segment, cidr, "tcp", lo, None,
                         service=SLURM, to_port=hi)
            for direction in ("ingress", "egress")
            for segment, cidr in ((BURST_SEGMENT, None), (None, mgmt.cidr))}


# AWS APIs a burst node calls (instance identity and tags, the munge key, SSM, its logs),
# reached from private subnets through interface endpoints; S3 through the gateway one.
INTERFACE_ENDPOINT_SERVICES = ("ec2", "ssm", "secretsmanager", "sts", "logs")
ENDPOINTS_SEGMENT = "aws-endpoints"  # segment/peer tag of the interface endpoints' group
NAT_PEER = "nat"  # peer tag of the one egress rule to the internet, through the NAT gateway
HTTPS_PORT = 443
ANYWHERE_V4 = "0.0.0.0/0"


def link_kind(desc: Description, region: str) -> str:
    """vpn | transit_gateway | direct_connect_gateway (validation guarantees exactly one)."""
    kind = desc.network.hybrid_links[region].kind
    if kind is None:
        raise ValueError(f"hybrid link of {region} declares no single kind")
    return kind


def onprem_cidrs(desc: Description) -> list[str]:
    """On-prem blocks a burst VPC routes to its hybrid link: every segment's on-prem CIDR
    (the controller's management segment among them) and admin CIDRs outside them."""
    segs = sorted({s.cidr for s in desc.network.segments.values()})
    nets = [ipaddress.ip_network(c) for c in segs]
    admin = [c for c in desc.network.admin_cidrs
             if not any(ipaddress.ip_network(c).version == n.version
                        and ipaddress.ip_network(c).subnet_of(n) for n in nets)]
    return segs + sorted(set(admin))


def nat_subnet(desc: Description, region: str) -> tuple[str, str]:
    """(CIDR, zone) of the NAT gateway's public subnet: the management segment's last
    cloud block, which no zone uses (validation: nat-needs-spare-block), in the first zone."""
    zones = region_zones(desc, region)
    mgmt = desc.network.segments["management"].cloud_cidr
    if mgmt is None:
        raise ValueError("the management segment has no cloud CIDR")
    bits = max(2, math.ceil(math.log2(max(1, len(zones)))))
    return str(list(ipaddress.ip_network(mgmt).subnets(prefixlen_diff=bits))[-1]), zones[0]


def service_rules(desc: Description) -> set[tuple[str, str, str, str, int]]:
    """(segment, direction, peer, protocol, port) of the security group rules that are not
    flows: nodes to S3 (gateway endpoint) and to the AWS APIs (interface endpoints or,
    where a region asks for one, the NAT gateway)."""
    rules = {("training", "egress", S3_ENDPOINT_PEER, "tcp", S3_ENDPOINT_PORT)}
    for region in regions(desc):
        link = desc.network.hybrid_links.get(region)
        if link is not None and link.egress.value == "nat":
            rules.add(("training", "egress", ANYWHERE_V4, "tcp", HTTPS_PORT))
        else:
            rules |= {("training", "egress", ENDPOINTS_SEGMENT, "tcp", HTTPS_PORT),
                      (ENDPOINTS_SEGMENT, "ingress", "training", "tcp", HTTPS_PORT)}
    return rules


def s3_endpoint_policy(desc: Description) -> dict[str, Any]:
    """The S3 gateway endpoint's own policy: through it the VPC reaches the pool's buckets
    and no other (a job cannot carry data off to a bucket of its own this way), whatever
    the caller's credentials allow."""
    arns = [f"arn:aws:s3:::{bucket_name(desc, t)}" for t in bucket_tiers(desc)]
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "PoolBucketsOnly", "Effect": "Allow", "Principal": "*", "Action": "s3:*",
         "Resource": [*arns, *(f"{a}/*" for a in arns)]}]}


def interface_endpoint_policy(desc: Description, region: str,
                              service: str) -> dict[str, Any] | None:
    """An interface endpoint's own policy where the pool uses one thing of the service:
    Secrets Manager's serves reads of the munge key's secret (its replica in the region;
    Secrets Manager ends a secret's ARN with six random characters) and nothing else.
    None: the service's default policy."""
    if service != "secretsmanager":
        return None
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "MungeKeyOnly", "Effect": "Allow", "Principal": "*",
         "Action": ["secretsmanager:GetSecretValue"],
         "Resource": [f"arn:aws:secretsmanager:{region}:*:secret:"
                      f"{munge_secret_name(desc)}-??????"]}]}


# CloudWatch Logs accepts only these retention periods (days).
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096,
                      1827, 2192, 2557, 2922, 3288, 3653)


def flow_log_retention(desc: Description) -> int:
    """Flow logs are kept like the archive tier: the shortest allowed period covering it."""
    days = max((t.retention_days for t in desc.storage_tiers.values()
                if t.purpose.value == "archive"), default=365)
    return next((d for d in LOG_RETENTION_DAYS if d >= days), LOG_RETENTION_DAYS[-1])


@dataclass(frozen=True)
class LinkPlan:
    """What HybridLink declares in one burst region: the declared link (exactly one kind)
    and the VPC's blocks the on-prem side routes to it."""

    region: str
    kind: str  # link_kind's
    link: HybridLink
    vpc_cidrs: list[str]
    tags: dict[str, str]


@dataclass(frozen=True)
class EgressPlan:
    """What PrivateEgress declares in one burst region: a NAT gateway in its own public
    subnet (nat_subnet), or interface endpoints (service -> its endpoint policy, None for
    the service's default)."""

    region: str
    nat_subnet: tuple[str, str] | None  # (CIDR, zone); None: interface endpoints
    endpoint_policies: dict[str, dict[str, Any] | None]
    tags: dict[str, str]


@dataclass(frozen=True)
class NetworkPlan:
    """What NetworkSegments declares in one burst region, its children's plans included."""

    region: str
    vpc_cidrs: list[str]
    zones: list[str]
    subnets: dict[tuple[str, str], str]  # subnets()
    segments: list[str]  # one security group each, sorted
    prefix_lists: dict[str, dict[str, str]]  # prefix_lists()
    rules: list[tuple[FirewallRule, str]]  # firewall_rules(), each with its description
    onprem_cidrs: list[str]  # routed to the link
    s3_endpoint_policy: dict[str, Any]
    flow_log_retention_days: int
    tags: dict[str, str]
    link: LinkPlan
    egress: EgressPlan


def network_plan(desc: Description, region: str) -> NetworkPlan:
    """NetworkSegments' args for a burst region: everything it and its children declare."""
    shared = tags(desc)
    cidrs = vpc_cidrs(desc)
    link = desc.network.hybrid_links[region]
    nat = link.egress is Egress.NAT
    return NetworkPlan(
        region=region, vpc_cidrs=cidrs, zones=region_zones(desc, region),
        subnets=subnets(desc, region), segments=sorted(desc.network.segments),
        prefix_lists=prefix_lists(desc),
        rules=[(r, rule_description(desc, r)) for r in firewall_rules(desc)],
        onprem_cidrs=onprem_cidrs(desc), s3_endpoint_policy=s3_endpoint_policy(desc),
        flow_log_retention_days=flow_log_retention(desc), tags=shared,
        link=LinkPlan(region, link_kind(desc, region), link, cidrs, shared),
        egress=EgressPlan(
            region, nat_subnet(desc, region) if nat else None,
            {} if nat else {s: interface_endpoint_policy(desc, region, s)
                            for s in INTERFACE_ENDPOINT_SERVICES},
            shared))
