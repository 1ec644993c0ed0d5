"""BurstPool: one burst group's cloud nodes, from zero up to its declared maximum."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from gpupool.render.cloud import iam, launch, names
from gpupool.render.cloud.launch import BurstPlan
from infra.components import Component
from infra.image import BurstImage
from infra.network import NetworkSegments
from infra.storage import StorageTiers


@dataclass(frozen=True)
class BurstPoolArgs:
    plan: BurstPlan
    network: NetworkSegments  # the group's region's
    storage: StorageTiers
    image: BurstImage  # the region's: its AMI is what the launch template boots


class BurstPool(Component):
    """Launch template (the region's burst image, IMDSv2, encrypted root, EFA interfaces
    where declared), a cluster placement group for EFA, a mixed-instances autoscaling group
    with a zero minimum, and two least-privilege instance profiles. The launch template
    gives an instance the boot profile, whose role may read the munge key (MungeKey grants
    it) and swap that profile for the run profile (iam.boot_policy); the user-data joins
    the instance to Slurm by itself and swaps the profiles once the key is in place
    (launch.user_data), so the node runs with the run role (iam.node_policy: datasets and
    its teams' checkpoints), which has no Secrets Manager access."""

    launch_template_id: pulumi.Output[str]
    group_name: pulumi.Output[str]
    boot_role: aws.iam.Role  # the launch template's: the launcher passes it, MungeKey grants it
    run_role: aws.iam.Role

    def __init__(self, name: str, args: BurstPoolArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("BurstPool", name, opts)
        plan = args.plan
        tags = plan.tags
        self.run_role = self._profile(name, args, tags)
        self.boot_role, profile = self._boot_profile(name, args, tags, self.run_role)
        # Its instances and volumes say which image they booted from, for the policy pack.
        template_tags = {**tags, names.TAG_BURST_IMAGE: args.image.source}
        sgs = [args.network.security_group_ids[s] for s in ("training", "management")]
        efa = plan.efa_interfaces
        if efa:
            # Card 0 carries the primary (device 0); every other card one EFA-only device.
            nics = [{"deviceIndex": 0 if i == 0 else 1, "networkCardIndex": i,
                     "interfaceType": "efa" if i == 0 else "efa-only",
                     "securityGroups": sgs, "deleteOnTermination": "true"}
                    for i in range(efa)]
        else:
            nics = [{"deviceIndex": 0, "securityGroups": sgs,
                     "associatePublicIpAddress": "false", "deleteOnTermination": "true"}]
        key = {"kmsKeyId": args.storage.key_arn} if plan.pool_key_root else {}
        template = aws.ec2.LaunchTemplate(
            name, name=name, image_id=args.image.image_id, update_default_version=True,
            metadata_options={"httpEndpoint": "enabled", "httpTokens": "required",
                              "httpPutResponseHopLimit": 1, "instanceMetadataTags": "enabled"},
            block_device_mappings=[{"deviceName": launch.ROOT_DEVICE, "ebs": {
                "encrypted": "true", "volumeSize": launch.ROOT_VOLUME_GIB, "volumeType": "gp3",
                "deleteOnTermination": "true", **key}}],
            iam_instance_profile={"arn": profile.arn},
            network_interfaces=nics,
            user_data=base64.b64encode(plan.user_data.encode()).decode(),
            tag_specifications=[{"resourceType": r, "tags": template_tags}
                                for r in ("instance", "volume", "network-interface")],
            tags=template_tags, opts=self.child())
        placement: dict[str, pulumi.Input[str]] = {}
        if efa:
            pg = aws.ec2.PlacementGroup(name, name=name, strategy="cluster", tags=tags,
                                        opts=self.child())
            placement = {"placement_group": pg.id}
        spot = plan.spot
        subnets = args.network.subnet_ids["training"]
        asg = aws.autoscaling.Group(
            name, name=name, min_size=plan.min_nodes, max_size=plan.max_nodes,
            vpc_zone_identifiers=[subnets[z] for z in plan.zones],
            capacity_rebalance=spot, **placement,
            mixed_instances_policy={
                "instancesDistribution": {
                    "onDemandAllocationStrategy": "prioritized",
                    "onDemandBaseCapacity": plan.on_demand_base,
                    "onDemandPercentageAboveBaseCapacity": 0 if spot else 100,
                    "spotAllocationStrategy": "capacity-optimized"},
                "launchTemplate": {
                    "launchTemplateSpecification": {"launchTemplateId": template.id,
                                                    "version": "$Latest"},
                    "overrides": [{"instanceType": t} for t in plan.instance_types]}},
            tags=[{"key": k, "value": v, "propagateAtLaunch": True}
                  for k, v in sorted(tags.items())],
            opts=self.child())
        self.launch_template_id = template.id
        self.group_name = asg.name
        self.register_outputs({"launch_template_id": self.launch_template_id,
                               "group_name": self.group_name, "boot_role": self.boot_role,
                               "run_role": self.run_role})

    def _profile(self, name: str, args: BurstPoolArgs, tags: dict[str, str]) -> aws.iam.Role:
        """The run role and its profile (names.run_profile_name, which the user-data
        names): what a node may do once booted, and no Secrets Manager."""
        plan, arns = args.plan, args.storage.bucket_arns
        role = _ec2_role(f"{name}-node", tags, self.child())
        datasets = arns[plan.datasets_tier] if plan.datasets_tier else None
        checkpoints = arns[plan.checkpoints_tier] if plan.checkpoints_tier else None
        document = pulumi.Output.all(datasets, checkpoints, args.storage.key_arn).apply(
            lambda a: json.dumps(iam.node_policy_for(plan.key_region, plan.teams, a[0], a[1],
                                                     a[2])))
        policy = aws.iam.Policy(f"{name}-node", policy=document, tags=tags,
                                description=f"gpupool burst group {plan.group} nodes",
                                opts=self.child())
        aws.iam.RolePolicyAttachment(f"{name}-node", role=role.name, policy_arn=policy.arn,
                                     opts=self.child())
        aws.iam.InstanceProfile(f"{name}-node", name=plan.run_profile,
                                role=role.name, tags=tags, opts=self.child())
        return role

    def _boot_profile(self, name: str, args: BurstPoolArgs, tags: dict[str, str],
                      run_role: aws.iam.Role
                      ) -> tuple[aws.iam.Role, aws.iam.InstanceProfile]:
        """The boot role and its profile, the launch template's: the munge key (MungeKey
        adds that grant) and the one swap to the run profile (iam.boot_policy)."""
        plan = args.plan
        role = _ec2_role(f"{name}-boot", tags, self.child())
        profile = aws.iam.InstanceProfile(
            f"{name}-boot", name=plan.boot_profile, role=role.name, tags=tags,
            opts=self.child())
        document = pulumi.Output.all(profile.arn, run_role.arn).apply(
            lambda a: json.dumps(iam.boot_policy(plan.pool, plan.region, a[0], a[1])))
        policy = aws.iam.Policy(f"{name}-boot", policy=document, tags=tags,
                                description=f"gpupool burst group {plan.group} boot",
                                opts=self.child())
        aws.iam.RolePolicyAttachment(f"{name}-boot", role=role.name, policy_arn=policy.arn,
                                     opts=self.child())
        return role, profile


def _ec2_role(name: str, tags: dict[str, str], opts: pulumi.ResourceOptions) -> aws.iam.Role:
    """A role EC2 instances assume (through an instance profile)."""
    return aws.iam.Role(name, tags=tags, opts=opts, assume_role_policy=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": "sts:AssumeRole",
            "Principal": {"Service": "ec2.amazonaws.com"}}]}))
