"""StorageTiers: the pool's buckets, their key, and the Lustre scratch file system."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from gpupool.render.cloud import storage
from gpupool.render.cloud.storage import StoragePlan
from infra.components import Component
from infra.network import NetworkSegments


@dataclass(frozen=True)
class StorageTiersArgs:
    plan: StoragePlan
    # The VPC in the pool's cloud region, for the scratch file system; None: no VPC there.
    network: NetworkSegments | None
    account: pulumi.Output[str]  # the AWS account id, for the key's policy


class StorageTiers(Component):
    """A bucket per datasets/checkpoints/archive tier (private, SSE-KMS with the pool key,
    versioned where declared, lifecycle from retention, a bucket policy requiring TLS),
    the pool key with its own key policy, and FSx for Lustre scratch linked to the
    datasets bucket."""

    key_arn: pulumi.Output[str]
    bucket_arns: dict[str, pulumi.Output[str]]
    bucket_names: dict[str, str]
    scratch_dns: pulumi.Output[str] | None

    def __init__(self, name: str, args: StorageTiersArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("StorageTiers", name, opts)
        plan = args.plan
        tags = plan.tags
        key = aws.kms.Key(f"{name}-key", description=f"gpupool {plan.pool} storage",
                          enable_key_rotation=True, deletion_window_in_days=30, tags=tags,
                          policy=args.account.apply(lambda a: json.dumps(
                              storage.pool_key_policy(plan.region, plan.lustre_linked, a))),
                          opts=self.child())
        aws.kms.Alias(f"{name}-key", name=f"alias/gpupool-{plan.pool}",
                      target_key_id=key.key_id, opts=self.child())
        self.key_arn = key.arn
        self.bucket_arns, self.bucket_names = {}, {}
        buckets: list[aws.s3.Bucket] = []
        for tier_name, spec in plan.buckets.items():
            res = f"{name}-{tier_name}"
            bucket = aws.s3.Bucket(res, bucket=spec.name, tags={**tags, "tier": tier_name},
                                   opts=self.child())
            aws.s3.BucketPublicAccessBlock(res, bucket=bucket.bucket, block_public_acls=True,
                                           block_public_policy=True, ignore_public_acls=True,
                                           restrict_public_buckets=True, opts=self.child())
            aws.s3.BucketOwnershipControls(
                res, bucket=bucket.bucket, rule={"objectOwnership": "BucketOwnerEnforced"},
                opts=self.child())
            aws.s3.BucketServerSideEncryptionConfiguration(
                res, bucket=bucket.bucket, opts=self.child(), rules=[{
                    "applyServerSideEncryptionByDefault": {
                        "sseAlgorithm": "aws:kms", "kmsMasterKeyId": key.arn},
                    "bucketKeyEnabled": True}])
            if spec.versioning:
                aws.s3.BucketVersioning(res, bucket=bucket.bucket,
                                        versioning_configuration={"status": "Enabled"},
                                        opts=self.child())
            aws.s3.BucketLifecycleConfiguration(
                res, bucket=bucket.bucket, rules=spec.lifecycle_rules,
                opts=self.child())
            aws.s3.BucketPolicy(
                res, bucket=bucket.bucket, opts=self.child(),
                policy=json.dumps(spec.policy))
            buckets.append(bucket)
            self.bucket_arns[tier_name] = bucket.arn
            self.bucket_names[tier_name] = spec.name
        self.scratch_dns = self._scratch(name, plan, args.network, buckets)
        self.register_outputs({"key_arn": self.key_arn, "bucket_arns": self.bucket_arns,
                               "bucket_names": self.bucket_names,
                               "scratch_dns": self.scratch_dns})

    def _scratch(self, name: str, plan: StoragePlan, network: NetworkSegments | None,
                 buckets: list[aws.s3.Bucket]) -> pulumi.Output[str] | None:
        scratch = plan.scratch
        if scratch is None:
            return None
        if network is None:
            raise ValueError(f"storage tier {scratch.tier} is Lustre scratch but no burst "
                             f"group declares a VPC in {plan.region}")
        link = ({"import_path": scratch.import_path,
                 "auto_import_policy": "NEW_CHANGED_DELETED"} if scratch.import_path else {})
        zone_subnets = network.subnet_ids["storage"]
        fs = aws.fsx.LustreFileSystem(
            f"{name}-{scratch.tier}", deployment_type="SCRATCH_2",
            storage_capacity=scratch.capacity_gib,
            subnet_ids=zone_subnets[sorted(zone_subnets)[0]],
            security_group_ids=[network.security_group_ids["storage"]],
            tags={**plan.tags, "tier": scratch.tier}, **link,
            opts=self.child(depends_on=buckets))
        return fs.dns_name
