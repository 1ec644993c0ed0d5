"""The Pulumi program's inputs, checked against the description (mocks fixture: the
Pulumi engine and cloud APIs are replaced by gpupool.preview.pulumi_mock, which echoes inputs)."""

from __future__ import annotations

import base64
import ipaddress
import json
import runpy
from collections import defaultdict
from typing import Any

import pytest
import yaml

from gpupool.preview import pulumi_mock
from gpupool.preview.aws_types import aws_taggable
from gpupool.render import node_labels
from gpupool.render.cloud import iam, names, network, storage
from gpupool.render.k8s_objects import GPU_RESOURCE, kueue_preemption_pairs, manifests, object_key
from gpupool.render.scheduling import class_policies, preemption_pairs, team_quotas
from gpupool.spec import loader
from gpupool.spec.catalog import BURST_SEGMENT, INSTANCE_TYPES, MANAGEMENT_SEGMENT, SRUN_PORTS
from gpupool.spec.facts import gpu_capacity
from gpupool.spec.model import Capacity, Description
from policies import offline
from tests._policy import unlisted
from tests._pulumi import declared, declared_mutated, of_type, one
from tests.conftest import ROOT, mutate, raw_stack

STACKS = ["lab", "example"]
COMPONENTS = {"NetworkSegments", "HybridLink", "PrivateEgress", "BurstPool", "StorageTiers",
              "MungeKey", "ClusterServices", "BurstImage"}


@pytest.fixture(scope="module", params=STACKS)
def stack(request: pytest.FixtureRequest) -> str:
    return request.param


def test_one_component_per_capability_and_everything_inside_one(stack: str) -> None:
    run = declared(stack)
    kinds = {r.type.rsplit(":", 1)[1] for r in run.resources if not r.custom}
    assert kinds == COMPONENTS
    orphans = [r.name for r in run.resources if r.custom and r.parent is None
               and not r.type.startswith("pulumi:providers:")]
    assert orphans == []


def test_taggable_resources_carry_pool_team_and_cost_centre(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    cost_centres = {desc.pool.cost_centre, *(t.cost_centre for t in desc.teams.values())}
    checked = 0
    for r in (r for r in declared(stack).resources if r.custom):
        if r.type.startswith("kubernetes:"):
            tags = {k.removeprefix(node_labels.LABEL_PREFIX): v
                    for k, v in r.inputs["metadata"]["labels"].items()}
        elif aws_taggable(r.type):
            tags = r.inputs.get("tags")
            if isinstance(tags, list):  # autoscaling groups list their tags
                tags = {t["key"]: t["value"] for t in tags}
        else:
            continue
        checked += 1
        assert tags[names.TAG_POOL] == desc.pool.name, r.name
        assert tags[names.TAG_TEAM] in {*desc.teams, names.SHARED}, r.name
        assert tags[names.TAG_COST_CENTRE] in cost_centres, r.name
    assert checked > 50


def test_main_reads_the_stack_config() -> None:
    """What the Pulumi CLI runs: infra/__main__.py with gpupool:description set."""
    cfg = yaml.safe_load(loader.stack_config_path("lab", ROOT).read_text())
    path = cfg["config"][loader.CONFIG_KEY]
    run = pulumi_mock.run(lambda: runpy.run_path(str(ROOT / "infra" / "__main__.py")), "lab",
                          {loader.CONFIG_KEY: path})
    assert [(r.type, r.name) for r in run.resources] == [
        (r.type, r.name) for r in declared("lab").resources]


# --- network -------------------------------------------------------------------------

def test_subnets_per_segment_and_zone_inside_cloud_cidrs(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    subnets = of_type(declared(stack), ":Subnet")
    zones = {z for g in desc.burst_groups.values() for z in g.availability_zones}
    assert len(subnets) == len(desc.network.segments) * len(zones)
    nets = []
    for s in subnets:
        segment = s.inputs["tags"]["segment"]
        net = ipaddress.ip_network(s.inputs["cidrBlock"])
        assert net.subnet_of(ipaddress.ip_network(desc.network.segments[segment].cloud_cidr))
        assert s.inputs["availabilityZone"] in zones
        assert s.inputs["mapPublicIpOnLaunch"] is False
        nets.append(net)
    assert all(not a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])


def test_no_ingress_from_anywhere_and_management_only_from_admin_cidrs(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    run = declared(stack)
    groups = {r.inputs["name"].rsplit("-", 1)[1]: r for r in of_type(run, ":SecurityGroup")}
    ids = {f"{r.name}-id": seg for seg, r in groups.items()}
    allowed = {(f.from_, f.to, p) for f in desc.network.flows for p in (f.ports or [None])}
    # The interface endpoints' group admits HTTPS from the nodes (test_private_egress_...),
    # the burst nodes' group Kubernetes' ports from the cluster's prefix lists
    # (test_kubernetes_rules_refer_to_the_clusters_prefix_lists), and srun's range from
    # the Slurm hosts (test_burst_groups_admit_sruns_ports_from_the_slurm_hosts).
    ingress = [r for r in of_type(run, ":SecurityGroupIngressRule")
               if r.inputs["tags"]["segment"] != network.ENDPOINTS_SEGMENT
               and r.inputs["tags"].get("flow") not in (network.KUBERNETES, network.SLURM)]
    assert ingress
    for rule in ingress:
        cidr = rule.inputs.get("cidrIpv4")
        assert cidr not in ("0.0.0.0/0", "::/0"), rule.name
        target = ids[rule.inputs["securityGroupId"]]
        if cidr is None:
            source = ids[rule.inputs["referencedSecurityGroupId"]]
        else:
            source = next(s for s, seg in desc.network.segments.items()
                          if cidr in (seg.cidr, seg.cloud_cidr)
                          or (s == "management" and cidr in desc.network.admin_cidrs))
        if source == "management" and cidr is not None:
            assert cidr in desc.network.admin_cidrs, rule.name
        assert (source, target, rule.inputs.get("fromPort")) in allowed, rule.name
    # Every declared flow is open, from the source group and from on-prem.
    for f in desc.network.flows:
        for port in f.ports or [None]:
            found = {("sg" if "referencedSecurityGroupId" in r.inputs else "cidr")
                     for r in ingress if ids[r.inputs["securityGroupId"]] == f.to
                     and r.inputs.get("fromPort") == port}
            assert found == {"sg", "cidr"}, (f, port)


def test_kubernetes_rules_refer_to_the_clusters_prefix_lists() -> None:
    """The example declares a cluster: its burst nodes' group admits and reaches exactly
    network.kubernetes_rules(), on-prem peers through prefix lists of the cluster's nodes."""
    desc = loader.load_stack("example", ROOT)
    run = declared("example")
    lists = {f"{r.name}-id": r.inputs for r in of_type(run, ":ManagedPrefixList")}
    for name, entries in network.prefix_lists(desc).items():
        (held,) = [p for p in lists.values() if p["name"].endswith(f"-{name}")]
        assert {e["cidr"]: e["description"] for e in held["entries"]} == entries
        assert held["maxEntries"] == len(entries)
    rules = [r for r in [*of_type(run, ":SecurityGroupIngressRule"),
                         *of_type(run, ":SecurityGroupEgressRule")]
             if r.inputs["tags"].get("flow") == network.KUBERNETES]
    seen = set()
    for r in rules:
        assert "cidrIpv4" not in r.inputs, r.name
        if "prefixListId" in r.inputs:
            assert lists[r.inputs["prefixListId"]]["name"].endswith(r.inputs["tags"]["peer"])
        seen.add((r.inputs["tags"]["segment"], r.inputs["tags"]["peer"],
                  r.inputs["ipProtocol"], r.inputs["fromPort"]))
    want = {(k.segment, k.peer, k.protocol, k.port) for k in network.firewall_rules(desc)
            if k.service == network.KUBERNETES}
    assert want and seen == want


def test_burst_groups_admit_sruns_ports_from_the_slurm_hosts(stack: str) -> None:
    """A burst node's security group is its only firewall: srun's ports (SrunPortRange)
    in from and out to the group itself and the on-prem management block, one range rule
    each, or a multi-node step across burst nodes, or between them and the controller or a
    login node, hangs (the on-prem side: flows.slurm_inbound)."""
    desc = loader.load_stack(stack, ROOT)
    run = declared(stack)
    groups = {f"{r.name}-id": r.inputs["name"] for r in of_type(run, ":SecurityGroup")}
    lo, hi = SRUN_PORTS
    seen = set()
    for r in [*of_type(run, ":SecurityGroupIngressRule"),
              *of_type(run, ":SecurityGroupEgressRule")]:
        p = r.inputs
        if p.get("toPort", p.get("fromPort")) != p.get("fromPort"):
            assert p["tags"]["flow"] == network.SLURM, r.name
        if p["tags"].get("flow") != network.SLURM:
            continue
        assert (p["ipProtocol"], p["fromPort"], p["toPort"]) == ("tcp", lo, hi), r.name
        assert groups[p["securityGroupId"]].endswith(f"-{BURST_SEGMENT}"), r.name
        assert p["description"].startswith("Slurm: "), r.name
        peer = p.get("cidrIpv4") or groups[p["referencedSecurityGroupId"]]
        seen.add((r.type.rsplit(":", 1)[1], peer))
    block = desc.network.segments[MANAGEMENT_SEGMENT].cidr
    regions = names.regions(desc)
    assert seen == {(kind, peer) for kind in ("SecurityGroupIngressRule",
                                             "SecurityGroupEgressRule")
                    for region in regions
                    for peer in (block, f"{desc.pool.name}-{region}-{BURST_SEGMENT}")}


def test_s3_endpoint_and_flow_logs_per_vpc(stack: str) -> None:
    run = declared(stack)
    vpcs = of_type(run, ":Vpc")
    gateways = [e for e in of_type(run, ":VpcEndpoint")
                if e.inputs["vpcEndpointType"] == "Gateway"]
    assert len(gateways) == len(vpcs) == len(of_type(run, ":FlowLog"))
    for ep in gateways:
        assert ep.inputs["serviceName"].endswith(".s3")


# --- hybrid link and private egress ------------------------------------------------------

DX_GATEWAY = "5f294f92-bafb-4011-916d-9b0bff7ee1e7"
LAB_DX = [{"delete": "network.hybrid_links.eu-west-1.vpn"},
          {"set": "network.hybrid_links.eu-west-1.direct_connect_gateway", "value": DX_GATEWAY}]
LAB_NAT = [{"set": "network.hybrid_links.eu-west-1.egress", "value": "nat"}]


def _link_target(desc: Description, region: str) -> dict[str, str]:
    """The route fields the program must use for a region's declared link (mock ids)."""
    link = desc.network.hybrid_links[region]
    if link.transit_gateway is not None:
        return {"transitGatewayId": link.transit_gateway}
    return {"gatewayId": f"{desc.pool.name}-{region}-link-id"}


def _check_routes(desc: Description, run: pulumi_mock.Run) -> None:
    for region in names.regions(desc):
        private = f"{desc.pool.name}-{region}-private"
        table = one(run, ":RouteTable", private).inputs
        onprem = [r for r in table["routes"] if r["cidrBlock"] != "0.0.0.0/0"]
        assert onprem == [{"cidrBlock": c, **_link_target(desc, region)}
                          for c in network.onprem_cidrs(desc)]
        # The controller's segment and every admin CIDR are among them.
        nets = [ipaddress.ip_network(r["cidrBlock"]) for r in onprem]
        for cidr in [desc.network.segments["management"].cidr, *desc.network.admin_cidrs]:
            assert any(ipaddress.ip_network(cidr).subnet_of(n) for n in nets), cidr
        burst = [s for s in of_type(run, ":Subnet") if "segment" in s.inputs["tags"]]
        assert burst
        for subnet in burst:
            assert subnet.inputs["tags"]["route-table"] == private
            assoc = one(run, ":RouteTableAssociation", subnet.name).inputs
            assert assoc == {"subnetId": f"{subnet.name}-id", "routeTableId": f"{private}-id"}


def test_on_prem_segments_route_over_the_declared_link(stack: str) -> None:
    _check_routes(loader.load_stack(stack, ROOT), declared(stack))


def test_vpn_link_to_the_customer_gateway_over_bgp() -> None:
    desc = loader.load_stack("lab", ROOT)
    vpn = desc.network.hybrid_links["eu-west-1"].vpn
    assert vpn is not None
    run = declared("lab")
    name = "lab-eu-west-1-link"
    assert one(run, ":VpnGateway", name).inputs["vpcId"] == "lab-eu-west-1-id"
    cgw = one(run, ":CustomerGateway", name).inputs
    assert (cgw["bgpAsn"], cgw["ipAddress"], cgw["type"]) == (
        str(vpn.bgp_asn), vpn.customer_gateway, "ipsec.1")
    conn = one(run, ":VpnConnection", name).inputs
    assert conn["customerGatewayId"] == f"{name}-id"
    assert conn["vpnGatewayId"] == f"{name}-id"
    assert conn["staticRoutesOnly"] is False
    assert of_type(run, ":VpcAttachment") == of_type(run, ":GatewayAssociation") == []


def test_transit_gateway_attachment_in_every_zone() -> None:
    desc = loader.load_stack("example", ROOT)
    run = declared("example")
    (att,) = of_type(run, ":VpcAttachment")
    region = names.regions(desc)[0]
    assert att.inputs["transitGatewayId"] == desc.network.hybrid_links[region].transit_gateway
    assert att.inputs["subnetIds"] == [f"prod-{region}-management-{z}-id"
                                       for z in names.region_zones(desc, region)]
    assert of_type(run, ":VpnGateway") == of_type(run, ":CustomerGateway") == []


def test_direct_connect_gateway_through_a_virtual_private_gateway() -> None:
    run = declared_mutated("lab", LAB_DX)
    desc = loader.parse(mutate(raw_stack("lab"), LAB_DX))
    (assoc,) = of_type(run, ":GatewayAssociation")
    assert assoc.inputs == {"dxGatewayId": DX_GATEWAY,
                            "associatedGatewayId": "lab-eu-west-1-link-id",
                            "allowedPrefixes": network.vpc_cidrs(desc)}
    assert of_type(run, ":CustomerGateway") == of_type(run, ":VpnConnection") == []
    _check_routes(desc, run)
    assert unlisted(offline.check(run, desc)) == []
    assert run.outputs["onprem_routes"]["eu-west-1"]["direct_connect_gateway"] == DX_GATEWAY


def test_private_subnets_reach_aws_apis_through_interface_endpoints(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    run = declared(stack)
    for region in names.regions(desc):
        name = f"{desc.pool.name}-{region}-egress"
        zones = names.region_zones(desc, region)
        for service in network.INTERFACE_ENDPOINT_SERVICES:
            ep = one(run, ":VpcEndpoint", f"{name}-{service}").inputs
            assert ep["serviceName"] == f"com.amazonaws.{region}.{service}"
            assert ep["vpcEndpointType"] == "Interface"
            assert ep["privateDnsEnabled"] is True
            assert ep["subnetIds"] == [f"{desc.pool.name}-{region}-training-{z}-id"
                                       for z in zones]
            assert ep["securityGroupIds"] == [f"{name}-id"]
        # The endpoints' group admits HTTPS from the nodes' group and nothing else.
        ingress = [r.inputs for r in of_type(run, ":SecurityGroupIngressRule")
                   if r.inputs["securityGroupId"] == f"{name}-id"]
        assert [(r["referencedSecurityGroupId"], r["ipProtocol"], r["fromPort"], r["toPort"])
                for r in ingress] == [
            (f"{desc.pool.name}-{region}-training-id", "tcp", 443, 443)]
    for kind in (":NatGateway", ":InternetGateway", ":Eip"):
        assert of_type(run, kind) == [], kind
    assert all("0.0.0.0/0" not in [r["cidrBlock"] for r in t.inputs["routes"]]
               for t in of_type(run, ":RouteTable"))


def test_nat_gateway_where_the_description_asks_for_one() -> None:
    run = declared_mutated("lab", LAB_NAT)
    desc = loader.parse(mutate(raw_stack("lab"), LAB_NAT))
    name = "lab-eu-west-1-egress"
    assert [e for e in of_type(run, ":VpcEndpoint")
            if e.inputs["vpcEndpointType"] == "Interface"] == []
    nat = one(run, ":NatGateway", name).inputs
    assert nat["allocationId"] == f"{name}-id" and nat["connectivityType"] == "public"
    subnet = one(run, ":Subnet", nat["subnetId"].removesuffix("-id")).inputs
    assert subnet["mapPublicIpOnLaunch"] is False
    assert subnet["tags"]["purpose"] == "nat"
    # Its block is the management segment's spare one: inside the VPC, overlapping nothing.
    net = ipaddress.ip_network(subnet["cidrBlock"])
    others = [ipaddress.ip_network(s.inputs["cidrBlock"]) for s in of_type(run, ":Subnet")
              if s.inputs is not subnet]
    assert net.subnet_of(ipaddress.ip_network(desc.network.segments["management"].cloud_cidr))
    assert not any(net.overlaps(o) for o in others)
    public = one(run, ":RouteTable", f"{name}-public").inputs
    assert public["routes"] == [{"cidrBlock": "0.0.0.0/0", "gatewayId": f"{name}-id"}]
    private = one(run, ":RouteTable", "lab-eu-west-1-private").inputs
    assert private["routes"][-1] == {"cidrBlock": "0.0.0.0/0", "natGatewayId": f"{name}-id"}
    _check_routes(desc, run)
    egress = one(run, ":SecurityGroupEgressRule", f"{name}-training-eg").inputs
    assert (egress["cidrIpv4"], egress["fromPort"], egress["toPort"]) == ("0.0.0.0/0", 443, 443)
    assert unlisted(offline.check(run, desc)) == []


def test_onprem_routes_output_for_the_network_team(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    out = declared(stack).outputs["onprem_routes"]
    assert set(out) == set(names.regions(desc))
    for region, side in out.items():
        assert side["routes"] == network.vpc_cidrs(desc)
        assert side["link"] == network.link_kind(desc, region)
        vpn = desc.network.hybrid_links[region].vpn
        if vpn is not None:
            assert side["customer_gateway"] == vpn.customer_gateway
            assert side["bgp_asn"] == vpn.bgp_asn
            assert len(side["tunnels"]) == 2
        else:
            assert "tunnels" not in side


# --- burst pools -----------------------------------------------------------------------

def test_launch_templates_require_imdsv2_and_encrypt_root(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    for name, group in desc.burst_groups.items():
        lt = one(declared(stack), ":LaunchTemplate", f"{desc.pool.name}-{name}")
        assert lt.inputs["metadataOptions"]["httpTokens"] == "required"
        assert [b["ebs"]["encrypted"] for b in lt.inputs["blockDeviceMappings"]] == ["true"]
        efa = [n for n in lt.inputs["networkInterfaces"] if "interfaceType" in n]
        expected = min(INSTANCE_TYPES[t].efa_interfaces for t in group.instance_types)
        assert len(efa) == (expected if group.efa else 0)
        # The user-data reads the instance's Slurm node name from its tags.
        assert lt.inputs["metadataOptions"]["instanceMetadataTags"] == "enabled"


def test_efa_groups_sit_in_one_cluster_placement_group() -> None:
    desc = loader.load_stack("example", ROOT)
    run = declared("example")
    groups = {r.name: r for r in of_type(run, "autoscaling/group:Group")}
    placement = {r.name: r for r in of_type(run, ":PlacementGroup")}
    for name, group in desc.burst_groups.items():
        asg = groups[f"{desc.pool.name}-{name}"]
        if group.efa:
            assert placement[asg.name].inputs["strategy"] == "cluster"
            assert asg.inputs["placementGroup"] == f"{asg.name}-id"
            assert len(asg.inputs["vpcZoneIdentifiers"]) == 1
        else:
            assert "placementGroup" not in asg.inputs and asg.name not in placement


def test_autoscaling_groups_follow_the_burst_groups(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    for name, group in desc.burst_groups.items():
        asg = one(declared(stack), "autoscaling/group:Group", f"{desc.pool.name}-{name}")
        mip = asg.inputs["mixedInstancesPolicy"]
        dist = mip["instancesDistribution"]
        assert [o["instanceType"] for o in mip["launchTemplate"]["overrides"]] == \
            group.instance_types
        assert dist["spotAllocationStrategy"] == "capacity-optimized"
        assert dist["onDemandBaseCapacity"] == group.on_demand_base
        spot = Capacity.SPOT in group.capacity
        assert dist["onDemandPercentageAboveBaseCapacity"] == (0 if spot else 100)
        assert (asg.inputs["minSize"], asg.inputs["maxSize"]) == (group.min_nodes,
                                                                  group.max_nodes)


def _statements(run: pulumi_mock.Run, name: str) -> dict[str, dict]:
    doc = json.loads(one(run, "iam/policy:Policy", name).inputs["policy"])
    return {s["Sid"]: s for s in doc["Statement"]}


def test_instance_profile_least_privilege_shared_and_team_groups() -> None:
    desc = loader.load_stack("example", ROOT)
    shared = _statements(declared("example"), "prod-l40s-burst-node")
    ckpt = names.bucket_name(desc, "checkpoints")
    assert shared["ReadWriteCheckpoints"]["Resource"] == [
        f"arn:aws:s3:::{ckpt}/{t}/*" for t in desc.teams]
    assert shared["ReadDatasets"]["Action"] == ["s3:GetObject", "s3:ListBucket"]
    run = declared_mutated("example", [{"set": "burst_groups.l40s-burst.team",
                                        "value": "vision"}])
    own = _statements(run, "prod-l40s-burst-node")
    assert own["ReadWriteCheckpoints"]["Resource"] == [f"arn:aws:s3:::{ckpt}/vision/*"]
    assert own["ListCheckpoints"]["Condition"]["StringLike"]["s3:prefix"] == ["vision/*"]
    assert one(run, ":LaunchTemplate", "prod-l40s-burst").inputs["tags"]["team"] == "vision"
    actions = {a for s in own.values() for a in s["Action"]}
    assert not any(a.endswith("*") for a in actions)


def test_a_shared_group_reaches_only_the_checkpoints_of_teams_that_can_run_on_it() -> None:
    """A group naming no team serves the teams whose quota or borrowing limit covers its GPU
    model (Slurm keeps the others off it), so its nodes reach those teams' prefixes and no
    other team's; a group no team can use reaches no checkpoints at all."""
    raw = raw_stack("example")
    group = "l40s-burst"
    ckpt = "arn:aws:s3:::ckpt"

    def prefixes(ops: list[dict]) -> list[str] | None:
        desc = loader.parse(mutate(raw, ops))
        doc = iam.node_policy(desc, desc.burst_groups[group], "arn:aws:s3:::data", ckpt,
                                "arn:aws:kms:us-east-1:1:key/k")
        found = {s["Sid"]: s for s in doc["Statement"]}.get("ListCheckpoints")
        return None if found is None else found["Condition"]["StringLike"]["s3:prefix"]

    no_l40s = [{"set": "teams.speech.quota", "value": {"h100": 16}}]
    assert prefixes(no_l40s) == ["vision/*", "nlp/*", "platform/*"]
    nobody = [op for team in raw["teams"] for op in (
        {"set": f"teams.{team}.quota", "value": {"h100": 8}},
        {"set": f"teams.{team}.borrowing_limit", "value": {}})]
    assert prefixes(nobody) is None


@pytest.mark.parametrize("stack", ["lab", "example"])
def test_the_vpc_reaches_only_the_pools_buckets_and_secret_and_its_default_group_is_empty(
        stack: str) -> None:
    """Endpoints carry their own policies: through the S3 gateway only the pool's buckets
    (not a bucket a job's owner brought), through Secrets Manager's interface endpoint only
    reads of the munge key; and each VPC's default security group is emptied of rules."""
    desc = loader.load_stack(stack, ROOT)
    run = declared(stack)
    buckets = {names.bucket_name(desc, t) for t in storage.bucket_tiers(desc)}
    gateways = [r for r in of_type(run, "ec2/vpcEndpoint:VpcEndpoint")
                if r.inputs.get("vpcEndpointType") == "Gateway"]
    assert gateways
    for ep in gateways:
        (statement,) = json.loads(ep.inputs["policy"])["Statement"]
        named = {arn.removeprefix("arn:aws:s3:::").removesuffix("/*")
                 for arn in statement["Resource"]}
        assert named == buckets and statement["Effect"] == "Allow"
    secrets = [r for r in of_type(run, "ec2/vpcEndpoint:VpcEndpoint")
               if r.inputs["serviceName"].endswith(".secretsmanager")]
    for ep in secrets:
        (statement,) = json.loads(ep.inputs["policy"])["Statement"]
        assert statement["Action"] == ["secretsmanager:GetSecretValue"]
        (arn,) = statement["Resource"]
        assert arn.endswith(f":secret:{names.munge_secret_name(desc)}-??????"), arn
    vpcs = of_type(run, "ec2/vpc:Vpc")
    defaults = of_type(run, "ec2/defaultSecurityGroup:DefaultSecurityGroup")
    assert len(defaults) == len(vpcs)
    for group in defaults:
        assert (group.inputs.get("ingresses", []), group.inputs.get("egress", [])) == ([], [])


def test_munge_key_secret_is_the_programs_encrypted_with_the_pool_key_and_holds_no_value(
        stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    run = declared(stack)
    pool = desc.pool.name
    secret = one(run, "secretsmanager/secret:Secret", f"{pool}-munge-key")
    assert secret.inputs["name"] == names.munge_secret_name(desc)
    key = one(run, "kms/key:Key", f"{pool}-key")
    assert secret.inputs["kmsKeyId"] == f"arn:mock:{key.type}:{key.name}"
    assert secret.inputs["replicas"] == []  # both stacks burst in their home region
    assert secret.parent is not None and secret.parent.endswith("MungeKey::" + f"{pool}-munge-key")
    # No value is declared, so none is in the state: the operator puts the controller's.
    assert not of_type(run, "secretsmanager/secretVersion:SecretVersion")
    assert run.outputs["munge_key_secret"] == f"arn:mock:{secret.type}:{secret.name}"


def test_munge_key_readable_only_by_the_burst_nodes_boot_roles(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    run = declared(stack)
    pool = desc.pool.name
    secret = one(run, "secretsmanager/secret:Secret", f"{pool}-munge-key")
    secret_arn = f"arn:mock:{secret.type}:{secret.name}"
    key_arn = f"arn:mock:aws:kms/key:Key:{pool}-key"
    roles = {g: f"arn:mock:aws:iam/role:Role:{names.burst_name(desc, g)}-boot"
             for g in desc.burst_groups}
    for g, group in desc.burst_groups.items():
        grant = one(run, "iam/rolePolicy:RolePolicy", f"{pool}-munge-key-{g}")
        assert grant.inputs["role"] == f"{names.burst_name(desc, g)}-boot"
        doc = {s["Sid"]: s for s in json.loads(grant.inputs["policy"])["Statement"]}
        assert doc["ReadMungeKey"]["Action"] == ["secretsmanager:GetSecretValue"]
        assert doc["ReadMungeKey"]["Resource"] == [secret_arn]
        assert doc["DecryptMungeKey"] == {
            "Sid": "DecryptMungeKey", "Effect": "Allow", "Action": ["kms:Decrypt"],
            "Resource": [key_arn], "Condition": {"StringEquals": {
                "kms:ViaService": f"secretsmanager.{group.region}.amazonaws.com",
                "kms:EncryptionContext:SecretARN": secret_arn}}}
    # The secret's own policy denies reading to every other principal.
    policy = one(run, "secretsmanager/secretPolicy:SecretPolicy", f"{pool}-munge-key")
    assert policy.inputs["secretArn"] == secret_arn
    assert policy.inputs["blockPublicPolicy"] is True
    [deny] = json.loads(policy.inputs["policy"])["Statement"]
    assert (deny["Effect"], deny["Action"]) == ("Deny", ["secretsmanager:GetSecretValue"])
    assert deny["Condition"] == {"ArnNotEquals": {"aws:PrincipalArn": sorted(roles.values())}}
    # Nothing else in the program grants any Secrets Manager action.
    others = [r.name for r in run.resources
              if r.type in ("aws:iam/policy:Policy", "aws:iam/rolePolicy:RolePolicy")
              and "secretsmanager" in r.inputs["policy"]
              and not r.name.startswith(f"{pool}-munge-key-")]
    assert others == []


def _role_grants(run: pulumi_mock.Run, role: str) -> list[dict[str, Any]]:
    """Every statement a role holds: its attached policies' and its inline ones'."""
    attached = [r.inputs["policyArn"].rsplit(":", 1)[1]
                for r in of_type(run, ":RolePolicyAttachment") if r.inputs["role"] == role]
    docs = [one(run, "iam/policy:Policy", p).inputs["policy"] for p in attached]
    docs += [r.inputs["policy"] for r in of_type(run, "iam/rolePolicy:RolePolicy")
             if r.inputs["role"] == role]
    return [st for d in docs for st in json.loads(d)["Statement"]]


def test_a_node_boots_with_the_boot_profile_and_swaps_to_the_run_profile(stack: str) -> None:
    """The launch template gives the boot profile; the boot role reads the munge key and
    swaps its own instance's profile for the run profile (only while the instance carries
    the boot profile, only on the pool's instances, passing only the run role) and holds
    nothing of S3 or the checkpoints; the run role holds the node's S3 and nothing of
    Secrets Manager; the user-data names the run profile, whose declared name it is."""
    desc = loader.load_stack(stack, ROOT)
    run = declared(stack)
    for g, group in desc.burst_groups.items():
        name = names.burst_name(desc, g)
        boot_profile = one(run, ":InstanceProfile", f"{name}-boot").inputs
        run_profile = one(run, ":InstanceProfile", f"{name}-node").inputs
        assert (boot_profile["name"], boot_profile["role"]) == (
            names.boot_profile_name(desc, g), f"{name}-boot")
        assert (run_profile["name"], run_profile["role"]) == (
            names.run_profile_name(desc, g), f"{name}-node")
        template = one(run, ":LaunchTemplate", name).inputs
        boot_arn = f"arn:mock:aws:iam/instanceProfile:InstanceProfile:{name}-boot"
        assert template["iamInstanceProfile"] == {"arn": boot_arn}
        user_data = base64.b64decode(template["userData"]).decode()
        assert f"--iam-instance-profile Name={names.run_profile_name(desc, g)} " in user_data

        boot = _role_grants(run, f"{name}-boot")
        actions = sorted(a for st in boot for a in st["Action"])
        assert actions == sorted(["secretsmanager:GetSecretValue", "kms:Decrypt",
                                  "ec2:DescribeIamInstanceProfileAssociations",
                                  "ec2:ReplaceIamInstanceProfileAssociation", "iam:PassRole"])
        assert not any(a.startswith("s3:") for a in actions)
        sids = {st["Sid"]: st for st in boot}
        assert sids["DecryptMungeKey"]["Condition"]["StringEquals"]["kms:ViaService"] == \
            f"secretsmanager.{group.region}.amazonaws.com"  # the secret's key only
        assert sids["SwapBootForRunProfile"]["Resource"] == [
            f"arn:aws:ec2:{group.region}:*:instance/*"]
        assert sids["SwapBootForRunProfile"]["Condition"] == {
            "ArnEquals": {"ec2:InstanceProfile": boot_arn},
            "StringEquals": {"ec2:ResourceTag/pool": desc.pool.name}}
        assert sids["PassRunRole"]["Resource"] == [f"arn:mock:aws:iam/role:Role:{name}-node"]
        assert sids["PassRunRole"]["Condition"] == {
            "StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}

        node = _role_grants(run, f"{name}-node")
        node_actions = {a for st in node for a in st["Action"]}
        assert not any(a.startswith(("secretsmanager:", "ec2:", "iam:")) for a in node_actions)
        assert {"s3:GetObject", "s3:PutObject"} <= node_actions
        assert json.dumps(node).count("secretsmanager") == 0
    # The launcher passes the launch templates' (boot) roles only.
    launcher = json.loads(one(run, "iam/policy:Policy", f"{desc.pool.name}-burst-launcher"
                              ).inputs["policy"])
    (passes,) = [st for st in launcher["Statement"] if st["Sid"] == "PassNodeRoles"]
    assert passes["Resource"] == sorted(
        f"arn:mock:aws:iam/role:Role:{names.burst_name(desc, g)}-boot"
        for g in desc.burst_groups)


def test_a_burst_group_elsewhere_reads_its_regions_replica_without_the_pool_key() -> None:
    desc = loader.load_stack("example", ROOT)
    group = next(iter(desc.burst_groups.values())).model_copy(update={"region": "eu-west-1"})
    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:gpupool/prod/munge-key-AbCdEf"
    doc = iam.munge_read_policy(desc, group, arn, "arn:aws:kms:us-east-1:1:key/k")
    assert doc["Statement"] == [{
        "Sid": "ReadMungeKey", "Effect": "Allow", "Action": ["secretsmanager:GetSecretValue"],
        "Resource": ["arn:aws:secretsmanager:eu-west-1:123456789012:secret:"
                     "gpupool/prod/munge-key-AbCdEf"]}]


# --- storage ---------------------------------------------------------------------------

def test_buckets_private_encrypted_and_versioned_as_declared(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    run = declared(stack)
    versioned = {r.inputs["bucket"] for r in of_type(run, ":BucketVersioning")}
    for tier, t in storage.bucket_tiers(desc).items():
        name = names.bucket_name(desc, tier)
        res = f"{desc.pool.name}-{tier}"
        assert one(run, ":Bucket", res).inputs["bucket"] == name
        pab = one(run, ":BucketPublicAccessBlock", res).inputs
        assert all(pab[k] is True for k in ("blockPublicAcls", "blockPublicPolicy",
                                            "ignorePublicAcls", "restrictPublicBuckets"))
        sse = one(run, ":BucketServerSideEncryptionConfiguration", res).inputs["rules"][0]
        assert sse["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "aws:kms"
        assert (name in versioned) == t.versioning


def test_lifecycle_follows_retention(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    allowed = {"hot": {None}, "warm": {"STANDARD_IA", "INTELLIGENT_TIERING"},
               "archive": {"GLACIER", "DEEP_ARCHIVE"}}
    for tier, t in storage.bucket_tiers(desc).items():
        rule, = one(declared(stack), ":BucketLifecycleConfiguration",
                    f"{desc.pool.name}-{tier}").inputs["rules"]
        assert rule["expiration"]["days"] == t.retention_days
        assert rule["abortIncompleteMultipartUpload"]["daysAfterInitiation"] > 0
        steps = {s["days"]: s["storageClass"] for s in rule.get("transitions", [])}
        for tr in t.lifecycle:
            assert steps[tr.after_days] in allowed[tr.temperature.value]
        assert all(d < t.retention_days for d in steps)
        if t.temperature.value != "hot":
            assert steps[0] in allowed[t.temperature.value]


def test_lifecycle_storage_class_rules() -> None:
    # S3 refuses STANDARD_IA before day 30; deep archive only pays off for 180+ days.
    from gpupool.spec.model import Temperature  # noqa: PLC0415

    assert storage.storage_class(Temperature.WARM, 14, 90) == "INTELLIGENT_TIERING"
    assert storage.storage_class(Temperature.WARM, 30, 90) == "STANDARD_IA"
    assert storage.storage_class(Temperature.ARCHIVE, 45, 90) == "GLACIER"
    assert storage.storage_class(Temperature.ARCHIVE, 180, 1095) == "DEEP_ARCHIVE"
    assert storage.storage_class(Temperature.HOT, 0, 10) is None


def test_lustre_scratch_sized_and_linked_to_datasets() -> None:
    desc = loader.load_stack("example", ROOT)
    fs = one(declared("example"), ":LustreFileSystem", "prod-scratch").inputs
    assert fs["storageCapacity"] >= desc.storage_tiers["scratch"].size_tib * 1024
    assert fs["storageCapacity"] % storage.FSX_STEP_GIB == 0
    assert fs["importPath"] == f"s3://{names.bucket_name(desc, 'datasets')}"
    assert of_type(declared("lab"), ":LustreFileSystem") == []  # lab scratch is local


# --- cluster ---------------------------------------------------------------------------

def test_cluster_services_declares_exactly_the_manifests(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    recorded = {r.name: r.inputs for r in declared(stack).resources
                if r.type.startswith("kubernetes:")}
    wanted = {object_key(m): m for m in manifests(desc)}
    assert recorded == wanted


def test_kueue_quotas_equal_the_scheduling_model(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    run = declared(stack)
    nominal: dict[tuple[str, str], int] = defaultdict(int)
    per_flavor: dict[str, int] = defaultdict(int)
    for cq in of_type(run, ":ClusterQueue"):
        name = cq.inputs["metadata"]["name"]
        team = name.removesuffix("-preemptible")
        for flavor in cq.inputs["spec"]["resourceGroups"][0]["flavors"]:
            res, = flavor["resources"]
            assert res["name"] == GPU_RESOURCE
            model = flavor["name"].split("-", 1)[0]
            nominal[(team, model)] += res["nominalQuota"]
            per_flavor[flavor["name"]] += res["nominalQuota"]
            capacity = gpu_capacity(desc)[model][flavor["name"].split("-", 1)[1]]
            assert res["nominalQuota"] + res["borrowingLimit"] <= capacity
            t = desc.teams[team]
            if name == team:  # guaranteed classes never borrow
                assert res["borrowingLimit"] == 0
            else:  # preemptible classes only borrow, up to quota plus borrowing limit
                assert res["nominalQuota"] == 0
                assert res["borrowingLimit"] <= t.quota[model] + t.borrowing_limit.get(model, 0)
    assert dict(nominal) == {(q.team, q.model): q.nominal for q in team_quotas(desc)}
    for flavor, total in per_flavor.items():
        model, kind = flavor.split("-", 1)
        assert total <= gpu_capacity(desc)[model][kind]
    flavors = {r.inputs["metadata"]["name"] for r in of_type(run, ":ResourceFlavor")}
    assert flavors == {f"{m}-{k}" for m, c in gpu_capacity(desc).items()
                       for k, n in c.items() if n}


def test_resource_quota_is_quota_plus_borrowing(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    for team, t in desc.teams.items():
        rq = one(declared(stack), "v1:ResourceQuota", f"resourcequota-{team}-gpu-quota")
        assert rq.inputs["spec"]["hard"][f"requests.{GPU_RESOURCE}"] == str(
            sum(t.quota.values()) + sum(t.borrowing_limit.values()))


def test_kueue_preemption_is_the_model(stack: str) -> None:
    """Guaranteed classes reclaim from preemptible ones and never preempt each other."""
    desc = loader.load_stack(stack, ROOT)
    assert kueue_preemption_pairs(desc) == preemption_pairs(desc)
    for cq in of_type(declared(stack), ":ClusterQueue"):
        spec = cq.inputs["spec"]["preemption"]
        guaranteed = not cq.inputs["metadata"]["name"].endswith("-preemptible")
        assert spec == {"withinClusterQueue": "Never",
                        "reclaimWithinCohort": "Any" if guaranteed else "Never",
                        "borrowWithinCohort": {"policy": "Never"}}


def test_kueue_refuses_a_relation_it_cannot_express(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    odd = desc.model_copy(update={"task_classes": {
        **desc.task_classes,
        "training": desc.task_classes["training"].model_copy(update={"preempts": []})}})
    with pytest.raises(ValueError, match="can only let every non-preemptible class"):
        kueue_preemption_pairs(odd)


def test_priorities_come_from_class_policies(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    run = declared(stack)
    for kind in (":PriorityClass", ":WorkloadPriorityClass"):
        got = {r.inputs["metadata"]["name"]: r.inputs["value"] for r in of_type(run, kind)}
        assert got == {c.name: c.priority for c in class_policies(desc)}


def test_namespace_guards_and_rbac_per_team(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    run = declared(stack)
    for team, t in desc.teams.items():
        deny = one(run, ":NetworkPolicy", f"networkpolicy-{team}-default-deny").inputs["spec"]
        assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
        one(run, ":LimitRange", f"limitrange-{team}-defaults")
        for role, users in t.members.items():
            rb = one(run, ":RoleBinding", f"rolebinding-{team}-{role.value}").inputs
            assert [s["name"] for s in rb["subjects"]] == users
        for role in ("researcher", "oncall", "contractor"):
            one(run, "v1:Role", f"role-{team}-{role}")
        for c, tc in desc.task_classes.items():
            lq = one(run, ":LocalQueue", f"localqueue-{team}-{c}").inputs
            assert lq["spec"]["clusterQueue"] == (
                f"{team}-preemptible" if tc.preemptible else team)


def test_stack_outputs_name_what_others_read(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    out = declared(stack).outputs
    assert out["buckets"] == {t: names.bucket_name(desc, t) for t in storage.bucket_tiers(desc)}
    assert set(out["queues"]) == set(desc.teams)
    assert set(out["launch_templates"]) == set(desc.burst_groups)
    assert set(out["onprem_segments"]["segments"]) == set(desc.network.segments)
    for region, segs in out["subnets"].items():
        assert set(segs) == set(desc.network.segments), region
