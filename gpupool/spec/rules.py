"""Cross-field rules over a description whose fields are each well-typed.

Every rule appends Problems instead of raising, so one run reports everything wrong.
Rules that depend on a reference (a node's class, a rack) skip the dependent checks when
the reference is broken: the broken reference is the problem to report.
"""

from __future__ import annotations

import ipaddress
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from itertools import combinations

from gpupool.spec import budgets, cuda_driver, floors, gpu_detection, mig, os_release
from gpupool.spec.catalog import (
    ALERTMANAGER_PORT,
    API_SERVER_PORT,
    BGP_PORT,
    BUCKET_NAME_LENGTH,
    BUCKET_RESERVED_PREFIXES,
    BURST_SEGMENT,
    CILIUM_HEALTH_PORT,
    CONTROLLER_BACKUP_PREFIX,
    DCGM_EXPORTER_PORT,
    DNS_LABEL_MAX,
    ETCD_PORTS,
    FIXED_IN,
    GPU_MODELS,
    INSTANCE_TYPES,
    KUBELET_PORT,
    MANAGEMENT_PLANE_PORTS,
    MANAGEMENT_SEGMENT,
    MIG_GEOMETRIES,
    MOUNT_OPTIONS,
    NODE_EXPORTER_PORT,
    PROMETHEUS_PORT,
    RESERVED_BUCKET_PREFIXES,
    RESERVED_NAMESPACES,
    RESERVED_SLURM_NAMES,
    RESERVED_USERS,
    ROLE_GROUP_PREFIX,
    SLURM_MAX_PRIORITY_TIER,
    SLURMCTLD_PORT,
    SLURMD_PORT,
    SRUN_PORTS,
    SSH_PORT,
    SYSTEM_ACCOUNTS,
    SYSTEM_DIRECTORIES,
    TEAM_GROUP_PREFIX,
    UNIX_NAME_MAX,
    closed_to_all_flows,
)
from gpupool.spec.errors import Problem, unknown
from gpupool.spec.facts import (
    controllers,
    gpu_capacity,
    mount_servers,
    node_named,
    preemption_kueue_expressible,
    preemption_slurm_expressible,
    preemption_wanted,
    rack_places,
)
from gpupool.spec.model import (
    BUCKET_PURPOSES,
    LINK_KINDS,
    SEGMENT_NAMES,
    SHARED_FSTYPES,
    Capacity,
    Description,
    Egress,
    FsType,
    Gpu,
    IdleReclaim,
    Location,
    MigStrategy,
    NodeRole,
    Purpose,
    ReclaimAction,
    Role,
    StorageTier,
    SyncDirection,
    TaskClass,
    Temperature,
    bucket_name,
    duration_seconds,
    is_bucket_tier,
    older_than,
    version_key,
)

Rule = Callable[[Description], Iterator[Problem]]
# Each rule with the top-level sections it reads: it runs whenever those are well-typed,
# even if other sections are not, so one run reports as much as can be known.
RULES: list[tuple[frozenset[str], Rule]] = []

_COLDNESS = {Temperature.HOT: 0, Temperature.WARM: 1, Temperature.ARCHIVE: 2}


def rule(*needs: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        RULES.append((frozenset(needs), fn))
        return fn

    return register


def check(desc: Description, valid_sections: frozenset[str] | None = None) -> list[Problem]:
    """Run every rule whose sections are valid (all of them when valid_sections is None)."""
    return [p for needs, fn in RULES
            if valid_sections is None or needs <= valid_sections
            for p in fn(desc)]


@rule("sites")
def topology(desc: Description) -> Iterator[Problem]:
    seen: dict[str, str] = {}
    for site, s in desc.sites.items():
        for leaf, sw in s.leaf_switches.items():
            if leaf in desc.sites:
                yield Problem(f"sites.{site}.leaf_switches.{leaf}", "switch-name-unique",
                              "a leaf switch may not share a site's name (one Slurm "
                              "topology namespace)", leaf)
            for i, rack in enumerate(sw.racks):
                where = f"sites.{site}.leaf_switches.{leaf}"
                if rack in seen:
                    yield Problem(f"{where}.racks[{i}]", "rack-unique",
                                  f"rack is already under {seen[rack]}", rack)
                seen[rack] = where


@rule("node_classes")
def scratch_devices_named(desc: Description) -> Iterator[Problem]:
    """The storage role builds scratch on the devices the description names, by model or
    by stable path: a count alone would have it guess kernel names (/dev/nvme0n1...), which
    on a node with a boot or data NVMe device picks the wrong disk and wipes it."""
    for name, nc in desc.node_classes.items():
        nvme, path = nc.nvme, f"node_classes.{name}.nvme"
        if nvme.count and (nvme.model is None) == (not nvme.devices):
            yield Problem(path, "scratch-devices-named",
                          "name the scratch devices by `model` or by `devices` (stable "
                          "/dev/disk/by-id paths), exactly one of them",
                          nvme.model_dump(mode="json", exclude_defaults=True))
        elif nvme.devices and len(nvme.devices) != nvme.count:
            yield Problem(f"{path}.devices", "scratch-devices-count",
                          f"{len(nvme.devices)} devices for a count of {nvme.count}",
                          nvme.devices)
        elif len(set(nvme.devices)) != len(nvme.devices):
            yield Problem(f"{path}.devices", "scratch-devices-unique",
                          "a device is named twice", nvme.devices)
        elif not nvme.count and (nvme.model is not None or nvme.devices):
            yield Problem(f"{path}.count", "scratch-devices-count",
                          "devices are named for a count of 0", nvme.count)


@rule("node_classes")
def node_classes(desc: Description) -> Iterator[Problem]:
    for name, nc in desc.node_classes.items():
        if nc.gpu is None:
            continue
        path = f"node_classes.{name}.gpu"
        model = GPU_MODELS.get(nc.gpu.model)
        if model is None:
            yield Problem(f"{path}.model", "gpu-model-known",
                          unknown("GPU model", nc.gpu.model, GPU_MODELS), nc.gpu.model)
            continue
        if nc.gpu.memory_gib not in model.memory_gib:
            yield Problem(f"{path}.memory_gib", "gpu-memory-matches-model",
                          f"{model.name} ships with {model.memory_gib} GiB",
                          nc.gpu.memory_gib)
        if nc.gpu.mig_strategy is not MigStrategy.NONE and not model.mig_capable:
            yield Problem(f"{path}.mig_strategy", "mig-capable",
                          f"{model.name} does not support MIG", nc.gpu.mig_strategy.value)
        if (nc.gpu.mig_strategy is MigStrategy.NONE) != (not nc.gpu.mig_profiles):
            yield Problem(f"{path}.mig_profiles", "mig-profiles-match-strategy",
                          "MIG profiles are declared exactly when mig_strategy is not none",
                          dict(nc.gpu.mig_profiles))
        if nc.gpu.mig_strategy is MigStrategy.SINGLE and len(nc.gpu.mig_profiles) > 1:
            yield Problem(f"{path}.mig_profiles", "mig-single-profile",
                          "mig_strategy single allows one profile", dict(nc.gpu.mig_profiles))
        if model.mig_capable and nc.gpu.mig_profiles:
            yield from _mig_layout(path, nc.gpu)
    # The GPU Operator's mig.strategy is one for the cluster: the device plugin names every
    # node's MIG devices by it, so MIG classes may not differ in it.
    strategies: dict[MigStrategy, str] = {}
    for name, nc in desc.node_classes.items():
        if nc.gpu is None or nc.gpu.mig_strategy is MigStrategy.NONE:
            continue
        other = next((c for s, c in strategies.items() if s is not nc.gpu.mig_strategy), None)
        if other is not None:
            yield Problem(f"node_classes.{name}.gpu.mig_strategy", "mig-strategy-uniform",
                          f"class {other} uses another MIG strategy; the GPU Operator's is "
                          "one for the whole cluster", nc.gpu.mig_strategy.value)
        strategies.setdefault(nc.gpu.mig_strategy, name)


def _mig_layout(path: str, gpu: Gpu) -> Iterator[Problem]:
    """The declared layout against the GPU's MIG profile table (catalog.MIG_GEOMETRIES)."""
    geo = mig.geometry(gpu)
    if geo is None:  # a MIG model in a size gpupool has no table for
        yield Problem(f"{path}.memory_gib", "mig-profile-table",
                      f"gpupool knows {gpu.model}'s MIG profiles only for "
                      f"{sorted(m for g, m in MIG_GEOMETRIES if g == gpu.model)} GiB",
                      gpu.memory_gib)
        return
    layout = dict(gpu.mig_profiles)
    known = True
    for name, n in layout.items():
        profile = geo.profiles.get(name)
        if profile is None:
            known = False
            yield Problem(f"{path}.mig_profiles.{name}", "mig-profile-known",
                          f"{gpu.model} {gpu.memory_gib} GB has no such MIG profile; it has "
                          f"{', '.join(geo.profiles)}", name)
        elif n > profile.max_instances:
            known = False
            yield Problem(f"{path}.mig_profiles.{name}", "mig-profile-max-instances",
                          f"a {gpu.model} {gpu.memory_gib} GB GPU holds at most "
                          f"{profile.max_instances} {name} instances", n)
    if not known:
        return
    slices = mig.compute_slices(geo, layout)
    if slices > geo.compute_slices:
        yield Problem(f"{path}.mig_profiles", "mig-slices-within-gpu",
                      f"the instances take {slices} compute slices; a {gpu.model} GPU has "
                      f"{geo.compute_slices}", layout)
    elif mig.placement(geo, layout) is None:
        yield Problem(f"{path}.mig_profiles", "mig-placement",
                      "no arrangement of these instances fits NVIDIA's placement rules (each "
                      "profile starts only at some memory slices; see nvidia-smi mig "
                      "-lgipp)", layout)


@rule("nodes", "sites", "node_classes", "teams")
def nodes(desc: Description) -> Iterator[Problem]:
    racks = rack_places(desc)
    for name, node in desc.nodes.items():
        path = f"nodes.{name}"
        if node.class_ not in desc.node_classes:
            yield Problem(f"{path}.class", "node-class-exists",
                          "no such node class in node_classes", node.class_)
        if node.rack not in racks:
            yield Problem(f"{path}.rack", "rack-exists",
                          "rack is not under any site's leaf switch", node.rack)
        if node.owner_team is not None and node.owner_team not in desc.teams:
            yield Problem(f"{path}.owner_team", "team-exists", "no such team", node.owner_team)
        if len(set(node.roles)) != len(node.roles):
            yield Problem(f"{path}.roles", "roles-unique", "a role is listed twice",
                          [r.value for r in node.roles])


@rule("nodes", "network")
def addresses(desc: Description) -> Iterator[Problem]:
    owner: dict[str, str] = {}
    segments = desc.network.segments
    for name, node in desc.nodes.items():
        if "management" not in node.addresses:
            yield Problem(f"nodes.{name}.addresses", "management-address-required",
                          "every node needs a management address", sorted(node.addresses))
        for seg, addr in node.addresses.items():
            path = f"nodes.{name}.addresses.{seg}"
            if seg not in segments:
                yield Problem(path, "segment-exists", "no such network segment", seg)
                continue
            net = ipaddress.ip_network(segments[seg].cidr)
            ip = ipaddress.ip_address(addr)
            if ip not in net:
                yield Problem(path, "address-in-segment",
                              f"address is outside segment {seg} {net}", addr)
            elif net.num_addresses > 2 and ip in (net.network_address, net.broadcast_address):
                yield Problem(path, "host-address",
                              "network and broadcast addresses cannot be assigned", addr)
            if addr in owner:
                yield Problem(path, "address-unique", f"address is already used by {owner[addr]}",
                              addr)
            owner[addr] = path


@rule("network", "burst_groups")
def network(desc: Description) -> Iterator[Problem]:
    net = desc.network
    for required in SEGMENT_NAMES:
        if required not in net.segments:
            yield Problem("network.segments", "segment-required",
                          f"segment {required} must be declared", sorted(net.segments))
    cidrs: list[tuple[str, ipaddress.IPv4Network | ipaddress.IPv6Network]] = []
    vlans: dict[int, str] = {}
    for name, seg in net.segments.items():
        cidrs.append((f"network.segments.{name}.cidr", ipaddress.ip_network(seg.cidr)))
        if seg.cloud_cidr is not None:
            cidrs.append((f"network.segments.{name}.cloud_cidr",
                          ipaddress.ip_network(seg.cloud_cidr)))
        elif desc.burst_groups:
            yield Problem(f"network.segments.{name}.cloud_cidr", "cloud-cidr-required",
                          "burst groups need a cloud CIDR for every segment", None)
        if seg.vlan in vlans:
            yield Problem(f"network.segments.{name}.vlan", "vlan-unique",
                          f"VLAN id is already used by segment {vlans[seg.vlan]}", seg.vlan)
        vlans[seg.vlan] = name
    for (pa, a), (pb, b) in combinations(cidrs, 2):
        if a.version == b.version and a.overlaps(b):
            yield Problem(pb, "cidr-overlap", f"overlaps {pa} ({a})", str(b))
    for i, cidr in enumerate(net.admin_cidrs):
        if ipaddress.ip_network(cidr).prefixlen == 0:
            yield Problem(f"network.admin_cidrs[{i}]", "admin-cidr-not-open",
                          "management must not be open to the whole internet", cidr)
    if "management" in net.segments and _carries(desc, "management", "management", {SSH_PORT}):
        yield Problem("network.flows", "management-ssh-flow",
                      "a management-to-management flow must carry SSH (tcp 22): the "
                      "firewall admits nothing else, and nodes are managed over it", None)
    for i, flow in enumerate(net.flows):
        path = f"network.flows[{i}]"
        for field, seg in (("from", flow.from_), ("to", flow.to)):
            if seg not in net.segments:
                yield Problem(f"{path}.{field}", "segment-exists", "no such network segment",
                              seg)
        if flow.protocol != "all" and not flow.ports:
            yield Problem(f"{path}.ports", "ports-required",
                          "tcp and udp flows must list their ports", [])


def _carries(desc: Description, src: str, dst: str, ports: set[int]) -> set[int]:
    """The TCP ports of `ports` that no flow from segment src to segment dst carries."""
    missing = set(ports)
    for f in desc.network.flows:
        if f.from_ == src and f.to == dst:
            if f.protocol == "all":
                missing &= set(closed_to_all_flows(src))
            if f.protocol == "tcp":
                missing -= set(f.ports)
    return missing


@rule("network", "node_classes")
def metrics_flow(desc: Description) -> Iterator[Problem]:
    """Prometheus on the controller scrapes every node's exporters on its management
    address: without a management-to-management flow carrying their ports the firewall
    drops the scrapes, every target is down and the dashboards are empty."""
    if "management" not in desc.network.segments:
        return
    gpus = any(c.gpu is not None for c in desc.node_classes.values())
    want = _carries(desc, "management", "management",
                    {NODE_EXPORTER_PORT} | ({DCGM_EXPORTER_PORT} if gpus else set()))
    if want:
        yield Problem("network.flows", "management-metrics-flow",
                      "a management-to-management flow must carry the exporters' ports "
                      f"(tcp {', '.join(map(str, sorted(want)))}): Prometheus on the "
                      "controller scrapes each node on its management address", None)


# A burst node's only address is in a BURST_SEGMENT subnet and the controller is reached
# on its management address.
CONTROLLER_SEGMENT = MANAGEMENT_SEGMENT


@rule("network", "burst_groups")
def burst_slurm_flows(desc: Description) -> Iterator[Problem]:
    """A burst node registers with slurmctld and slurmctld calls back to its slurmd: without
    both flows the security groups and the controller's firewall drop the registration,
    and every burst node boots, never joins, and is marked DOWN at ResumeTimeout."""
    segments = desc.network.segments
    if not desc.burst_groups or not {BURST_SEGMENT, CONTROLLER_SEGMENT} <= set(segments):
        return
    for src, dst, port, who in ((BURST_SEGMENT, CONTROLLER_SEGMENT, SLURMCTLD_PORT,
                                 "slurmd registers with slurmctld"),
                                (CONTROLLER_SEGMENT, BURST_SEGMENT, SLURMD_PORT,
                                 "slurmctld reaches slurmd")):
        if _carries(desc, src, dst, {port}):
            yield Problem("network.flows", "burst-slurm-flow",
                          f"burst groups need a {src}-to-{dst} flow carrying tcp {port} "
                          f"({who}; burst nodes live in the {BURST_SEGMENT} subnets, the "
                          f"controller on its {CONTROLLER_SEGMENT} address)", None)


# The Amazon side's default ASN (a virtual private gateway's) and AS_TRANS (RFC 6793): a
# customer gateway speaking either could not peer with AWS.
RESERVED_BGP_ASNS = {64512: "the Amazon side's ASN of the virtual private gateway",
                     23456: "AS_TRANS (RFC 6793), not a real AS"}


# IPv4 blocks no customer gateway can be reached at over the internet (RFC 6890): this
# host, private, shared (CGNAT), loopback, link-local, multicast and reserved. The RFC 5737
# documentation blocks are allowed: descriptions in docs and tests use them.
NOT_INTERNET = [ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4")]


@rule("network", "burst_groups")
def hybrid_links(desc: Description) -> Iterator[Problem]:
    links = desc.network.hybrid_links
    by_region: dict[str, list[str]] = defaultdict(list)
    for name, g in desc.burst_groups.items():
        by_region[g.region].append(name)
    for region, groups in sorted(by_region.items()):
        if region not in links:
            yield Problem("network.hybrid_links", "hybrid-link-required",
                          f"burst region {region} (groups {', '.join(groups)}) has no link to "
                          f"on-prem, so its nodes could never reach the controller: declare "
                          f"network.hybrid_links.{region} (vpn, transit_gateway or "
                          "direct_connect_gateway)", region)
    for region, link in links.items():
        path = f"network.hybrid_links.{region}"
        declared = [k for k in LINK_KINDS if getattr(link, k) is not None]
        if len(declared) != 1:
            yield Problem(path, "hybrid-link-one-kind", "declare exactly one of vpn, "
                          "transit_gateway or direct_connect_gateway", declared)
        if link.vpn is not None:
            ip = ipaddress.ip_address(link.vpn.customer_gateway)
            if ip.version != 4 or any(ip in n for n in NOT_INTERNET):
                yield Problem(f"{path}.vpn.customer_gateway", "customer-gateway-public",
                              "a customer gateway is reached over the internet: it needs a "
                              "public IPv4 address", link.vpn.customer_gateway)
            if link.vpn.bgp_asn in RESERVED_BGP_ASNS:
                yield Problem(f"{path}.vpn.bgp_asn", "bgp-asn-not-reserved",
                              f"the customer gateway needs an ASN of its own; this one "
                              f"is {RESERVED_BGP_ASNS[link.vpn.bgp_asn]}",
                              link.vpn.bgp_asn)
        if link.egress is Egress.NAT and region in by_region and spare_block_missing(
                desc, region):
            yield Problem(f"{path}.egress", "nat-needs-spare-block",
                          "the NAT gateway's subnet takes the management segment's spare "
                          "cloud block, and every block is used by a zone", "nat")


def spare_block_missing(desc: Description, region: str) -> bool:
    """Whether every per-zone block of the cloud CIDRs is taken (see
    render/cloud/network.py subnets)."""
    zones = {z for g in desc.burst_groups.values() if g.region == region
             for z in g.availability_zones}
    return len(zones) >= 4 and len(zones) & (len(zones) - 1) == 0


@rule("burst_groups", "storage_tiers", "task_classes", "teams")
def burst_groups(desc: Description) -> Iterator[Problem]:
    checkpoints = [t for t in desc.storage_tiers.values() if t.purpose is Purpose.CHECKPOINTS]
    cloud_checkpoints = [t for t in checkpoints if is_bucket_tier(t)]
    if desc.burst_groups and not any(t.purpose is Purpose.DATASETS and is_bucket_tier(t)
                                     for t in desc.storage_tiers.values()):
        yield Problem("burst_groups", "burst-image-datasets-bucket",
                      "the burst image's build artifact is kept in the datasets tier's "
                      "bucket: burst groups need a datasets tier with location both (its "
                      "on-prem mount and a bucket) or cloud", sorted(desc.burst_groups))
    requeue_classes = [n for n, c in desc.task_classes.items() if c.preemptible and c.requeue]
    for name, g in desc.burst_groups.items():
        path = f"burst_groups.{name}"
        unknown_types = [t for t in g.instance_types if t not in INSTANCE_TYPES]
        for t in unknown_types:
            yield Problem(f"{path}.instance_types", "instance-type-known",
                          unknown("instance type", t, INSTANCE_TYPES), t)
        if not unknown_types:
            shapes = {f"{INSTANCE_TYPES[t].gpus}x{INSTANCE_TYPES[t].gpu_model}"
                      for t in g.instance_types}
            if len(shapes) > 1:
                yield Problem(f"{path}.instance_types", "instance-types-one-shape",
                              "fallback instance types must carry the same GPUs (model and "
                              "count), so a node's GRES stays true", sorted(shapes))
            if g.efa:
                for t in g.instance_types:
                    if INSTANCE_TYPES[t].efa_interfaces == 0:
                        yield Problem(f"{path}.instance_types", "efa-supported",
                                      "efa is set but this instance type has no EFA", t)
        for i, az in enumerate(g.availability_zones):
            if not az.startswith(g.region):
                yield Problem(f"{path}.availability_zones[{i}]", "az-in-region",
                              f"zone is not in region {g.region}", az)
        if len(set(g.capacity)) != len(g.capacity):
            yield Problem(f"{path}.capacity", "capacity-unique", "a capacity type is listed "
                          "twice", [c.value for c in g.capacity])
        if g.min_nodes > g.max_nodes:
            yield Problem(f"{path}.min_nodes", "min-le-max",
                          f"min_nodes exceeds max_nodes ({g.max_nodes})", g.min_nodes)
        if g.on_demand_base and Capacity.ON_DEMAND not in g.capacity:
            yield Problem(f"{path}.on_demand_base", "on-demand-base-needs-on-demand",
                          "an on-demand base needs on-demand in capacity", g.on_demand_base)
        elif g.on_demand_base > g.max_nodes:
            yield Problem(f"{path}.on_demand_base", "on-demand-base-le-max",
                          f"on_demand_base exceeds max_nodes ({g.max_nodes})", g.on_demand_base)
        if g.team is not None and g.team not in desc.teams:
            yield Problem(f"{path}.team", "team-exists", "no such team", g.team)
        if Capacity.SPOT in g.capacity:
            if not checkpoints:
                yield Problem(f"{path}.capacity", "spot-needs-checkpoints",
                              "spot capacity needs a storage tier with purpose checkpoints",
                              "spot")
            elif not cloud_checkpoints:
                yield Problem(f"{path}.capacity", "spot-checkpoints-in-cloud",
                              "spot nodes write their checkpoints to a checkpoints tier's "
                              "bucket; an on-prem-only tier reaches them only over the hybrid "
                              "link, where a two-minute interruption notice cannot be relied "
                              "on to save a checkpoint: give a checkpoints tier location both "
                              "(its on-prem mount and a bucket) or cloud", "spot")
            if not requeue_classes:
                yield Problem(f"{path}.capacity", "spot-needs-requeue-class",
                              "spot capacity needs a preemptible task class with requeue",
                              "spot")


@rule("teams", "burst_groups", "node_classes", "nodes", "sites")
def teams(desc: Description) -> Iterator[Problem]:
    if any(t not in INSTANCE_TYPES for g in desc.burst_groups.values() for t in g.instance_types):
        return  # capacity is unknown until the burst groups are fixed
    if any(nc.gpu is not None and nc.gpu.model not in GPU_MODELS
           for nc in desc.node_classes.values()):
        return
    if any(n.class_ not in desc.node_classes for n in desc.nodes.values()):
        return
    capacity = {m: sum(c.values()) for m, c in gpu_capacity(desc).items()}
    nominal: dict[str, int] = defaultdict(int)
    offered = mig.mig_capacity(desc)
    for name, team in desc.teams.items():
        path = f"teams.{name}"
        for model, gpus in team.quota.items():
            if model not in capacity:
                yield Problem(f"{path}.quota.{model}", "quota-model-in-pool",
                              f"the pool has no {model} GPUs; it has: "
                              f"{', '.join(capacity) or 'none'}", gpus)
                continue
            nominal[model] += gpus
        for model, gpus in team.borrowing_limit.items():
            if model not in team.quota:
                yield Problem(f"{path}.borrowing_limit.{model}", "borrowing-needs-quota",
                              "a team borrows only models it has a quota for", gpus)
            elif model in capacity and team.quota[model] + gpus > capacity[model]:
                yield Problem(f"{path}.borrowing_limit.{model}", "borrowing-within-capacity",
                              f"quota + borrowing exceeds the pool's {capacity[model]} "
                              f"{model} GPUs", gpus)
        for profile, instances in team.mig_quota.items():
            if profile not in offered:
                yield Problem(f"{path}.mig_quota.{profile}", "mig-quota-profile-in-pool",
                              "no compute node's class offers this MIG profile; offered: "
                              f"{', '.join(offered) or 'none'}", instances)
            elif instances > offered[profile]:
                yield Problem(f"{path}.mig_quota.{profile}", "mig-quota-within-capacity",
                              f"the pool has {offered[profile]} {profile} instances",
                              instances)
        for role, users in team.members.items():
            if len(set(users)) != len(users):
                yield Problem(f"{path}.members.{role.value}", "member-unique",
                              "a member is listed twice", users)
    for model, total in nominal.items():
        if total > capacity[model]:
            yield Problem(f"teams.*.quota.{model}", "quota-within-capacity",
                          f"nominal quotas add up to {total} but the pool has "
                          f"{capacity[model]} {model} GPUs; declare borrowing instead", total)


@rule("task_classes")
def task_classes(desc: Description) -> Iterator[Problem]:
    classes = desc.task_classes
    prio: dict[int, str] = {}
    for name, tc in classes.items():
        path = f"task_classes.{name}"
        if tc.priority in prio:
            yield Problem(f"{path}.priority", "priority-unique",
                          f"priority is already used by {prio[tc.priority]}", tc.priority)
        prio[tc.priority] = name
        if tc.requeue and not tc.preemptible:
            yield Problem(f"{path}.requeue", "requeue-needs-preemptible",
                          "only a preemptible class is requeued", True)
        if duration_seconds(tc.grace_time) > 0 and not tc.preemptible:
            yield Problem(f"{path}.grace_time", "grace-needs-preemptible",
                          "grace time applies to preempted jobs only", tc.grace_time)
        if duration_seconds(tc.grace_time) >= duration_seconds(tc.max_runtime):
            yield Problem(f"{path}.grace_time", "grace-below-runtime",
                          f"grace time must be shorter than max_runtime {tc.max_runtime}",
                          tc.grace_time)
        if tc.idle_reclaim:
            yield from _idle_reclaim(f"{path}.idle_reclaim", tc.idle_reclaim, tc)
        for i, victim in enumerate(tc.preempts):
            vpath = f"{path}.preempts[{i}]"
            target = classes.get(victim)
            if target is None:
                yield Problem(vpath, "class-exists", "no such task class", victim)
            elif not target.preemptible:
                yield Problem(vpath, "preempt-target-preemptible",
                              f"{victim} is not preemptible", victim)
            elif target.priority >= tc.priority:
                yield Problem(vpath, "preempt-lower-priority",
                              f"{victim} has priority {target.priority}, not below "
                              f"{tc.priority}", victim)


# Prometheus must have seen the idle GPUs for a few scrapes (15 s in the monitoring role)
# and the controller's timer must have run (every minute) before a job is judged idle.
IDLE_RECLAIM_MIN_S = 60


def _idle_reclaim(path: str, reclaim: IdleReclaim, tc: TaskClass) -> Iterator[Problem]:
    after, warn = duration_seconds(reclaim.after), duration_seconds(reclaim.warn)
    if after < IDLE_RECLAIM_MIN_S:
        yield Problem(f"{path}.after", "idle-window-minimum",
                      f"GPUs are judged idle over at least {IDLE_RECLAIM_MIN_S}s",
                      reclaim.after)
    elif after + warn >= duration_seconds(tc.max_runtime):
        yield Problem(f"{path}.after", "idle-before-runtime",
                      f"after + warn ({reclaim.warn}) must be shorter than max_runtime "
                      f"{tc.max_runtime}, or no job is ever reclaimed", reclaim.after)
    if reclaim.action == ReclaimAction.REQUEUE and not tc.requeue:
        yield Problem(f"{path}.action", "idle-requeue-needs-requeue",
                      "requeue needs a class whose jobs are requeued (requeue: true)",
                      reclaim.action.value)


@rule("storage_tiers")
def storage(desc: Description) -> Iterator[Problem]:
    mounts: dict[str, str] = {}
    for name, tier in desc.storage_tiers.items():
        path = f"storage_tiers.{name}"
        last_days, last_cold = 0, _COLDNESS[tier.temperature]
        for i, tr in enumerate(tier.lifecycle):
            tpath = f"{path}.lifecycle[{i}]"
            if tr.after_days <= last_days:
                yield Problem(f"{tpath}.after_days", "lifecycle-ascending",
                              "transitions must come in increasing after_days", tr.after_days)
            if tr.after_days >= tier.retention_days:
                yield Problem(f"{tpath}.after_days", "lifecycle-within-retention",
                              f"transition after expiry ({tier.retention_days} days)",
                              tr.after_days)
            if _COLDNESS[tr.temperature] <= last_cold:
                yield Problem(f"{tpath}.temperature", "lifecycle-colder",
                              "each transition must move to a colder tier",
                              tr.temperature.value)
            last_days, last_cold = tr.after_days, _COLDNESS[tr.temperature]
        if tier.mount is not None:
            if tier.mount.path in mounts:
                yield Problem(f"{path}.mount.path", "mount-unique",
                              f"mount point is already used by {mounts[tier.mount.path]}",
                              tier.mount.path)
            mounts[tier.mount.path] = name


@rule("software")
def software(desc: Description) -> Iterator[Problem]:
    sw = desc.software
    locked = sw.model_dump(exclude={"blocklist", "per_release"})
    for component, versions in sw.blocklist.items():
        if component not in locked:
            yield Problem(f"software.blocklist.{component}", "blocklist-component",
                          f"not a locked component; known: {', '.join(locked)}", component)
        elif version_key(locked[component]) in {version_key(v) for v in versions}:
            yield Problem(f"software.{component}", "version-not-blocklisted",
                          "the locked version is on the blocklist", locked[component])
    for path, component, version in os_release.locked_versions(desc):
        if component in FIXED_IN and older_than(version, FIXED_IN[component][0]):
            yield Problem(path, "version-vulnerable", FIXED_IN[component][1], version)


@rule("pool", "software")
def version_floors(desc: Description) -> Iterator[Problem]:
    """A production pool installs no Slurm or NVIDIA driver release that a published
    advisory says is vulnerable in its release line (gpupool/data/version-floors). A lab
    is not held to it: the lab lists the floors it is below among the controls it weakens
    (gpupool/spec/lab.py)."""
    if desc.pool.environment != "production":
        return
    yield from floor_problems(desc)


def floor_problems(desc: Description) -> Iterator[Problem]:
    """Every locked component below its floor, whatever the environment."""
    checked = set(floors.components())
    for path, component, locked in os_release.locked_versions(desc):
        if component not in checked:
            continue
        try:
            verdict = floors.check(component, locked)
        except floors.VersionError as exc:
            yield Problem(path, "version-comparable",
                          f"cannot be compared with the advisories' fixed versions: {exc}",
                          locked)
            continue
        if verdict is not None:
            yield Problem(path, "version-floor", verdict.message, locked)


@rule("environment_images", "teams", "task_classes")
def environment_image_users(desc: Description) -> Iterator[Problem]:
    """Each environment image names who uses it, among the description's teams and task
    classes: an image nobody runs in is a typo more often than an intent."""
    for name, image in desc.environment_images.items():
        path = f"environment_images.{name}"
        if not image.teams and not image.task_classes:
            yield Problem(path, "image-users",
                          "name the teams or task classes whose jobs use the image", None)
        for field, known in (("teams", desc.teams), ("task_classes", desc.task_classes)):
            for i, user in enumerate(getattr(image, field)):
                if user not in known:
                    what = "team" if field == "teams" else "task class"
                    yield Problem(f"{path}.{field}[{i}]", "image-user-known",
                                  unknown(what, user, known), user)
        seen: dict[str, int] = {}
        for i, pin in enumerate(image.python_packages):
            # PEP 503: names differing only in case and runs of -_. are one project.
            key = re.sub(r"[-_.]+", "-", pin.partition("==")[0]).lower()
            if key in seen:
                yield Problem(f"{path}.python_packages[{i}]", "python-package-unique",
                              f"already pinned at python_packages[{seen[key]}]", pin)
            seen.setdefault(key, i)


@rule("environment_images", "software", "node_classes", "nodes")
def environment_image_cuda(desc: Description) -> Iterator[Problem]:
    """An image's CUDA runtime needs at least the driver its toolkit release was made for
    (NVIDIA's table, gpupool/data/cuda-driver): a runtime newer than the locked driver
    supports fails the job at its first CUDA call, on every node. Each release the pool's
    nodes and burst nodes run has its own driver lock (software.per_release): an image
    must run under each."""
    releases = {*os_release.releases_in_use(desc), os_release.burst_release(desc)}
    drivers = {os_release.versions(desc, r)["nvidia_driver"]: r for r in sorted(releases)}
    for name, image in desc.environment_images.items():
        path = f"environment_images.{name}.cuda"
        row = cuda_driver.release(image.cuda)
        if row is None:
            yield Problem(path, "image-cuda-known",
                          unknown("CUDA release (gpupool/data/cuda-driver)", image.cuda,
                                  cuda_driver.releases()), image.cuda)
            continue
        for driver, release in drivers.items():
            if not cuda_driver.runs_on(row, driver):
                where = os_release.lock_path(desc, release, "nvidia_driver")
                yield Problem(path, "image-cuda-driver",
                              f"{row.label} needs NVIDIA driver {row.driver} or later; "
                              f"{where} is locked at {driver} ({release.value} nodes)",
                              image.cuda)


# Ports a registry may not take on its host: the management plane's, srun's range, and
# what the monitoring role (Prometheus, Alertmanager) and a Kubernetes node (API server,
# kubelet, etcd, the pod networks' BGP and health ports) listen on.
REGISTRY_TAKEN_PORTS = frozenset({
    *MANAGEMENT_PLANE_PORTS, PROMETHEUS_PORT, ALERTMANAGER_PORT, API_SERVER_PORT, KUBELET_PORT,
    *ETCD_PORTS, BGP_PORT, CILIUM_HEALTH_PORT, *range(SRUN_PORTS[0], SRUN_PORTS[1] + 1)})
GIB_PER_TIB = 1024


@rule("image_registry", "nodes", "storage_tiers")
def image_registry(desc: Description) -> Iterator[Problem]:
    """The registry's host is an on-prem node nodes reach on its management address, on a
    port nothing else there listens on; its images live on a mounted on-prem tier large
    enough for the space it is given."""
    reg = desc.image_registry
    if reg is None:
        return
    node = desc.nodes.get(reg.host)
    if node is None:
        yield Problem("image_registry.host", "image-registry-host",
                      unknown("node", reg.host, desc.nodes), reg.host)
    elif MANAGEMENT_SEGMENT not in node.addresses:
        yield Problem("image_registry.host", "image-registry-host",
                      f"node {reg.host} has no {MANAGEMENT_SEGMENT} address for nodes to "
                      "pull from", reg.host)
    elif ":" in node.addresses[MANAGEMENT_SEGMENT]:
        # An image reference names its registry host[:port]: an IPv6 address has no place
        # there without brackets, which skopeo's and Slurm's parsers do not all take.
        yield Problem("image_registry.host", "image-registry-host",
                      f"node {reg.host}'s {MANAGEMENT_SEGMENT} address is IPv6: the registry "
                      "is named by an IPv4 address in image references", reg.host)
    if reg.port in REGISTRY_TAKEN_PORTS:
        yield Problem("image_registry.port", "image-registry-port",
                      "another of the pool's daemons listens on it (the management plane, "
                      "srun's range, monitoring or Kubernetes): pick another", reg.port)
    tier = desc.storage_tiers.get(reg.tier)
    if tier is None:
        yield Problem("image_registry.tier", "image-registry-tier",
                      unknown("storage tier", reg.tier, desc.storage_tiers), reg.tier)
        return
    if tier.mount is None or tier.mount.fstype is FsType.OBJECT or (
            tier.located is Location.CLOUD):
        yield Problem("image_registry.tier", "image-registry-tier",
                      "the registry keeps its images in a file system on its host: name a "
                      "tier with an on-prem local, NFS or Lustre mount", reg.tier)
    elif "ro" in tier.mount.options:
        yield Problem("image_registry.tier", "image-registry-tier",
                      f"tier {reg.tier} is mounted read-only (option ro): the registry writes "
                      "its images there", reg.tier)
    capacity = tier.size_tib * GIB_PER_TIB
    if reg.size_gib > capacity:
        yield Problem("image_registry.size_gib", "image-registry-size",
                      f"tier {reg.tier} holds {capacity:g} GiB ({tier.size_tib:g} TiB), less "
                      f"than the {reg.size_gib} GiB the registry is given", reg.size_gib)


@rule("pool", "software", "node_classes", "nodes")
def mig_needs_nvml(desc: Description) -> Iterator[Problem]:
    """A production MIG layout is found by Slurm's NVML plugin only: without it gres.conf
    would have to name each instance's /dev/nvidia-caps files, whose numbers the driver
    assigns when the instances are made and the description does not hold, and jobs would
    get no MIG UUIDs. So a production pool whose Slurm lock leaves the plugin uninstallable
    (gpupool/spec/gpu_detection.py) is refused where a compute node's class splits its GPUs.
    Whole GPUs need no plugin: gres.conf names their device files instead. The lab names
    fixture devices for both (gpupool/render/slurm.py)."""
    if desc.pool.environment != "production":
        return
    used = {n.class_ for n in desc.nodes.values() if NodeRole.COMPUTE in n.roles}
    partitioned = [name for name, nc in desc.node_classes.items()
                   if name in used and mig.is_partitioned(nc.gpu)]
    if not partitioned:
        return
    for name in partitioned:
        slurm = os_release.lock(desc, desc.node_classes[name].os)["slurm"]
        detection = gpu_detection.for_lock(slurm)
        if detection is None or detection.available:  # a bad lock: version-comparable
            continue
        yield Problem(f"node_classes.{name}.gpu.mig_profiles", "mig-needs-nvml",
                      "MIG instances reach Slurm only through its NVML plugin "
                      "(AutoDetect=nvml), which cannot be installed with this Slurm lock: "
                      f"{detection.reason}", slurm)


def _reserved_user(user: str) -> bool:
    return (user in RESERVED_USERS or user in SYSTEM_ACCOUNTS
            or user.startswith(("systemd-", "_")) or _group_clash(user))


def _group_clash(user: str) -> bool:
    """A member's own group is named as the member: one named team-<x> or gpupool-<x> would
    be, or become, a team's or a member role's group (roles/common)."""
    return user.startswith((TEAM_GROUP_PREFIX, ROLE_GROUP_PREFIX))


def _reserved_team(team: str) -> bool:
    return (team in RESERVED_NAMESPACES or team in RESERVED_SLURM_NAMES
            or team in RESERVED_BUCKET_PREFIXES)


@rule("teams", "ids")
def fixed_ids(desc: Description) -> Iterator[Problem]:
    """Ids name members and teams, all of them once any is fixed (an id a host picks for
    an unnamed member may be one fixed for someone else), and no id twice: a member's own
    group takes their uid as its gid, so users and teams share one space."""
    ids = desc.ids
    members = {u for t in desc.teams.values() for us in t.members.values() for u in us}
    for user in ids.users:
        if user not in members:
            yield Problem(f"ids.users.{user}", "ids-member", "not a member of any team", user)
    for team in ids.teams:
        if team not in desc.teams:
            yield Problem(f"ids.teams.{team}", "ids-team", "no such team", team)
    if ids.users or ids.teams:
        # Names refused as reserved (rule `names`) are no accounts to number.
        people = {u for u in members if not _reserved_user(u)}
        teams = {t for t in desc.teams if not _reserved_team(t)}
        for kind, missing in (("users", sorted(people - ids.users.keys())),
                              ("teams", sorted(teams - ids.teams.keys()))):
            if missing:
                yield Problem(f"ids.{kind}", "ids-complete",
                              f"once ids are fixed every {kind[:-1]} needs one", missing)
    seen: dict[int, str] = {}
    for kind, table in (("users", ids.users), ("teams", ids.teams)):
        for name, number in table.items():
            if number in seen:
                yield Problem(f"ids.{kind}.{name}", "ids-unique",
                              f"already {seen[number]}'s (a member's own group takes their "
                              "uid as its gid)", number)
            seen.setdefault(number, f"{kind[:-1]} {name}")


@rule("teams", "task_classes", "nodes", "burst_groups", "sites")
def names(desc: Description) -> Iterator[Problem]:
    """Names that something else already owns, or that gpupool generates itself."""
    for team, t in desc.teams.items():
        owners = [what for names, what in (
            (RESERVED_NAMESPACES, "a Kubernetes system or operator namespace (a team's "
                                  "namespace is named as the team)"),
            (RESERVED_SLURM_NAMES, "Slurm's own (a team is a Slurm account)"),
            (RESERVED_BUCKET_PREFIXES, "the controller backups' prefix "
                                       f"{CONTROLLER_BACKUP_PREFIX} in the bucket where teams "
                                       "keep checkpoints under <team>/")) if team in names]
        # (_reserved_team says the same for the ids rule.)
        if owners:
            yield Problem(f"teams.{team}", "team-name-reserved",
                          "the name is " + " and ".join(owners), team)
        if len(group := TEAM_GROUP_PREFIX + team) > UNIX_NAME_MAX:
            yield Problem(f"teams.{team}", "team-name-length",
                          f"the team's Unix group {group} would be {len(group)} characters; "
                          f"groupadd takes at most {UNIX_NAME_MAX} (a team name at most "
                          f"{UNIX_NAME_MAX - len(TEAM_GROUP_PREFIX)})", team)
        for role, users in t.members.items():
            for i, user in enumerate(users):
                if _group_clash(user):
                    yield Problem(f"teams.{team}.members.{role.value}[{i}]", "user-name-group",
                                  f"a member's own group is named as the member, and "
                                  f"{TEAM_GROUP_PREFIX}* and {ROLE_GROUP_PREFIX}* are the "
                                  "teams' and member roles' groups", user)
                elif _reserved_user(user):
                    yield Problem(f"teams.{team}.members.{role.value}[{i}]", "user-reserved",
                                  "a system or service account of the nodes, not a person",
                                  user)
    for name in desc.task_classes:
        if name in RESERVED_SLURM_NAMES:
            yield Problem(f"task_classes.{name}", "class-name-reserved",
                          "a task class is a Slurm partition and QOS: this name is Slurm's "
                          "own", name)
    # slurm.conf and topology.conf read DEFAULT (in any case) as the defaults line and ALL
    # as every node, and "localhost" as a host name breaks the node's own /etc/hosts.
    for section, names_ in (("nodes", desc.nodes), ("burst_groups", desc.burst_groups),
                            *((f"sites.{site}.leaf_switches", s.leaf_switches)
                              for site, s in desc.sites.items())):
        for name in names_:
            if name in RESERVED_SLURM_NAMES or name == "localhost":
                yield Problem(f"{section}.{name}", "name-reserved",
                              "Slurm's own keyword or the loopback host name", name)
    # Burst groups name their cloud nodes <group>-<i> and get a switch named as the group.
    generated = {n: g for g, grp in desc.burst_groups.items()
                 for n in (f"{g}-{i}" for i in range(grp.max_nodes))}
    for g, grp in desc.burst_groups.items():
        # Each is a host name: a DNS label like any node's name.
        if grp.max_nodes and len(last := f"{g}-{grp.max_nodes - 1}") > DNS_LABEL_MAX:
            yield Problem(f"burst_groups.{g}", "burst-node-name-length",
                          f"its nodes are named up to {last}, {len(last)} characters; a host "
                          f"name is at most {DNS_LABEL_MAX}", g)
    for node in desc.nodes:
        if node in generated:
            yield Problem(f"nodes.{node}", "node-name-generated",
                          f"burst group {generated[node]} names its cloud nodes like this",
                          node)
    for site, s in desc.sites.items():
        for leaf in s.leaf_switches:
            if leaf in desc.burst_groups:
                yield Problem(f"sites.{site}.leaf_switches.{leaf}", "switch-name-generated",
                              "burst groups get a switch of their own named as the group",
                              leaf)


@rule("storage_tiers")
def mounts(desc: Description) -> Iterator[Problem]:
    for name, tier in desc.storage_tiers.items():
        if tier.mount is None:
            continue
        path = f"storage_tiers.{name}.mount"
        mount = tier.mount  # its path's pattern already refuses '.', '..', '//' and a final '/'
        if any(mount.path == d or mount.path.startswith(d + "/") for d in SYSTEM_DIRECTORIES):
            yield Problem(f"{path}.path", "mount-path-system",
                          "a tier may not be mounted over the operating system's directories",
                          mount.path)
        allowed = MOUNT_OPTIONS[mount.fstype.value]
        for i, option in enumerate(mount.options):
            if option not in allowed:
                yield Problem(f"{path}.options[{i}]", "mount-option-allowed",
                              f"not an option gpupool allows for {mount.fstype.value}: "
                              f"{', '.join(sorted(allowed))}", option)
        if len(set(mount.options)) != len(mount.options):
            yield Problem(f"{path}.options", "mount-option-unique", "an option is listed twice",
                          mount.options)
        remote = mount.fstype.value in ("nfs", "lustre")
        if remote and not mount.source:
            yield Problem(f"{path}.source", "mount-source-required",
                          f"{mount.fstype.value} mounts name their server and export", None)
        if not remote and mount.source:
            yield Problem(f"{path}.source", "mount-source-unused",
                          f"{mount.fstype.value} mounts take no source", mount.source)


@rule("pool", "storage_tiers")
def buckets(desc: Description) -> Iterator[Problem]:
    """Each bucket tier's S3 bucket is named by model.bucket_name: S3 refuses a name out of
    its length or with a prefix it keeps, and the stack would fail only when it is applied."""
    low, high = BUCKET_NAME_LENGTH
    for name, tier in desc.storage_tiers.items():
        if not is_bucket_tier(tier):
            continue
        bucket = bucket_name(desc.pool.name, name, desc.pool.cloud_region)
        if not low <= len(bucket) <= high:
            yield Problem(f"storage_tiers.{name}", "bucket-name-length",
                          f"its S3 bucket {bucket} would be {len(bucket)} characters; S3 "
                          f"takes {low} to {high}: shorten the pool or tier name", name)
    if desc.pool.name.startswith(BUCKET_RESERVED_PREFIXES) and any(
            is_bucket_tier(t) for t in desc.storage_tiers.values()):
        yield Problem("pool.name", "bucket-name-prefix",
                      "the pool's buckets start with its name, and S3 refuses names starting "
                      f"with {', '.join(BUCKET_RESERVED_PREFIXES)}", desc.pool.name)


@rule("storage_tiers", "lustre_client")
def lustre_client(desc: Description) -> Iterator[Problem]:
    """Debian has no Lustre client: a pool that mounts Lustre says where its nodes get it
    (roles/storage installs it from there), and a repository that is flat (suite "./")
    has no components while one with a codename has some, as apt reads them."""
    lustre = [n for n, t in desc.storage_tiers.items()
              if t.mount is not None and t.mount.fstype is FsType.LUSTRE]
    client = desc.lustre_client
    if lustre and client is None:
        yield Problem("lustre_client", "lustre-client-source",
                      f"storage tier {lustre[0]} mounts Lustre, which Debian does not "
                      "package: name the apt repository of the Lustre client (repository, "
                      "key_url, version)", None)
    if client is None:
        return
    if client.suite.endswith("/") and client.components:
        yield Problem("lustre_client.components", "apt-flat-no-components",
                      f"a flat repository (suite {client.suite}) has no components",
                      client.components)
    if not client.suite.endswith("/") and not client.components:
        yield Problem("lustre_client.components", "apt-suite-components",
                      f"suite {client.suite} needs its components (main, ...)", [])


@rule("network", "nodes")
def ipv4(desc: Description) -> Iterator[Problem]:
    """The firewall, the lab and the cloud side are IPv4: an IPv6 value would be dropped
    or break them, so it is refused where it is written. Admin ranges are private."""
    net = desc.network
    values = [(f"network.segments.{n}.{f}", v) for n, s in net.segments.items()
              for f, v in (("cidr", s.cidr), ("cloud_cidr", s.cloud_cidr)) if v]
    values += [(f"network.admin_cidrs[{i}]", c) for i, c in enumerate(net.admin_cidrs)]
    values += [(f"nodes.{n}.addresses.{s}", a) for n, node in desc.nodes.items()
               for s, a in node.addresses.items()]
    for where, value in values:
        if ":" in value:
            yield Problem(where, "ipv4-only", "IPv6 is not supported yet; use IPv4", value)
    for i, cidr in enumerate(net.admin_cidrs):
        network = ipaddress.ip_network(cidr)
        if network.version == 4 and network.prefixlen > 0 and not network.is_private:
            # Pieces of the internet (two /1s) are as open as 0.0.0.0/0.
            yield Problem(f"network.admin_cidrs[{i}]", "admin-cidr-private",
                          "admin ranges must be private (RFC 1918 and the like): the "
                          "management plane is never open to public addresses", cidr)


@rule("network")
def admin_ranges(desc: Description) -> Iterator[Problem]:
    """Admin ranges are sources of the management plane (sshd, Slurm's daemons, the
    exporters): one that covers, or lies in, a training or storage segment, or any cloud
    block, makes every host there an operator's source, which the firewall keeps them from
    being. It may lie in the on-prem management segment (operators' hosts live there)."""
    blocks = [(f"network.segments.{n}.{f}", ipaddress.ip_network(v))
              for n, s in desc.network.segments.items()
              for f, v in (("cidr", s.cidr if n != MANAGEMENT_SEGMENT else None),
                           ("cloud_cidr", s.cloud_cidr)) if v]
    management = desc.network.segments.get(MANAGEMENT_SEGMENT)
    if management is not None:  # a block overlapping it is reported as cidr-overlap
        mgmt = ipaddress.ip_network(management.cidr)
        blocks = [(w, b) for w, b in blocks if b.version != mgmt.version or not b.overlaps(mgmt)]
    for i, cidr in enumerate(desc.network.admin_cidrs):
        admin = ipaddress.ip_network(cidr)
        if admin.prefixlen == 0 or not admin.is_private:
            continue  # admin-cidr-not-open, admin-cidr-private: it overlaps everything
        for where, block in blocks:
            if admin.version == block.version and admin.overlaps(block):
                yield Problem(f"network.admin_cidrs[{i}]", "admin-cidr-overlaps-segment",
                              f"overlaps {where} ({block}): its hosts would reach the "
                              "management plane as operators do", cidr)


@rule("task_classes")
def preemption(desc: Description) -> Iterator[Problem]:
    """What the schedulers cannot express is refused here, not when rendering: `validate`
    accepts a description only when Slurm and Kueue renderings will."""
    classes = desc.task_classes
    for name, c in classes.items():
        if c.priority > SLURM_MAX_PRIORITY_TIER:
            yield Problem(f"task_classes.{name}.priority", "priority-within-slurm",
                          f"above Slurm's highest PriorityTier {SLURM_MAX_PRIORITY_TIER}",
                          c.priority)
        if c.preemptible and not c.requeue:
            yield Problem(f"task_classes.{name}.requeue", "preemptible-needs-requeue",
                          "preempted jobs are requeued in this policy: a preemptible class "
                          "sets requeue: true", c.requeue)
    if any(v not in classes for c in classes.values() for v in c.preempts):
        return  # reported as class-exists
    wanted = preemption_wanted(desc)
    slurm = preemption_slurm_expressible(desc)
    if wanted - slurm:
        return  # a victim that is not preemptible or not lower: reported per class
    declared = [list(p) for p in sorted(wanted)]
    if missing := sorted(slurm - wanted):
        yield Problem("task_classes", "preemption-expressible",
                      "Slurm's partition priority preemption lets every class preempt every "
                      f"preemptible class of lower priority; also declare {missing}", declared)
    elif wanted and wanted != (kueue := preemption_kueue_expressible(desc)):
        yield Problem("task_classes", "preemption-kueue-expressible",
                      "Kueue lets every non-preemptible class preempt every preemptible "
                      f"one and nothing else; missing {sorted(kueue - wanted)}, not "
                      f"expressible {sorted(wanted - kueue)}", declared)


@rule("storage_tiers", "burst_groups", "pool")
def scratch_network(desc: Description) -> Iterator[Problem]:
    for name, tier in desc.storage_tiers.items():
        if (tier.purpose is Purpose.SCRATCH and tier.mount is not None
                and tier.mount.fstype.value == "lustre" and tier.located is Location.CLOUD
                and not any(g.region == desc.pool.cloud_region
                            for g in desc.burst_groups.values())):
            yield Problem(f"storage_tiers.{name}.mount.fstype", "scratch-needs-vpc",
                          "Lustre scratch (FSx) lives in the burst VPC of the pool's region "
                          f"{desc.pool.cloud_region}: no burst group declares one there",
                          "lustre")


@rule("kubernetes", "nodes")
def kubernetes(desc: Description) -> Iterator[Problem]:
    if desc.kubernetes is None:
        return
    seen: set[str] = set()
    for i, name in enumerate(desc.kubernetes.control_plane):
        path = f"kubernetes.control_plane.{i}"
        if name not in desc.nodes:
            yield Problem(path, "kubernetes-control-plane-known", "no such node", name)
        elif name in seen:
            yield Problem(path, "kubernetes-control-plane-unique", "a node is listed twice",
                          name)
        seen.add(name)


# The health loop's timer: often enough to catch a bad card between jobs, not so often
# that the quick tier (tens of seconds of a node's time) becomes a load of its own.
HEALTH_INTERVAL_S = (60, 86_400)


# Backups: often enough that a restore loses little, not so often that dumping the
# accounting database loads slurmdbd's MariaDB all day.
BACKUP_INTERVAL_S = (600, 7 * 86400)


@rule("backup", "storage_tiers")
def backup(desc: Description) -> Iterator[Problem]:
    b = desc.backup
    if b is None:
        return
    interval = duration_seconds(b.interval)
    if not BACKUP_INTERVAL_S[0] <= interval <= BACKUP_INTERVAL_S[1]:
        yield Problem("backup.interval", "backup-interval-range",
                      "backups are taken every 10 minutes to 7 days", b.interval)
    tier = desc.storage_tiers.get(b.tier)
    if tier is None or not is_bucket_tier(tier):
        yield Problem("backup.tier", "backup-tier-bucket",
                      "backups go to a declared bucket tier (purpose "
                      f"{', '.join(p.value for p in BUCKET_PURPOSES)}, location cloud or "
                      "both)", b.tier)
        return
    kept_days = -(-interval * b.keep // 86400)  # the oldest kept backup's age, rounded up
    cold = [0] if tier.temperature is Temperature.ARCHIVE else [
        t.after_days for t in tier.lifecycle if t.temperature is Temperature.ARCHIVE]
    if cold and cold[0] < kept_days:
        yield Problem("backup.tier", "backup-tier-instant",
                      f"tier {b.tier} moves objects to archive storage after {cold[0]} days, "
                      f"before the oldest of {b.keep} backups ({kept_days} days) is pruned: "
                      "a restore would wait hours for a retrieval; name a hot or warm tier",
                      b.tier)
    if tier.retention_days < kept_days:
        yield Problem("backup.keep", "backup-outlives-retention",
                      f"{b.keep} backups every {b.interval} reach back {kept_days} days, beyond "
                      f"tier {b.tier}'s retention of {tier.retention_days} days", b.keep)


# A takeover later than SlurmdTimeout's floor lets nodes go DOWN first; one sooner than a
# few seconds takes over from a primary that is only busy.
TAKEOVER_S = (10, 3600)


@rule("nodes", "failover")
def controller_count(desc: Description) -> Iterator[Problem]:
    found = controllers(desc)
    if len(found) != (2 if desc.failover else 1):
        yield Problem("nodes", "one-controller",
                      "exactly one node must have the controller role (two, primary first, "
                      "where failover is declared)", found)


@rule("failover", "storage_tiers", "nodes", "pool")
def failover(desc: Description) -> Iterator[Problem]:
    f = desc.failover
    if f is None:
        return
    if not TAKEOVER_S[0] <= duration_seconds(f.takeover_after) <= TAKEOVER_S[1]:
        yield Problem("failover.takeover_after", "failover-takeover-range",
                      "the backup takes over after 10 seconds to 1 hour", f.takeover_after)
    tier = desc.storage_tiers.get(f.state_tier)
    if tier is None or tier.mount is None or tier.mount.fstype not in SHARED_FSTYPES:
        yield Problem("failover.state_tier", "failover-state-shared",
                      "both controllers read Slurm's state from it: name a tier with an "
                      f"{' or '.join(t.value for t in SHARED_FSTYPES)} mount", f.state_tier)
    elif served := [n for n in (node_named(desc, s) for s in mount_servers(tier.mount.source))
                    if n is not None and NodeRole.CONTROLLER in desc.nodes[n].roles]:
        # By what the host is, not how the source spells it: name, FQDN or address.
        yield Problem("failover.state_tier", "failover-state-off-controllers",
                      f"tier {f.state_tier} is served by controller {served[0]}: losing that "
                      "host would take the state the backup needs with it", f.state_tier)


@rule("health")
def health(desc: Description) -> Iterator[Problem]:
    h = desc.health
    low, high = HEALTH_INTERVAL_S
    if not low <= duration_seconds(h.interval) <= high:
        yield Problem("health.interval", "health-interval-range",
                      f"must be between {low // 60}m and {high // 3600}h", h.interval)
    if duration_seconds(h.window) < duration_seconds(h.interval) * h.isolate_after:
        yield Problem("health.window", "health-window-holds-failures",
                      f"{h.isolate_after} failures {h.interval} apart cannot fall within it",
                      h.window)


@rule("pool", "teams")
def operators(desc: Description) -> Iterator[Problem]:
    """A pool operator is root on every host: only someone a team already names admin, so
    the power is visible in the teams and every operator has an account and an id."""
    admins = {u for t in desc.teams.values() for u in t.members.get(Role.ADMIN, [])}
    for i, user in enumerate(desc.pool.operators):
        if user not in admins:
            yield Problem(f"pool.operators[{i}]", "operator-is-admin",
                          "a pool operator must be a team's admin (teams.*.members.admin)",
                          user)
    if len(set(desc.pool.operators)) != len(desc.pool.operators):
        yield Problem("pool.operators", "operator-unique", "an operator is listed twice",
                      desc.pool.operators)


@rule("pool", "nodes")
def controller_login(desc: Description) -> Iterator[Problem]:
    """Researchers log in to login hosts; a controller holds the pool's secrets and its
    monitoring. A host that is both exists only where the pool says so."""
    if desc.pool.controller_login:
        return
    for name, node in desc.nodes.items():
        if {NodeRole.CONTROLLER, NodeRole.LOGIN} <= set(node.roles):
            yield Problem(f"nodes.{name}.roles", "controller-login-declared",
                          "a controller that is also a login host gives researchers a shell "
                          "beside the munge key and the monitoring; split the roles, or say "
                          "so with pool.controller_login: true", [r.value for r in node.roles])


def _onprem_servers(desc: Description, source: str) -> list[str]:
    """The servers a mount source names that are on-prem: a node of the description, or an
    address that lies in no segment's cloud block (an FSx file system's are in the storage
    segment's). A name that is neither (fsx, a DNS name) says nothing either way."""
    cloud_blocks = [ipaddress.ip_network(s.cloud_cidr) for s in desc.network.segments.values()
                    if s.cloud_cidr]
    found = []
    for host in mount_servers(source):
        if node_named(desc, host) is not None:
            found.append(host)
            continue
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            continue
        if not any(address.version == b.version and address in b for b in cloud_blocks):
            found.append(host)
    return found


@rule("replay_budgets", "task_classes")
def replay_budgets(desc: Description) -> Iterator[Problem]:
    """Each declared merge-gate budget reads FIGURE=LIMIT (gpupool/spec/budgets.py), for a
    figure a replay reports of this description's classes: a typo would otherwise show only
    as "no evidence" when the gate runs, and pass."""
    for figure, limit in desc.replay_budgets.items():
        field = f"replay_budgets.{figure}"
        try:
            budgets.parse_budget(figure, limit, set(desc.task_classes), field)
        except budgets.BudgetError as e:
            yield Problem(field, "replay-budget", str(e).removeprefix(f"{field}: "), limit)


def _tier_sync(name: str, tier: StorageTier) -> Iterator[Problem]:
    """A sync copies between the two sides of a `both` tier, into a side it can write."""
    path = f"storage_tiers.{name}.sync"
    if tier.located is not Location.BOTH:
        yield Problem(path, "tier-sync-needs-both",
                      "a sync copies between a tier's on-prem mount and its bucket: "
                      "location both", tier.located.value)
    elif (tier.sync is not None and tier.sync.direction is SyncDirection.FROM_CLOUD
          and tier.mount is not None and "ro" in tier.mount.options):
        yield Problem(f"{path}.direction", "tier-sync-read-only",
                      "the tier is mounted ro, so nothing can be copied into it: to_cloud, "
                      "or mount it rw", tier.sync.direction.value)


@rule("storage_tiers", "network", "nodes", "pool")
def storage_locations(desc: Description) -> Iterator[Problem]:
    """Where each tier lives, and what that declares in the cloud (model.Location): a
    cloud tier is a bucket, or FSx for Lustre for scratch; nothing is declared for an
    on-prem tier; `both` is an on-prem mount beside a bucket. A tier whose mount names an
    on-prem server is never declared again in the cloud."""
    for name, tier in desc.storage_tiers.items():
        path = f"storage_tiers.{name}.location"
        where, mount = tier.located, tier.mount
        fstype = mount.fstype if mount is not None else None
        if fstype is FsType.LOCAL and where is not Location.ONPREM:
            yield Problem(path, "tier-location-local",
                          "a local mount is each node's own disks: the tier is onprem",
                          where.value)
            continue
        if tier.purpose is Purpose.HOME:
            if fstype not in SHARED_FSTYPES:
                yield Problem(f"storage_tiers.{name}.mount", "home-shared-mount",
                              "home directories are one tree every host mounts: give the "
                              f"tier an {' or '.join(t.value for t in SHARED_FSTYPES)} mount",
                              fstype.value if fstype else None)
            if where is not Location.ONPREM:
                yield Problem(path, "home-onprem",
                              "gpupool declares no cloud file system for home directories "
                              "(burst nodes mount the on-prem one over the hybrid link): "
                              "location onprem", where.value)
            continue
        if where is Location.BOTH and mount is None:
            yield Problem(path, "tier-both-needs-mount",
                          "both is an on-prem mount beside a bucket; this tier has no mount: "
                          "location cloud", where.value)
        if tier.sync is not None:
            yield from _tier_sync(name, tier)
        if tier.purpose is Purpose.SCRATCH:
            if where is Location.BOTH:
                yield Problem(path, "scratch-location",
                              "scratch is not kept in two places: onprem (the nodes' disks "
                              "or an on-prem file system) or cloud (FSx for Lustre)",
                              where.value)
            elif where is Location.CLOUD and fstype is not FsType.LUSTRE:
                yield Problem(path, "scratch-location",
                              "cloud scratch is an FSx for Lustre file system: give it a "
                              "lustre mount, or location onprem", where.value)
        elif where is Location.CLOUD and fstype is FsType.NFS:
            yield Problem(path, "cloud-tier-no-file-system",
                          "gpupool declares no cloud NFS server: a tier mounted over NFS "
                          "is onprem, or both (its on-prem mount and a bucket)", where.value)
        if where is not Location.ONPREM and mount is not None and fstype is FsType.LUSTRE \
                and (servers := _onprem_servers(desc, mount.source)):
            yield Problem(path, "cloud-tier-onprem-source",
                          f"its mount names on-prem server {servers[0]}: a cloud tier would "
                          "declare a new FSx file system beside it; a tier served on-prem "
                          "is location onprem", where.value)


@rule("software", "node_classes", "nodes")
def release_slurm_suite(desc: Description) -> Iterator[Problem]:
    """A release's Slurm lock is one its archive carries: Slurm 24.11.5 is Debian 13's, and
    apt on a Debian 12 node finds no such version (the slurm role's pin would match
    nothing). A Slurm no known suite carries (a site's own repository) is not judged."""
    carried = {s.debian: s for s in gpu_detection.suites()}
    for release in os_release.releases_in_use(desc):
        slurm = os_release.lock(desc, release)["slurm"]
        own = carried.get(release.number)
        try:
            upstream = floors.parse(slurm).upstream
        except floors.VersionError:
            continue  # version-comparable says so
        other = next((s for s in carried.values()
                      if floors.parse(s.slurm).upstream == upstream), None)
        if own is None or other is None or other is own:
            continue
        yield Problem(os_release.lock_path(desc, release, "slurm"), "release-slurm-suite",
                      f"Slurm {upstream} is Debian {other.debian}'s ({other.codename} "
                      f"carries {other.slurm}); nodes on {release.value} install from "
                      f"{own.codename}, which carries {own.slurm}: lock that release's "
                      f"Slurm under software.per_release.{release.value}.slurm", slurm)


@rule("software", "node_classes", "nodes")
def slurm_release_window(desc: Description) -> Iterator[Problem]:
    """Every Slurm daemon answers to the controllers' release: the controllers run one
    Slurm, and every other node's slurmd is of that major or one the controllers' major
    still accepts (gpupool/data/slurm-releases). A pool of Debian 12 and 13 nodes is four
    majors apart (22.05 and 24.11) and is refused here rather than at registration."""
    releases = os_release.controller_releases(desc)
    try:
        majors = {r: os_release.major(os_release.lock(desc, r)["slurm"])
                  for r in os_release.releases_in_use(desc)}
    except floors.VersionError:
        return  # version-comparable says so
    ctl = {majors[r] for r in releases}
    if len(ctl) > 1:
        yield Problem("nodes", "slurm-controllers-agree",
                      "the controllers run different Slurm releases ("
                      + ", ".join(f"{r.value}: {majors[r]}" for r in releases)
                      + "); slurmctld and its backup share one state directory and one "
                      "release", None)
        return
    if not ctl:
        return  # no controller: rule controllers says so
    (controller,) = ctl
    for release, major in majors.items():
        verdict = os_release.window(controller, major)
        if verdict is None or verdict.ok:
            continue
        classes = sorted({n.class_ for n in desc.nodes.values()
                          if n.class_ in desc.node_classes
                          and desc.node_classes[n.class_].os is release})
        yield Problem(f"node_classes.{classes[0]}.os", "slurm-release-window",
                      f"nodes on {release.value} (classes {', '.join(classes)}) run Slurm "
                      f"{major}: {verdict.reason}", release.value)
