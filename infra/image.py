"""BurstImage: a burst region's EC2 Image Builder pipeline, and the image its launch
templates boot."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from gpupool.render import image
from gpupool.render.cloud import launch, names
from gpupool.render.image import ImagePlan
from infra.components import Component
from infra.network import NetworkSegments
from infra.storage import StorageTiers

# AWS managed policies a build instance needs: Image Builder's own (its logs, components
# and the S3 downloads of them) and Systems Manager's, which runs the build.
BUILDER_POLICIES = {
    "imagebuilder": "arn:aws:iam::aws:policy/EC2InstanceProfileForImageBuilder",
    "ssm": "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
}
TEST_TIMEOUT_MINUTES = 60


@dataclass(frozen=True)
class BurstImageArgs:
    plan: ImagePlan
    network: NetworkSegments  # the region's: the build runs in its training subnet
    storage: StorageTiers  # the pool key, which the artifact's bucket is encrypted with


class BurstImage(Component):
    """Component (the build document: Ansible from Debian, the project's roles from the
    artifact pinned by its SHA-256, playbooks/burst_image.yml at the lock), recipe on
    Debian 12's official AMI with an encrypted root, build infrastructure in the burst
    VPC's training subnet with IMDSv2 and its own instance profile, distribution, an
    on-demand pipeline, and the image built at `pulumi up` unless the stack config names one."""

    image_id: pulumi.Output[str]
    source: str  # the launch template's burst-image tag: where its AMI comes from
    pipeline_arn: pulumi.Output[str]

    def __init__(self, name: str, args: BurstImageArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("BurstImage", name, opts)
        plan = args.plan
        tags, document = plan.tags, plan.document
        component = aws.imagebuilder.Component(
            name, name=name, platform="Linux", version=image.version(document),
            data=document, description=f"gpupool burst node of pool {plan.pool}",
            tags=tags, opts=self.child())
        parent = aws.ec2.get_ami_output(most_recent=True, owners=[launch.AMI_OWNER], filters=[
            {"name": "name", "values": [plan.parent_ami_name]},
            {"name": "architecture", "values": ["x86_64"]}],
            opts=pulumi.InvokeOutputOptions(parent=self))
        recipe = aws.imagebuilder.ImageRecipe(
            name, name=name, parent_image=parent.id,
            # A new Debian AMI is a new recipe too: versions are immutable.
            version=parent.id.apply(lambda ami: image.version(document + ami)),
            components=[{"componentArn": component.arn}],
            block_device_mappings=[{"deviceName": launch.ROOT_DEVICE, "ebs": {
                "encrypted": "true", "volumeSize": launch.ROOT_VOLUME_GIB, "volumeType": "gp3",
                "deleteOnTermination": "true"}}],
            tags=tags, opts=self.child())
        infrastructure = self._infrastructure(name, args, tags)
        distribution = aws.imagebuilder.DistributionConfiguration(
            name, name=name, distributions=[{"region": plan.region,
                                             "amiDistributionConfiguration": {
                                                 "name": f"{name}-{{{{ imagebuilder:buildDate }}}}",
                                                 "description": f"gpupool {name}",
                                                 "amiTags": tags}}],
            tags=tags, opts=self.child())
        build = {"image_recipe_arn": recipe.arn,
                 "infrastructure_configuration_arn": infrastructure.arn,
                 "distribution_configuration_arn": distribution.arn,
                 "image_tests_configuration": {"imageTestsEnabled": True,
                                               "timeoutMinutes": TEST_TIMEOUT_MINUTES}}
        # No schedule: a rebuild is an operator's decision (start-image-pipeline-execution),
        # and its AMI reaches the launch templates only through gpupool:burstImageId.
        pipeline = aws.imagebuilder.ImagePipeline(name, name=name, status="ENABLED", **build,
                                                  tags=tags, opts=self.child())
        if plan.prebuilt is not None:
            self.image_id = pulumi.Output.from_input(plan.prebuilt)
            self.source = names.IMAGE_FROM_CONFIG
        else:
            built = aws.imagebuilder.Image(name, **build, tags=tags, opts=self.child())
            self.image_id = built.output_resources.apply(lambda out: out[0].amis[0].image)
            self.source = name
        self.pipeline_arn = pipeline.arn
        self.register_outputs({"image_id": self.image_id, "source": self.source,
                               "pipeline_arn": self.pipeline_arn})

    def _infrastructure(self, name: str, args: BurstImageArgs, tags: dict[str, str]
                        ) -> aws.imagebuilder.InfrastructureConfiguration:
        """Where the build runs: a GPU instance of the region's burst types in the first
        zone's training subnet, behind the nodes' security groups, with IMDSv2 and a
        profile that may read the one artifact and nothing else of the pool."""
        plan = args.plan
        role = aws.iam.Role(f"{name}-builder", tags=tags, opts=self.child(),
                            assume_role_policy=json.dumps({
                                "Version": "2012-10-17", "Statement": [{
                                    "Effect": "Allow", "Action": "sts:AssumeRole",
                                    "Principal": {"Service": "ec2.amazonaws.com"}}]}))
        for key, arn in BUILDER_POLICIES.items():
            aws.iam.RolePolicyAttachment(f"{name}-builder-{key}", role=role.name, policy_arn=arn,
                                         opts=self.child())
        document = args.storage.key_arn.apply(
            lambda key: json.dumps(image.artifact_policy(plan.artifact_bucket,
                                                         plan.key_region, key)))
        policy = aws.iam.Policy(f"{name}-builder", policy=document, tags=tags,
                                description=f"gpupool {name} build: the artifact",
                                opts=self.child())
        aws.iam.RolePolicyAttachment(f"{name}-builder", role=role.name, policy_arn=policy.arn,
                                     opts=self.child())
        profile = aws.iam.InstanceProfile(f"{name}-builder", role=role.name, tags=tags,
                                          opts=self.child())
        return aws.imagebuilder.InfrastructureConfiguration(
            name, name=name, instance_profile_name=profile.name,
            instance_types=plan.instance_types,
            subnet_id=args.network.subnet_ids["training"][plan.zone],
            security_group_ids=[args.network.security_group_ids[s]
                                for s in ("training", "management")],
            terminate_instance_on_failure=True,
            instance_metadata_options={"httpTokens": "required", "httpPutResponseHopLimit": 1},
            resource_tags=tags, tags=tags, opts=self.child())

