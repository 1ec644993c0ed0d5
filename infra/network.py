"""NetworkSegments: a burst region's VPC, shaped like the on-prem segments."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from gpupool.render.cloud import network
from gpupool.render.cloud.network import NetworkPlan
from infra.components import Component
from infra.hybrid import HybridLink, HybridLinkArgs, PrivateEgress, PrivateEgressArgs


class NetworkSegments(Component):
    """A VPC with one subnet per segment and zone, a security group per segment that
    admits exactly the declared flows, its hybrid link to on-prem and private egress to
    the AWS APIs (child components), a private route table sending the on-prem segments
    to the link, an S3 gateway endpoint and flow logs."""

    vpc_id: pulumi.Output[str]
    subnet_ids: dict[str, dict[str, pulumi.Output[str]]]
    security_group_ids: dict[str, pulumi.Output[str]]
    link: HybridLink
    egress: PrivateEgress

    def __init__(self, name: str, args: NetworkPlan,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("NetworkSegments", name, opts)
        tags, cidrs = args.tags, args.vpc_cidrs
        vpc = aws.ec2.Vpc(name, cidr_block=cidrs[0], enable_dns_support=True,
                          enable_dns_hostnames=True, tags={**tags, "Name": name},
                          opts=self.child())
        extra = [aws.ec2.VpcIpv4CidrBlockAssociation(
            f"{name}-cidr-{i}", vpc_id=vpc.id, cidr_block=c, opts=self.child())
            for i, c in enumerate(cidrs[1:], start=1)]
        # Every subnet names its route table: the policy pack checks the routes it gets.
        private = f"{name}-private"
        subnets: dict[tuple[str, str], aws.ec2.Subnet] = {}
        self.subnet_ids = {}
        for (segment, zone), cidr in args.subnets.items():
            sname = f"{name}-{segment}-{zone}"
            subnets[(segment, zone)] = aws.ec2.Subnet(
                sname, vpc_id=vpc.id, cidr_block=cidr, availability_zone=zone,
                map_public_ip_on_launch=False,
                tags={**tags, "Name": sname, "segment": segment, "route-table": private},
                opts=self.child(depends_on=extra))
            self.subnet_ids.setdefault(segment, {})[zone] = subnets[(segment, zone)].id
        groups = {seg: aws.ec2.SecurityGroup(
            f"{name}-{seg}", name=f"{name}-{seg}", vpc_id=vpc.id,
            description=f"gpupool {seg} segment: declared flows only",
            revoke_rules_on_delete=True, tags={**tags, "Name": f"{name}-{seg}",
                                               "segment": seg},
            opts=self.child()) for seg in args.segments}
        # The Kubernetes cluster's on-prem nodes, which a burst node's pod network peers with.
        lists = {n: aws.ec2.ManagedPrefixList(
            f"{name}-{n}", name=f"{name}-{n}", address_family="IPv4",
            max_entries=len(entries), entries=[
                {"cidr": c, "description": node} for c, node in sorted(entries.items())],
            tags={**tags, "Name": f"{name}-{n}"}, opts=self.child())
            for n, entries in args.prefix_lists.items()}
        for rule, description in args.rules:
            kind = (aws.vpc.SecurityGroupIngressRule if rule.direction == "ingress"
                    else aws.vpc.SecurityGroupEgressRule)
            peer: dict[str, pulumi.Input[str] | None]
            if rule.peer_segment:
                peer = {"referenced_security_group_id": groups[rule.peer_segment].id}
            elif rule.peer_list:
                peer = {"prefix_list_id": lists[rule.peer_list].id}
            else:
                peer = {"cidr_ipv4": rule.peer_cidr}
            ports = ({} if rule.port is None
                     else {"from_port": rule.port, "to_port": rule.last_port})
            kind(f"{name}-{rule.key}", security_group_id=groups[rule.segment].id,
                 ip_protocol=rule.protocol, description=description,
                 tags={**tags, "flow": rule.service if rule.flow is None else str(rule.flow),
                       "segment": rule.segment, "peer": rule.peer},
                 **peer, **ports,
                 opts=self.child())
        self.link = HybridLink(f"{name}-link", HybridLinkArgs(
            args.link, vpc.id, [self.subnet_ids["management"][z] for z in args.zones]),
            self.child())
        self.egress = PrivateEgress(f"{name}-egress", PrivateEgressArgs(
            args.egress, vpc.id, [self.subnet_ids["training"][z] for z in args.zones],
            groups["training"].id), self.child())
        # On-prem segments through the link; the rest (where asked) through the NAT gateway.
        # Inline routes are the whole table, but the provider leaves the S3 endpoint's
        # prefix-list route (vpce-) alone.
        routes = aws.ec2.RouteTable(
            private, vpc_id=vpc.id,
            routes=[*({"cidrBlock": c, **self.link.route_target}
                      for c in args.onprem_cidrs), *self.egress.routes],
            tags={**tags, "Name": private}, opts=self.child(depends_on=self.link.ready))
        for (segment, zone), subnet in subnets.items():
            aws.ec2.RouteTableAssociation(f"{name}-{segment}-{zone}", subnet_id=subnet.id,
                                          route_table_id=routes.id, opts=self.child())
        endpoint = aws.ec2.VpcEndpoint(f"{name}-s3", vpc_id=vpc.id,
                                       service_name=f"com.amazonaws.{args.region}.s3",
                                       vpc_endpoint_type="Gateway",
                                       route_table_ids=[routes.id],
                                       policy=json.dumps(args.s3_endpoint_policy),
                                       tags={**tags, "Name": f"{name}-s3"}, opts=self.child())
        # The VPC's default group, which anything launched without a group would get,
        # admits nothing and sends nothing (CIS AWS 5.4): every group gpupool uses is its own.
        aws.ec2.DefaultSecurityGroup(f"{name}-default", vpc_id=vpc.id, ingress=[], egress=[],
                                     tags={**tags, "Name": f"{name}-default"},
                                     opts=self.child())
        # Nodes reach their buckets through the gateway endpoint.
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-training-eg-s3", security_group_id=groups["training"].id,
            ip_protocol="tcp", from_port=network.S3_ENDPOINT_PORT,
            to_port=network.S3_ENDPOINT_PORT,
            prefix_list_id=endpoint.prefix_list_id, description="S3 through the endpoint",
            tags={**tags, "segment": "training", "peer": network.S3_ENDPOINT_PEER},
            opts=self.child())
        self._flow_logs(name, args.flow_log_retention_days, vpc, tags)
        self.vpc_id = vpc.id
        self.security_group_ids = {seg: g.id for seg, g in groups.items()}
        self.register_outputs({"vpc_id": self.vpc_id, "subnet_ids": self.subnet_ids,
                               "security_group_ids": self.security_group_ids,
                               "link": self.link, "egress": self.egress})

    def _flow_logs(self, name: str, retention_days: int, vpc: aws.ec2.Vpc,
                   tags: dict[str, str]) -> None:
        group = aws.cloudwatch.LogGroup(f"{name}-flow-logs", name=f"/gpupool/{name}/flow-logs",
                                        retention_in_days=retention_days, tags=tags,
                                        opts=self.child())
        role = aws.iam.Role(f"{name}-flow-logs", tags=tags, opts=self.child(),
                            assume_role_policy=json.dumps({
                                "Version": "2012-10-17", "Statement": [{
                                    "Effect": "Allow", "Action": "sts:AssumeRole",
                                    "Principal": {"Service": "vpc-flow-logs.amazonaws.com"}}]}))
        aws.iam.RolePolicy(f"{name}-flow-logs", role=role.id, opts=self.child(),
                           policy=group.arn.apply(lambda arn: json.dumps({
                               "Version": "2012-10-17", "Statement": [{
                                   "Effect": "Allow",
                                   "Action": ["logs:CreateLogStream", "logs:PutLogEvents",
                                              "logs:DescribeLogStreams"],
                                   "Resource": [arn, f"{arn}:*"]}]})))
        aws.ec2.FlowLog(f"{name}-flow-logs", vpc_id=vpc.id, traffic_type="ALL",
                        log_destination_type="cloud-watch-logs", log_destination=group.arn,
                        iam_role_arn=role.arn, tags=tags, opts=self.child())
