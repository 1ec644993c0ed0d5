"""The AWS side of a pool as plain data: names, tags, subnets, firewall rules, lifecycle.

The Pulumi program turns these into resources and the policy pack checks resources
against them, so both read one derivation of the description.
"""

from __future__ import annotations

import ipaddress
import json
import math
import shlex
from dataclasses import dataclass
from typing import Any

from gpupool.render import flows, node_labels, shell_template
from gpupool.render.node_labels import LABEL_PREFIX
from gpupool.render.scheduling import team_quotas
from gpupool.spec import os_release
from gpupool.spec.catalog import (
    BURST_SEGMENT,
    CONTROLLER_BACKUP_PREFIX,
    INSTANCE_TYPES,
    MANAGEMENT_SEGMENT,
    SLURMCTLD_PORT,
    SRUN_PORTS,
)
from gpupool.spec.facts import burst_model, controllers
from gpupool.spec.model import (
    NAME_RE,
    SHARED_FSTYPES,
    BurstGroup,
    Description,
    Location,
    Purpose,
    StorageTier,
    Temperature,
    is_bucket_tier,
)
from gpupool.spec.model import bucket_name as model_bucket_name

# Tag keys on every taggable AWS resource; Kubernetes objects carry the same as labels.
TAG_POOL, TAG_TEAM, TAG_COST_CENTRE = "pool", "team", "cost-centre"
SHARED = "shared"  # the team tag of resources every team uses
TAG_BURST_REGION = "burst-region"  # on a burst region's image pipeline and its parts
# On a burst launch template: where its AMI comes from, the name of its region's image
# (infra/image.py) or IMAGE_FROM_CONFIG (the stack config's gpupool:burstImageId).
TAG_BURST_IMAGE = "burst-image"
IMAGE_FROM_CONFIG = "stack-config"
S3_ENDPOINT_PEER = "s3-endpoint"  # the peer tag of the one rule that is not a flow
S3_ENDPOINT_PORT = 443

# Product constants, not pool facts: S3 rejects STANDARD_IA before day 30 and bills
# GLACIER for 90 days and DEEP_ARCHIVE for 180 days at least.
STANDARD_IA_MIN_DAYS = 30
DEEP_ARCHIVE_MIN_DAYS = 180
ABORT_MULTIPART_DAYS = 7  # a failed upload's parts are garbage after a week
ROOT_VOLUME_GIB = 200  # OS, drivers and container image cache
# The burst image's parent: Debian's official Debian 12 AMIs, looked up by owner and name
# pattern (pinned here only). Debian 12 because the roles are written and tested for it.
AMI_OWNER = "136693071363"
AMI_NAME = "debian-12-amd64-*"
# The root device Debian's AMIs register (an image built from one keeps it): a launch
# template's or recipe's mapping on another name adds a second volume instead.
ROOT_DEVICE = "/dev/xvda"
# FSx for Lustre SCRATCH_2 sizes: 1.2 TiB, then multiples of 2.4 TiB.
FSX_MIN_GIB, FSX_STEP_GIB = 1200, 2400


def tags(desc: Description, team: str | None = None, **extra: str) -> dict[str, str]:
    """Pool tags; a team's own cost centre when the resource belongs to one team."""
    cost = desc.teams[team].cost_centre if team else desc.pool.cost_centre
    return {TAG_POOL: desc.pool.name, TAG_TEAM: team or SHARED, TAG_COST_CENTRE: cost,
            **extra}


def labels(desc: Description, team: str | None = None) -> dict[str, str]:
    return {LABEL_PREFIX + k: v for k, v in tags(desc, team).items()}


def regions(desc: Description) -> list[str]:
    """Regions that get a VPC: every burst region (sorted for stable names)."""
    return sorted({g.region for g in desc.burst_groups.values()})


def region_zones(desc: Description, region: str) -> list[str]:
    zones: list[str] = []
    for g in desc.burst_groups.values():
        if g.region == region:
            zones += [z for z in g.availability_zones if z not in zones]
    return sorted(zones)


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


def bucket_tiers(desc: Description) -> dict[str, StorageTier]:
    """The tiers with a bucket: of a bucket purpose and living in the cloud (location cloud
    or both). An on-prem tier declares nothing here."""
    return {n: t for n, t in desc.storage_tiers.items() if is_bucket_tier(t)}


def burst_name(desc: Description, group: str) -> str:
    """Name of a burst group's launch template, placement group and autoscaling group:
    the Pulumi program declares them, the Slurm resume program launches from them."""
    return f"{desc.pool.name}-{group}"


def boot_profile_name(desc: Description, group: str) -> str:
    """The instance profile a burst group's launch template gives every instance: its role
    reads the munge key and swaps this profile for the run profile, nothing else."""
    return f"{burst_name(desc, group)}-boot"


def run_profile_name(desc: Description, group: str) -> str:
    """The instance profile a burst node runs with once its boot has swapped it in: its
    role (node_policy) reaches the datasets and its teams' checkpoints, never the munge
    key. The user-data names it, so the program gives it this name."""
    return f"{burst_name(desc, group)}-node"


def burst_image_name(desc: Description, region: str) -> str:
    """Name of a burst region's image pipeline and its parts (component, recipe,
    configurations): one image per region serves every burst group there."""
    return f"{desc.pool.name}-{region}-burst-image"


def bucket_name(desc: Description, tier: str) -> str:
    """Globally unique by pool, tier and home region (the spec's one formula, whose length
    validation bounds)."""
    return model_bucket_name(desc.pool.name, tier, desc.pool.cloud_region)


def tier_of_bucket(desc: Description, bucket: str) -> str | None:
    return next((t for t in bucket_tiers(desc) if bucket_name(desc, t) == bucket), None)


def storage_class(temperature: Temperature, after_days: int, retention_days: int) -> str | None:
    """The S3 storage class for a temperature reached after_days into an object's life."""
    if temperature is Temperature.HOT:
        return None  # STANDARD: where objects start
    if temperature is Temperature.WARM:
        return "STANDARD_IA" if after_days >= STANDARD_IA_MIN_DAYS else "INTELLIGENT_TIERING"
    if retention_days - after_days >= DEEP_ARCHIVE_MIN_DAYS:
        return "DEEP_ARCHIVE"
    return "GLACIER"


def transitions(tier: StorageTier) -> list[dict[str, Any]]:
    """(days, storage class) steps: the tier's own temperature from day 0, then the
    declared lifecycle."""
    steps = [(0, tier.temperature), *((t.after_days, t.temperature) for t in tier.lifecycle)]
    out = []
    for days, temp in steps:
        cls = storage_class(temp, days, tier.retention_days)
        if cls is not None:
            out.append({"days": days, "storageClass": cls})
    return out


def lifecycle_rules(tier_name: str, tier: StorageTier) -> list[dict[str, Any]]:
    """S3 lifecycle rules (engine names) derived from a tier's retention and lifecycle."""
    rule: dict[str, Any] = {
        "id": f"{tier_name}-retention",
        "status": "Enabled",
        "filter": {"prefix": ""},
        "expiration": {"days": tier.retention_days},
        "abortIncompleteMultipartUpload": {"daysAfterInitiation": ABORT_MULTIPART_DAYS},
    }
    steps = transitions(tier)
    if steps:
        rule["transitions"] = steps
    if tier.versioning:
        rule["noncurrentVersionExpiration"] = {"noncurrentDays": tier.retention_days}
    return [rule]


def scratch_tier(desc: Description) -> tuple[str, StorageTier] | None:
    """The scratch tier served by FSx for Lustre, if the description declares one: a
    Lustre scratch tier whose location is cloud (one served on-prem declares nothing)."""
    for name, t in desc.storage_tiers.items():
        if (t.purpose is Purpose.SCRATCH and t.mount is not None and t.mount.fstype == "lustre"
                and t.located is Location.CLOUD):
            return name, t
    return None


def lustre_import_tier(desc: Description) -> str | None:
    """The bucket tier the Lustre scratch file system imports from: the datasets tier,
    when the description declares both."""
    if scratch_tier(desc) is None:
        return None
    return next((t for t, v in bucket_tiers(desc).items() if v.purpose is Purpose.DATASETS),
                None)


def bucket_arn(desc: Description, tier: str) -> str:
    return f"arn:aws:s3:::{bucket_name(desc, tier)}"


def bucket_policy(desc: Description, tier: str) -> dict[str, Any]:
    """A pool bucket's own policy: nothing without TLS, to the bucket or its objects,
    whoever asks. Objects are not fenced to the pool's network: on-prem nodes restore
    checkpoints from the archive tier and operators upload the burst image's artifact
    from addresses the description does not declare (the admin ranges are private)."""
    arn = bucket_arn(desc, tier)
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "DenyWithoutTLS", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
         "Resource": [arn, f"{arn}/*"],
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}


# The role FSx for Lustre reads and writes a linked bucket with: a service-linked role per
# file system, named by FSx (its id is the suffix), so only a pattern can name it.
FSX_S3_ROLE = ("role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/"
               "AWSServiceRoleForFSxS3Access_*")


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


def fsx_s3_role(account: str) -> str:
    return f"arn:aws:iam::{account}:{FSX_S3_ROLE}"


# The services the pool key is used through, in the pool's cloud region: S3 (the buckets'
# SSE-KMS and bucket keys), Secrets Manager (the munge key), EC2 (burst root volumes).
KEY_SERVICES = ("s3", "secretsmanager", "ec2")
KEY_CRYPTO_ACTIONS = ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey*", "kms:ReEncrypt*"]


def via_service(service: str, region: str) -> str:
    return f"{service}.{region}.amazonaws.com"


def key_policy(desc: Description, account: str) -> dict[str, Any]:
    """The pool key's own policy. The account administers it, and IAM policies in the
    account decide who uses it (the node roles through S3, node_policy; the munge key's
    readers through Secrets Manager, munge_read_policy); nobody, whatever IAM grants,
    encrypts or decrypts with it but through the pool's services. AWS services acting
    with their own principals (EBS on a volume's grant) are not caught by that deny:
    they are the services."""
    region = desc.pool.cloud_region
    statements: list[dict[str, Any]] = [
        # Without it the key could not be managed at all (KMS refuses such a policy).
        {"Sid": "AccountAdministers", "Effect": "Allow",
         "Principal": {"AWS": f"arn:aws:iam::{account}:root"}, "Action": "kms:*",
         "Resource": "*"},
        {"Sid": "UseOnlyThroughPoolServices", "Effect": "Deny", "Principal": "*",
         "Action": KEY_CRYPTO_ACTIONS, "Resource": "*", "Condition": {
             "StringNotEquals": {"kms:ViaService": [via_service(s, region)
                                                    for s in KEY_SERVICES]},
             "Bool": {"aws:PrincipalIsAWSService": "false"}}}]
    if lustre_import_tier(desc) is not None:
        # FSx's service-linked role takes no IAM policy of ours: the key policy itself must
        # let it read (and export to) the SSE-KMS bucket it is linked to, through S3 only.
        statements.append(
            {"Sid": "LustreThroughS3", "Effect": "Allow", "Principal": {"AWS": "*"},
             "Action": [*KEY_CRYPTO_ACTIONS, "kms:DescribeKey"], "Resource": "*",
             "Condition": {
                 "StringEquals": {"kms:ViaService": via_service("s3", region),
                                  "kms:CallerAccount": account},
                 "ArnLike": {"aws:PrincipalArn": fsx_s3_role(account)}}})
    return {"Version": "2012-10-17", "Statement": statements}


def fsx_capacity_gib(size_tib: float) -> int:
    gib = size_tib * 1024
    if gib <= FSX_MIN_GIB:
        return FSX_MIN_GIB
    return math.ceil(gib / FSX_STEP_GIB) * FSX_STEP_GIB


def efa_interfaces(group: BurstGroup) -> int:
    """EFA interfaces a launch template can attach: what every fallback type supports."""
    if not group.efa:
        return 0
    return min(INSTANCE_TYPES[t].efa_interfaces for t in group.instance_types)


def group_zones(group: BurstGroup) -> list[str]:
    """A cluster placement group lives in one zone: EFA groups use the first declared
    zone; others spread over all of them."""
    return group.availability_zones[:1] if group.efa else list(group.availability_zones)


def group_teams(desc: Description, group: BurstGroup) -> list[str]:
    """Teams whose checkpoints a group's nodes may read and write: its own team; for a
    shared group, the teams that can hold its GPU model at all (a quota or a borrowing
    limit for it: Slurm's GrpTRES gres/gpu:<model> keeps every other team off its nodes),
    never every team by default."""
    if group.team:
        return [group.team]
    model = burst_model(group)
    holders = {q.team for q in team_quotas(desc)
               if q.model == model and q.nominal + q.borrowing > 0}
    return [t for t in desc.teams if t in holders]


def node_policy(desc: Description, group: BurstGroup, datasets_arn: str,
                checkpoints_arn: str | None, key_arn: str) -> dict[str, Any]:
    """Least privilege for a burst node: read datasets, read/write its teams' checkpoint
    prefixes, use the pool key for those objects (through S3 only: the buckets live in
    the pool's cloud region, whichever region the node is in)."""
    statements: list[dict[str, Any]] = [
        {"Sid": "ReadDatasets", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:ListBucket"],
         "Resource": [datasets_arn, f"{datasets_arn}/*"]},
        {"Sid": "UsePoolKey", "Effect": "Allow",
         "Action": ["kms:Decrypt", "kms:GenerateDataKey"], "Resource": [key_arn],
         "Condition": {"StringEquals": {
             "kms:ViaService": via_service("s3", desc.pool.cloud_region)}}},
    ]
    prefixes = [f"{t}/*" for t in group_teams(desc, group)]
    if checkpoints_arn is not None and prefixes:
        statements += [
            {"Sid": "ListCheckpoints", "Effect": "Allow", "Action": ["s3:ListBucket"],
             "Resource": [checkpoints_arn],
             "Condition": {"StringLike": {"s3:prefix": prefixes}}},
            {"Sid": "ReadWriteCheckpoints", "Effect": "Allow",
             "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject",
                        "s3:AbortMultipartUpload"],
             "Resource": [f"{checkpoints_arn}/{p}" for p in prefixes]},
        ]
    return {"Version": "2012-10-17", "Statement": statements}


def controller_addresses(desc: Description) -> list[tuple[str, str]]:
    """(name, management address) of each Slurm controller, primary first: every burst node
    reaches them, and turns to the backup when the primary does not answer."""
    out = []
    for name in controllers(desc):
        node = desc.nodes[name]
        out.append((name, node.addresses.get("management") or next(iter(node.addresses.values()))))
    return out


# The tag the resume program gives an instance: its Slurm node name
# (gpupool.onhost.burst.NODE_TAG; that file imports nothing of gpupool, a test keeps them equal).
TAG_SLURM_NODE = "gpupool:slurm-node"
MUNGE_KEY_PATH = "/etc/munge/munge.key"
SLURMD_DROPIN = "/etc/systemd/system/slurmd.service.d/gpupool-configless.conf"
# The spot watcher's unit, one per node name (roles/slurm/tasks/node_files.yml installs it;
# a test keeps the names equal).
SPOT_WATCH_UNIT = "gpupool-spot-watch@{}.service"
SPOT_WATCH_PROGRAM = "/usr/local/sbin/gpupool-spot-watch"  # slurm_spot_watch_program
# The acceptance gate's packages in the image (roles/acceptance_gate: acceptance_gate_dir
# + /lib; a test keeps them equal), what the user-data hands it and where its report stays.
GATE_LIB = "/opt/gpupool/gate/lib"
FACTS_PATH = "/etc/gpupool/burst.json"
GATE_REPORTS = "/var/lib/gpupool/gate"
# Bounds the whole gate at boot: its quick tier's own limit (gate/runner.py) plus start-up.
GATE_TIMEOUT_S = 240
# The client configuration a node that failed its gate reports with: slurmd never started,
# so there is no configless copy to read.
CLIENT_CONF = "/run/gpupool/slurm-client.conf"
# Bounded waits at boot: a node that cannot learn its name or key within them fails its
# user-data (and is terminated by suspend at ResumeTimeout) instead of hanging.
BOOT_ATTEMPTS, BOOT_RETRY_S = 10, 6
# Bounds the start of one network tier's mount at boot: its unit's own TimeoutSec (60 s,
# role storage's net.mount.j2) and systemd's start-up of it.
MOUNT_TIMEOUT_S = 75
# Role node_exporter's on Debian (roles/node_exporter/vars/Debian.yml).
NODE_EXPORTER_UNIT = "prometheus-node-exporter"
NODE_EXPORTER_DEFAULTS = "/etc/default/prometheus-node-exporter"
# Role dcgm's exporter unit, which reads its listen host from DCGM_EXPORTER_HOST
# (roles/dcgm/templates/dcgm-exporter.service.j2), and the drop-in a boot sets it in.
DCGM_EXPORTER_UNIT = "dcgm-exporter"
DCGM_EXPORTER_DROPIN = f"/etc/systemd/system/{DCGM_EXPORTER_UNIT}.service.d/gpupool-boot.conf"


def munge_secret_name(desc: Description) -> str:
    """The Secrets Manager secret holding the pool's munge key: the program declares it,
    a burst node's user-data reads it, an operator puts the controller's key in it."""
    return f"gpupool/{desc.pool.name}/munge-key"


def secret_arn_in(arn: str, region: str) -> str:
    """The ARN of a secret's replica in another region: only the region field differs.
    Anything else (a preview's placeholder) is returned as it is."""
    parts = arn.split(":", 5)
    if len(parts) < 6 or parts[0] != "arn" or parts[2] != "secretsmanager":
        return arn
    parts[3] = region
    return ":".join(parts)


def munge_read_policy(desc: Description, group: BurstGroup, secret_arn: str,
                      key_arn: str) -> dict[str, Any]:
    """A burst node may read the munge key, in its own region, and nothing else of Secrets
    Manager; it may decrypt it with the pool key only through Secrets Manager and only for
    that secret. A replica elsewhere is encrypted with that region's aws/secretsmanager
    key, which Secrets Manager uses on the caller's behalf: no KMS statement is needed."""
    home = group.region == desc.pool.cloud_region
    arn = secret_arn if home else secret_arn_in(secret_arn, group.region)
    statements: list[dict[str, Any]] = [
        {"Sid": "ReadMungeKey", "Effect": "Allow", "Action": ["secretsmanager:GetSecretValue"],
         "Resource": [arn]}]
    if home:
        statements.append(
            {"Sid": "DecryptMungeKey", "Effect": "Allow", "Action": ["kms:Decrypt"],
             "Resource": [key_arn], "Condition": {
                 "StringEquals": {
                     "kms:ViaService": f"secretsmanager.{group.region}.amazonaws.com",
                     "kms:EncryptionContext:SecretARN": arn}}})
    return {"Version": "2012-10-17", "Statement": statements}


def boot_policy(desc: Description, group: BurstGroup, boot_profile_arn: str,
                run_role_arn: str) -> dict[str, Any]:
    """What a burst node's boot role may do besides reading the munge key
    (munge_read_policy, which MungeKey grants it): find its instance's profile association
    and replace it with the run profile, only on the pool's instances in the group's
    region that still carry the boot profile (so a node swaps once, and never back), and
    pass only the run role. No S3, no checkpoints: the boot needs none."""
    return {"Version": "2012-10-17", "Statement": [
        # EC2's Describe calls take no resource.
        {"Sid": "FindProfileAssociation", "Effect": "Allow",
         "Action": ["ec2:DescribeIamInstanceProfileAssociations"], "Resource": "*"},
        {"Sid": "SwapBootForRunProfile", "Effect": "Allow",
         "Action": ["ec2:ReplaceIamInstanceProfileAssociation"],
         "Resource": [f"arn:aws:ec2:{group.region}:*:instance/*"],
         "Condition": {"ArnEquals": {"ec2:InstanceProfile": boot_profile_arn},
                       "StringEquals": {f"ec2:ResourceTag/{TAG_POOL}": desc.pool.name}}},
        {"Sid": "PassRunRole", "Effect": "Allow", "Action": ["iam:PassRole"],
         "Resource": [run_role_arn],
         "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}},
    ]}


def munge_secret_policy(role_arns: list[str]) -> dict[str, Any]:
    """The secret's own policy: nobody but the burst nodes' boot roles reads the value (a
    node's run role neither: boot_policy), whatever their identity policies grant (an
    administrator can still put a new value)."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "OnlyBurstNodesRead", "Effect": "Deny", "Principal": "*",
         "Action": ["secretsmanager:GetSecretValue"], "Resource": "*",
         "Condition": {"ArnNotEquals": {"aws:PrincipalArn": sorted(role_arns)}}}]}


def _ec2_arns(desc: Description, account: str, kind: str) -> list[str]:
    """kind/* in every burst region of the account."""
    return [f"arn:aws:ec2:{r}:{account}:{kind}/*" for r in regions(desc)]


def burst_launch_policy(desc: Description, account: str, role_arns: list[str],
                        key_arn: str) -> dict[str, Any]:
    """What the controller's resume and suspend programs (gpupool/onhost/burst.py) may do,
    whatever identity the controller runs them with: launch only from the pool's launch
    templates (tagged with the pool) into the pool's subnets and groups, an instance that
    carries the pool tag from launch; pass only the burst nodes' boot roles (the launch
    templates' profiles); terminate only
    instances tagged with this pool and a Slurm node name, the two tags suspend matches.
    EC2 Fleet launches with the caller's RunInstances permission, so RunInstances is where
    a fleet is fenced; EC2's Describe calls take no resource, so they are not."""
    pool = desc.pool.name
    own = {f"ec2:ResourceTag/{TAG_POOL}": pool}
    from_template = {"ArnLike": {"ec2:LaunchTemplate": _ec2_arns(desc, account,
                                                                 "launch-template")}}
    instances = _ec2_arns(desc, account, "instance")
    parts = [*instances, *_ec2_arns(desc, account, "volume"),
             *_ec2_arns(desc, account, "network-interface")]
    statements: list[dict[str, Any]] = [
        {"Sid": "Describe", "Effect": "Allow",
         "Action": ["ec2:DescribeInstances", "ec2:DescribeSubnets"], "Resource": "*"},
        {"Sid": "CreateInstantFleets", "Effect": "Allow", "Action": ["ec2:CreateFleet"],
         "Resource": "*"},
        {"Sid": "LaunchFromPoolTemplates", "Effect": "Allow", "Action": ["ec2:RunInstances"],
         "Resource": _ec2_arns(desc, account, "launch-template"),
         "Condition": {"StringEquals": own}},
        {"Sid": "LaunchIntoPoolNetwork", "Effect": "Allow", "Action": ["ec2:RunInstances"],
         "Resource": [*_ec2_arns(desc, account, "subnet"),
                      *_ec2_arns(desc, account, "security-group"),
                      *_ec2_arns(desc, account, "placement-group")],
         "Condition": {"StringEquals": own}},
        {"Sid": "LaunchPoolInstances", "Effect": "Allow", "Action": ["ec2:RunInstances"],
         "Resource": instances,
         "Condition": {"StringEquals": {f"aws:RequestTag/{TAG_POOL}": pool}, **from_template}},
        # Their volumes, interfaces and image come from the template, so only from one.
        {"Sid": "LaunchTemplateParts", "Effect": "Allow", "Action": ["ec2:RunInstances"],
         "Resource": [*_ec2_arns(desc, account, "volume"),
                      *_ec2_arns(desc, account, "network-interface"),
                      *(f"arn:aws:ec2:{r}::image/*" for r in regions(desc))],
         "Condition": from_template},
        {"Sid": "TagAtLaunchOnly", "Effect": "Allow", "Action": ["ec2:CreateTags"],
         "Resource": parts,
         "Condition": {"StringEquals": {"ec2:CreateAction": ["CreateFleet", "RunInstances"]}}},
        {"Sid": "PassNodeRoles", "Effect": "Allow", "Action": ["iam:PassRole"],
         "Resource": sorted(role_arns),
         "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}},
        {"Sid": "TerminatePoolNodes", "Effect": "Allow", "Action": ["ec2:TerminateInstances"],
         "Resource": instances, "Condition": {
             "StringEquals": own, "Null": {f"ec2:ResourceTag/{TAG_SLURM_NODE}": "false"}}},
    ]
    if any(g.region == desc.pool.cloud_region for g in desc.burst_groups.values()):
        # Those groups' root volumes are encrypted with the pool key (infra/burst.py): EC2
        # uses it on the launcher's behalf, and grants it to EBS for the volume.
        statements.append(
            {"Sid": "EncryptRootVolumes", "Effect": "Allow",
             "Action": ["kms:CreateGrant", "kms:Decrypt", "kms:DescribeKey",
                        "kms:GenerateDataKeyWithoutPlaintext", "kms:ReEncrypt*"],
             "Resource": [key_arn], "Condition": {
                 "StringEquals": {"kms:ViaService": via_service("ec2",
                                                                desc.pool.cloud_region)},
                 "BoolIfExists": {"kms:GrantIsForAWSResource": "true"}}})
    return {"Version": "2012-10-17", "Statement": statements}


# Where controller backups go in their tier's bucket (roles/controller_backup).
BACKUP_PREFIX = CONTROLLER_BACKUP_PREFIX


def controller_backup_policy(desc: Description, tier: str, key_arn: str) -> dict[str, Any]:
    """The least privilege of the controller's backup timer and restore playbook: its
    prefix of the backup tier's bucket only (list, put, get, delete for retention), and
    the pool key through S3 for the bucket's encryption."""
    bucket = f"arn:aws:s3:::{bucket_name(desc, tier)}"
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "ListBackups", "Effect": "Allow", "Action": "s3:ListBucket",
         "Resource": bucket, "Condition": {"StringLike": {"s3:prefix": f"{BACKUP_PREFIX}*"}}},
        {"Sid": "ReadWriteBackups", "Effect": "Allow",
         "Action": ["s3:PutObject", "s3:GetObject", "s3:DeleteObject"],
         "Resource": f"{bucket}/{BACKUP_PREFIX}*"},
        {"Sid": "BucketEncryption", "Effect": "Allow",
         "Action": ["kms:GenerateDataKey", "kms:Decrypt"], "Resource": [key_arn],
         "Condition": {"StringEquals": {
             "kms:ViaService": via_service("s3", desc.pool.cloud_region)}}},
    ]}


def mount_unit(path: str) -> str:
    """systemd's name for the mount unit of a path (`systemd-escape --path --suffix=mount`)
    for the paths validation allows (model.MOUNT_PATH_RE: absolute, no empty or dot-led
    parts), as role storage names the units it installs."""
    return path[1:].replace("-", "\\x2d").replace("/", "-") + ".mount"


def mount_units(desc: Description) -> list[str]:
    """The mount units of the tiers on network file systems."""
    return [mount_unit(t.mount.path) for t in desc.storage_tiers.values()
            if t.mount is not None and t.mount.fstype in SHARED_FSTYPES]


def burst_facts(desc: Description, name: str, group: BurstGroup) -> dict[str, Any]:
    """What a burst node learns about itself at boot: read by the onboarding play and, as
    its expectation, by the acceptance gate (gpupool.gate.expect.burst_expect). The group's
    first instance type stands for all: validation keeps every fallback type to the same
    GPUs."""
    itype = INSTANCE_TYPES[group.instance_types[0]]
    return {"pool": desc.pool.name, "burst_group": name, "team": group.team or SHARED,
            "domain": desc.pool.domain, "environment": desc.pool.environment,
            "instance_type": itype.name, "gpus": itype.gpus, "gpu_model": itype.gpu_model,
            "software": os_release.versions(desc, os_release.burst_release(desc)),
            "teams": sorted(desc.teams), "ids": desc.ids.model_dump(mode="json"),
            # The tiers it mounts, as an on-prem compute node does (the image's storage
            # role renders and enables their units; the network ones come over the
            # hybrid link), and which the boot's gate checks before slurmd starts.
            "mounts": {n: t.mount.model_dump(mode="json")
                       for n, t in desc.storage_tiers.items() if t.mount is not None}}


# The instance metadata service (IPv4, and IPv6 where an instance enables it): the node
# role's credentials are one GET away there, and with them the munge key's secret and the
# checkpoints the role reaches. A job is a local process of its user, so only root may
# reach it: the user-data's table below, and the image's host firewall
# (roles/hardening: hardening_metadata_addresses; a test keeps them equal).
METADATA_ADDRESSES = ("169.254.169.254", "fd00:ec2::254")
METADATA_TABLE = "gpupool_metadata"


def metadata_root_only() -> list[str]:
    """An nftables ruleset in a table of its own (the hardening role replaces only its
    table): locally made packets to the metadata service leave only from root's sockets,
    and none is forwarded there (a container or pod on a bridge is never the host's root).
    Rejected, not dropped, so a caller fails at once instead of waiting out its timeout."""
    families = {a: "ip6" if ":" in a else "ip" for a in METADATA_ADDRESSES}
    return [
        f"table inet {METADATA_TABLE}",
        f"delete table inet {METADATA_TABLE}",
        f"table inet {METADATA_TABLE} {{",
        "  chain output {",
        "    type filter hook output priority filter; policy accept;",
        *(f"    {f} daddr {a} meta skuid != 0 reject" for a, f in families.items()),
        "  }",
        "  chain forward {",
        "    type filter hook forward priority filter; policy accept;",
        *(f"    {f} daddr {a} reject" for a, f in families.items()),
        "  }",
        "}",
    ]


def user_data(desc: Description, name: str, group: BurstGroup) -> str:
    """cloud-init's script for a burst group's instances: templates/burst-user-data.sh.tmpl
    (what it does, step by step, is told there) with the description's values, each one
    shell word. It leaves the facts onboarding needs on the node (the onboarding play finds
    nodes by their burst-group tag and reads these facts) and joins the node to Slurm by
    itself, within ResumeTimeout and without a person. With Kubernetes declared it also
    gives kubelet the labels and taints the node registers with (node_labels.py), picked
    by the capacity type the metadata service reports."""
    q = shlex.quote
    ctls = controller_addresses(desc)
    secret, run = munge_secret_name(desc), run_profile_name(desc, name)
    values: dict[str, shell_template.Value] = {
        "facts_dir": FACTS_PATH.rsplit("/", 1)[0], "facts_path": FACTS_PATH,
        "attempts": BOOT_ATTEMPTS, "retry_s": BOOT_RETRY_S,
        "node_tag_path": "tags/instance/" + TAG_SLURM_NODE, "name_re": NAME_RE,
        "region": group.region, "munge_secret": secret,
        "no_munge_key": f"gpupool: no munge key in {secret} (put it with --secret-binary)",
        "munge_key_new": MUNGE_KEY_PATH + ".new", "munge_key": MUNGE_KEY_PATH,
        "run_profile": run,
        "no_swap": f"gpupool: could not swap the boot profile for {run}: the boot fails",
        "node_exporter_defaults": NODE_EXPORTER_DEFAULTS,
        "node_exporter_unit": NODE_EXPORTER_UNIT,
        "dcgm_dropin_dir": DCGM_EXPORTER_DROPIN.rsplit("/", 1)[0],
        "dcgm_dropin": DCGM_EXPORTER_DROPIN, "dcgm_exporter_unit": DCGM_EXPORTER_UNIT,
        "gate_lib": GATE_LIB, "gate_timeout_s": GATE_TIMEOUT_S, "gate_reports": GATE_REPORTS,
        "client_conf_dir": CLIENT_CONF.rsplit("/", 1)[0], "client_conf": CLIENT_CONF,
        # What a node that failed its gate reports with: slurmd never read a configuration.
        "client_conf_lines": [f"ClusterName={desc.pool.name}",
                              *(f"SlurmctldHost={c}({a})" for c, a in ctls)],
        # slurmd --conf-server takes the controllers comma-separated, primary first.
        "conf_server": ",".join(
            f"[{a}]:{SLURMCTLD_PORT}" if ipaddress.ip_address(a).version == 6
            else f"{a}:{SLURMCTLD_PORT}" for _, a in ctls),
        "slurmd_dropin_dir": SLURMD_DROPIN.rsplit("/", 1)[0], "slurmd_dropin": SLURMD_DROPIN,
    }
    blocks: dict[str, list[str]] = {
        "metadata_rules": metadata_root_only(),
        # One line (json.dumps escapes newlines): it can never end its here-document.
        "facts": [json.dumps(burst_facts(desc, name, group), sort_keys=True)],
        "mount_starts": [f"timeout {MOUNT_TIMEOUT_S} systemctl start {q(unit)} || "
                         f"echo {q(f'gpupool: {unit} did not mount')} >&2"
                         for unit in mount_units(desc)],
    }
    if desc.kubernetes is not None:
        kinds = node_labels.burst_nodes(desc, name)
        # Unknown capacity (metadata unreachable): spot where the group may be spot.
        fallback = node_labels.SPOT if node_labels.SPOT in kinds else next(iter(kinds))
        blocks["kubelet_cases"] = [f"  {kind}) args={q(node_labels.kubelet_args(reg))} ;;"
                                   for kind, reg in kinds.items() if kind != fallback]
        values["kubelet_fallback_args"] = node_labels.kubelet_args(kinds[fallback])
    return shell_template.render_file(
        "burst-user-data.sh.tmpl", values, blocks=blocks,
        # Inside double quotes, where the shell expands $node: gpupool's own text.
        verbatim={"spot_watch_unit": SPOT_WATCH_UNIT.format("$node")},
        flags={"kubernetes": desc.kubernetes is not None})
