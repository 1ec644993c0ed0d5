"""StorageTiers: the pool's buckets, their key, and the Lustre scratch file system."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from gpupool.render.cloud import names, storage
from gpupool.spec.model import Description
from infra.components import Component
from infra.network import NetworkSegments


@dataclass(frozen=True)
class StorageTiersArgs:
    desc: Description
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
        desc = args.desc
        tags = names.tags(desc)
        key = aws.kms.Key(f"{name}-key", description=f"gpupool {desc.pool.name} storage",
                          enable_key_rotation=True, deletion_window_in_days=30, tags=tags,
                          policy=args.account.apply(
                              lambda a: json.dumps(storage.key_policy(desc, a))),
                          opts=self.child())
        aws.kms.Alias(f"{name}-key", name=f"alias/gpupool-{desc.pool.name}",
                      target_key_id=key.key_id, opts=self.child())
        self.key_arn = key.arn
        self.bucket_arns, self.bucket_names = {}, {}
        buckets: list[aws.s3.Bucket] = []
        for tier_name, tier in storage.bucket_tiers(desc).items():
            bname = names.bucket_name(desc, tier_name)
            res = f"{name}-{tier_name}"
            bucket = aws.s3.Bucket(res, bucket=bname, tags={**tags, "tier": tier_name},
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
            if tier.versioning:
                aws.s3.BucketVersioning(res, bucket=bucket.bucket,
                                        versioning_configuration={"status": "Enabled"},
                                        opts=self.child())
            aws.s3.BucketLifecycleConfiguration(
                res, bucket=bucket.bucket, rules=storage.lifecycle_rules(tier_name, tier),
                opts=self.child())
            aws.s3.BucketPolicy(
                res, bucket=bucket.bucket, opts=self.child(),
                policy=json.dumps(storage.bucket_policy(desc, tier_name)))
            buckets.append(bucket)
            self.bucket_arns[tier_name] = bucket.arn
            self.bucket_names[tier_name] = bname
        self.scratch_dns = self._scratch(name, desc, args.network, tags, buckets)
        self.register_outputs({"key_arn": self.key_arn, "bucket_arns": self.bucket_arns,
                               "bucket_names": self.bucket_names,
                               "scratch_dns": self.scratch_dns})

    def _scratch(self, name: str, desc: Description, network: NetworkSegments | None,
                 tags: dict[str, str], buckets: list[aws.s3.Bucket]
                 ) -> pulumi.Output[str] | None:
        scratch = storage.scratch_tier(desc)
        if scratch is None:
            return None
        tier_name, tier = scratch
        if network is None:
            raise ValueError(f"storage tier {tier_name} is Lustre scratch but no burst group "
                             f"declares a VPC in {desc.pool.cloud_region}")
        datasets = storage.lustre_import_tier(desc)
        link = ({"import_path": f"s3://{names.bucket_name(desc, datasets)}",
                 "auto_import_policy": "NEW_CHANGED_DELETED"} if datasets else {})
        zone_subnets = network.subnet_ids["storage"]
        fs = aws.fsx.LustreFileSystem(
            f"{name}-{tier_name}", deployment_type="SCRATCH_2",
            storage_capacity=storage.fsx_capacity_gib(tier.size_tib),
            subnet_ids=zone_subnets[sorted(zone_subnets)[0]],
            security_group_ids=[network.security_group_ids["storage"]],
            tags={**tags, "tier": tier_name}, **link, opts=self.child(depends_on=buckets))
        return fs.dns_name
