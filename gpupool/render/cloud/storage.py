"""The storage tiers' cloud side as plain data: which tiers get a bucket, the buckets'
lifecycle and policies, the FSx for Lustre scratch file system, the pool key's policy and
the tiers' mount units; storage_plan gathers what StorageTiers declares.

infra/storage.py and infra/secrets.py declare them; policies/storage.py checks against them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpupool.render.cloud.names import bucket_arn, bucket_name, tags, via_service
from gpupool.spec.model import (
    SHARED_FSTYPES,
    Description,
    Location,
    Purpose,
    StorageTier,
    Temperature,
    is_bucket_tier,
)

# Product constants, not pool facts: S3 rejects STANDARD_IA before day 30 and bills
# GLACIER for 90 days and DEEP_ARCHIVE for 180 days at least.
STANDARD_IA_MIN_DAYS = 30
DEEP_ARCHIVE_MIN_DAYS = 180
ABORT_MULTIPART_DAYS = 7  # a failed upload's parts are garbage after a week

# FSx for Lustre SCRATCH_2 sizes: 1.2 TiB, then multiples of 2.4 TiB.
FSX_MIN_GIB, FSX_STEP_GIB = 1200, 2400


def bucket_tiers(desc: Description) -> dict[str, StorageTier]:
    """The tiers with a bucket: of a bucket purpose and living in the cloud (location cloud
    or both). An on-prem tier declares nothing here."""
    return {n: t for n, t in desc.storage_tiers.items() if is_bucket_tier(t)}


def purpose_tier(desc: Description, purpose: Purpose) -> str | None:
    """The first bucket tier of a purpose, in description order, or None."""
    return next((n for n, t in bucket_tiers(desc).items() if t.purpose is purpose), None)


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
    return purpose_tier(desc, Purpose.DATASETS)


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


def fsx_s3_role(account: str) -> str:
    return f"arn:aws:iam::{account}:{FSX_S3_ROLE}"


# The services the pool key is used through, in the pool's cloud region: S3 (the buckets'
# SSE-KMS and bucket keys), Secrets Manager (the munge key), EC2 (burst root volumes).
KEY_SERVICES = ("s3", "secretsmanager", "ec2")
KEY_CRYPTO_ACTIONS = ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey*", "kms:ReEncrypt*"]


def key_policy(desc: Description, account: str) -> dict[str, Any]:
    """The pool key's own policy (pool_key_policy) for a description."""
    return pool_key_policy(desc.pool.cloud_region, lustre_import_tier(desc) is not None,
                           account)


def pool_key_policy(region: str, lustre_linked: bool, account: str) -> dict[str, Any]:
    """The pool key's own policy, in the pool's cloud region; lustre_linked: the scratch
    file system imports from a bucket (lustre_import_tier). The account administers it,
    and IAM policies in the account decide who uses it (the node roles through S3,
    node_policy; the munge key's readers through Secrets Manager, munge_read_policy);
    nobody, whatever IAM grants, encrypts or decrypts with it but through the pool's
    services. AWS services acting with their own principals (EBS on a volume's grant) are
    not caught by that deny: they are the services."""
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
    if lustre_linked:
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


@dataclass(frozen=True)
class BucketPlan:
    """One bucket tier's bucket: its global name, versioning, lifecycle (engine names)
    and its own policy."""

    name: str
    versioning: bool
    lifecycle_rules: list[dict[str, Any]]
    policy: dict[str, Any]


@dataclass(frozen=True)
class ScratchPlan:
    """The FSx for Lustre scratch file system of scratch_tier."""

    tier: str
    capacity_gib: int
    import_path: str | None  # s3:// of the linked bucket (lustre_import_tier); None: none


@dataclass(frozen=True)
class StoragePlan:
    """What StorageTiers declares: the pool key, the buckets, the scratch file system."""

    pool: str
    region: str  # the pool's cloud region, where all of them live
    buckets: dict[str, BucketPlan]  # tier -> its bucket, bucket_tiers' order
    scratch: ScratchPlan | None
    tags: dict[str, str]

    @property
    def lustre_linked(self) -> bool:
        """The scratch file system imports from a bucket (the key policy lets FSx in)."""
        return self.scratch is not None and self.scratch.import_path is not None


def storage_plan(desc: Description) -> StoragePlan:
    """StorageTiers' args: everything it declares."""
    scratch = scratch_tier(desc)
    datasets = lustre_import_tier(desc)
    return StoragePlan(
        pool=desc.pool.name, region=desc.pool.cloud_region,
        buckets={n: BucketPlan(bucket_name(desc, n), t.versioning, lifecycle_rules(n, t),
                               bucket_policy(desc, n))
                 for n, t in bucket_tiers(desc).items()},
        scratch=None if scratch is None else ScratchPlan(
            scratch[0], fsx_capacity_gib(scratch[1].size_tib),
            f"s3://{bucket_name(desc, datasets)}" if datasets else None),
        tags=tags(desc))


def mount_unit(path: str) -> str:
    """systemd's name for the mount unit of a path (`systemd-escape --path --suffix=mount`)
    for the paths validation allows (model.MOUNT_PATH_RE: absolute, no empty or dot-led
    parts), as role storage names the units it installs."""
    return path[1:].replace("-", "\\x2d").replace("/", "-") + ".mount"


def mount_units(desc: Description) -> list[str]:
    """The mount units of the tiers on network file systems."""
    return [mount_unit(t.mount.path) for t in desc.storage_tiers.values()
            if t.mount is not None and t.mount.fstype in SHARED_FSTYPES]
