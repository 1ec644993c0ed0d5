"""HybridLink and PrivateEgress: a burst VPC's path to on-prem and to the AWS APIs.

Both are declared by NetworkSegments (their parent), which routes its private subnets
through them: the on-prem segments to the link, everything else (where asked) to the NAT
gateway.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from gpupool.render.cloud import network
from gpupool.render.cloud.network import EgressPlan, LinkPlan
from infra.components import Component


@dataclass(frozen=True)
class HybridLinkArgs:
    plan: LinkPlan
    vpc_id: pulumi.Input[str]
    # Subnets a Transit Gateway attachment places its interfaces in: one per zone.
    attach_subnet_ids: list[pulumi.Input[str]]


class HybridLink(Component):
    """The declared link of one burst region: a site-to-site VPN (virtual private gateway,
    customer gateway, BGP), a Transit Gateway attachment, or a Direct Connect gateway
    association through a virtual private gateway."""

    kind: str
    # Route fields (engine names) that send a destination to the link.
    route_target: dict[str, pulumi.Input[str]]
    # What a route through the link must wait for (the attachment).
    ready: list[pulumi.Resource]
    # What the on-prem side needs to route the burst VPC to this link.
    onprem_side: dict[str, Any]

    def __init__(self, name: str, args: HybridLinkArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("HybridLink", name, opts)
        plan, link = args.plan, args.plan.link
        self.kind = plan.kind
        tags = {**plan.tags, "Name": name, "link": self.kind}
        side: dict[str, Any] = {"link": self.kind, "region": plan.region,
                                "routes": plan.vpc_cidrs}
        if link.transit_gateway is not None:
            attachment = aws.ec2transitgateway.VpcAttachment(
                name, transit_gateway_id=link.transit_gateway, vpc_id=args.vpc_id,
                subnet_ids=args.attach_subnet_ids, dns_support="enable", tags=tags,
                opts=self.child())
            self.route_target = {"transitGatewayId": link.transit_gateway}
            self.ready = [attachment]
            side |= {"transit_gateway": link.transit_gateway, "attachment": attachment.id}
        else:
            vgw = aws.ec2.VpnGateway(name, vpc_id=args.vpc_id, tags=tags, opts=self.child())
            self.route_target = {"gatewayId": vgw.id}
            self.ready = [vgw]
            if link.vpn is not None:
                cgw = aws.ec2.CustomerGateway(
                    name, bgp_asn=str(link.vpn.bgp_asn), ip_address=link.vpn.customer_gateway,
                    type="ipsec.1", tags=tags, opts=self.child())
                vpn = aws.ec2.VpnConnection(
                    name, customer_gateway_id=cgw.id, vpn_gateway_id=vgw.id, type="ipsec.1",
                    static_routes_only=False, tags=tags, opts=self.child())
                self.ready.append(vpn)
                # The pre-shared keys stay in the state (the CLI's secrets), not outputs.
                side |= {"customer_gateway": link.vpn.customer_gateway,
                         "bgp_asn": link.vpn.bgp_asn,
                         "tunnels": [vpn.tunnel1_address, vpn.tunnel2_address]}
            elif link.direct_connect_gateway is not None:
                assoc = aws.directconnect.GatewayAssociation(
                    name, dx_gateway_id=link.direct_connect_gateway,
                    associated_gateway_id=vgw.id, allowed_prefixes=plan.vpc_cidrs,
                    opts=self.child())
                self.ready.append(assoc)
                side |= {"direct_connect_gateway": link.direct_connect_gateway}
            side["virtual_private_gateway"] = vgw.id
        self.onprem_side = side
        self.register_outputs({"kind": self.kind, "route_target": self.route_target,
                               "ready": self.ready, "onprem_side": self.onprem_side})


@dataclass(frozen=True)
class PrivateEgressArgs:
    plan: EgressPlan
    vpc_id: pulumi.Input[str]
    # The nodes' private subnets (one per zone) and their security group.
    subnet_ids: list[pulumi.Input[str]]
    node_group_id: pulumi.Input[str]


class PrivateEgress(Component):
    """How private subnets reach the AWS APIs: interface endpoints (EC2, SSM, Secrets
    Manager, STS, CloudWatch Logs) behind a group that admits HTTPS from the nodes only,
    or, where the description asks for one, a NAT gateway in a public subnet of its own.
    S3 is reached through NetworkSegments' gateway endpoint either way."""

    # Routes (engine names) the private route table adds: the NAT default route, or none.
    routes: list[dict[str, pulumi.Input[str]]]
    endpoint_ids: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: PrivateEgressArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("PrivateEgress", name, opts)
        tags = args.plan.tags
        self.routes, self.endpoint_ids = [], {}
        if args.plan.nat_subnet is not None:
            self._nat(name, args, args.plan.nat_subnet, tags)
        else:
            self._endpoints(name, args, tags)
        self.register_outputs({"routes": self.routes, "endpoint_ids": self.endpoint_ids})

    def _endpoints(self, name: str, args: PrivateEgressArgs, tags: dict[str, str]) -> None:
        seg, port = network.ENDPOINTS_SEGMENT, network.HTTPS_PORT
        group = aws.ec2.SecurityGroup(
            name, name=name, vpc_id=args.vpc_id, revoke_rules_on_delete=True,
            description="gpupool AWS API endpoints: HTTPS from the nodes only",
            tags={**tags, "Name": name, "segment": seg}, opts=self.child())
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-in-training", security_group_id=group.id, ip_protocol="tcp",
            from_port=port, to_port=port, referenced_security_group_id=args.node_group_id,
            description="AWS APIs from the nodes",
            tags={**tags, "segment": seg, "peer": "training"}, opts=self.child())
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-training-eg", security_group_id=args.node_group_id, ip_protocol="tcp",
            from_port=port, to_port=port, referenced_security_group_id=group.id,
            description="AWS APIs through the interface endpoints",
            tags={**tags, "segment": "training", "peer": seg}, opts=self.child())
        for service, policy in args.plan.endpoint_policies.items():
            ep = aws.ec2.VpcEndpoint(
                f"{name}-{service}", vpc_id=args.vpc_id,
                service_name=f"com.amazonaws.{args.plan.region}.{service}",
                vpc_endpoint_type="Interface", private_dns_enabled=True,
                subnet_ids=args.subnet_ids, security_group_ids=[group.id],
                policy=None if policy is None else json.dumps(policy),
                tags={**tags, "Name": f"{name}-{service}"}, opts=self.child())
            self.endpoint_ids[service] = ep.id

    def _nat(self, name: str, args: PrivateEgressArgs, block: tuple[str, str],
             tags: dict[str, str]) -> None:
        cidr, zone = block
        igw = aws.ec2.InternetGateway(name, vpc_id=args.vpc_id, tags={**tags, "Name": name},
                                      opts=self.child())
        public = aws.ec2.RouteTable(
            f"{name}-public", vpc_id=args.vpc_id,
            routes=[{"cidrBlock": network.ANYWHERE_V4, "gatewayId": igw.id}],
            tags={**tags, "Name": f"{name}-public"}, opts=self.child())
        # The NAT gateway's own address is an Elastic IP; nothing launched here gets one.
        subnet = aws.ec2.Subnet(
            f"{name}-public-{zone}", vpc_id=args.vpc_id, cidr_block=cidr,
            availability_zone=zone, map_public_ip_on_launch=False,
            tags={**tags, "Name": f"{name}-public-{zone}", "purpose": "nat"},
            opts=self.child())
        aws.ec2.RouteTableAssociation(f"{name}-public-{zone}", subnet_id=subnet.id,
                                      route_table_id=public.id, opts=self.child())
        eip = aws.ec2.Eip(name, domain="vpc", tags={**tags, "Name": name},
                          opts=self.child(depends_on=[igw]))
        nat = aws.ec2.NatGateway(name, allocation_id=eip.id, subnet_id=subnet.id,
                                 connectivity_type="public", tags={**tags, "Name": name},
                                 opts=self.child(depends_on=[igw]))
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-training-eg", security_group_id=args.node_group_id, ip_protocol="tcp",
            from_port=network.HTTPS_PORT, to_port=network.HTTPS_PORT, cidr_ipv4=network.ANYWHERE_V4,
            description="AWS APIs through the NAT gateway",
            tags={**tags, "segment": "training", "peer": network.NAT_PEER}, opts=self.child())
        self.routes = [{"cidrBlock": network.ANYWHERE_V4, "natGatewayId": nat.id}]
