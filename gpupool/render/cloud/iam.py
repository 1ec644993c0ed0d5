"""The pool's IAM policies as plain data: a burst node's run (node) and boot roles, the
munge key's readers, the controller's burst launcher, its backups and its tier copies;
munge_plan gathers what MungeKey declares.

infra/burst.py, infra/secrets.py and infra/cluster.py attach them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpupool.render.cloud.names import (
    TAG_POOL,
    TAG_SLURM_NODE,
    bucket_name,
    munge_secret_name,
    regions,
    tags,
    via_service,
)
from gpupool.render.scheduling import team_quotas
from gpupool.spec.catalog import (
    CONTROLLER_BACKUP_PREFIX,
)
from gpupool.spec.facts import burst_model
from gpupool.spec.model import (
    BurstGroup,
    Description,
    SyncDirection,
    TierSync,
)


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
    """A burst group's node_policy_for: its teams (group_teams), the pool's cloud region."""
    return node_policy_for(desc.pool.cloud_region, group_teams(desc, group), datasets_arn,
                           checkpoints_arn, key_arn)


def node_policy_for(key_region: str, teams: list[str], datasets_arn: str,
                    checkpoints_arn: str | None, key_arn: str) -> dict[str, Any]:
    """Least privilege for a burst node: read datasets, read/write its teams' checkpoint
    prefixes, use the pool key for those objects (through S3 only: the buckets live in
    the pool's cloud region, key_region, whichever region the node is in)."""
    statements: list[dict[str, Any]] = [
        {"Sid": "ReadDatasets", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:ListBucket"],
         "Resource": [datasets_arn, f"{datasets_arn}/*"]},
        {"Sid": "UsePoolKey", "Effect": "Allow",
         "Action": ["kms:Decrypt", "kms:GenerateDataKey"], "Resource": [key_arn],
         "Condition": {"StringEquals": {
             "kms:ViaService": via_service("s3", key_region)}}},
    ]
    prefixes = [f"{t}/*" for t in teams]
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
    """A burst group's munge_read_policy_in: its region, the pool's cloud region."""
    return munge_read_policy_in(group.region, desc.pool.cloud_region, secret_arn, key_arn)


def munge_read_policy_in(region: str, home_region: str, secret_arn: str,
                         key_arn: str) -> dict[str, Any]:
    """A burst node may read the munge key, in its own region (region; the secret lives
    in home_region, the pool's cloud region), and nothing else of Secrets Manager; it may
    decrypt it with the pool key only through Secrets Manager and only for that secret.
    A replica elsewhere is encrypted with that region's aws/secretsmanager
    key, which Secrets Manager uses on the caller's behalf: no KMS statement is needed."""
    home = region == home_region
    arn = secret_arn if home else secret_arn_in(secret_arn, region)
    statements: list[dict[str, Any]] = [
        {"Sid": "ReadMungeKey", "Effect": "Allow", "Action": ["secretsmanager:GetSecretValue"],
         "Resource": [arn]}]
    if home:
        statements.append(
            {"Sid": "DecryptMungeKey", "Effect": "Allow", "Action": ["kms:Decrypt"],
             "Resource": [key_arn], "Condition": {
                 "StringEquals": {
                     "kms:ViaService": f"secretsmanager.{region}.amazonaws.com",
                     "kms:EncryptionContext:SecretARN": arn}}})
    return {"Version": "2012-10-17", "Statement": statements}


def boot_policy(pool: str, region: str, boot_profile_arn: str,
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
         "Resource": [f"arn:aws:ec2:{region}:*:instance/*"],
         "Condition": {"ArnEquals": {"ec2:InstanceProfile": boot_profile_arn},
                       "StringEquals": {f"ec2:ResourceTag/{TAG_POOL}": pool}}},
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


@dataclass(frozen=True)
class MungePlan:
    """What MungeKey declares: the secret in the pool's cloud region with its replicas in
    the other burst regions, and each burst group's region, where its nodes read it."""

    pool: str
    secret_name: str  # munge_secret_name
    replicas: list[str]  # the burst regions but the pool's cloud region, sorted
    group_regions: dict[str, str]  # burst group -> its region (munge_read_policy_in)
    home_region: str  # the pool's cloud region
    tags: dict[str, str]


def munge_plan(desc: Description) -> MungePlan:
    """MungeKey's args."""
    home = desc.pool.cloud_region
    return MungePlan(
        pool=desc.pool.name, secret_name=munge_secret_name(desc),
        # Elsewhere the replica uses that region's aws/secretsmanager key: the pool key
        # lives in the cloud region only, as for the launch template's volumes.
        replicas=sorted({g.region for g in desc.burst_groups.values()} - {home}),
        group_regions={n: g.region for n, g in desc.burst_groups.items()},
        home_region=home, tags=tags(desc))


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


def tier_syncs(desc: Description) -> dict[str, TierSync]:
    """Tier -> its declared copy between mount and bucket (roles/storage_sync)."""
    return {n: t.sync for n, t in desc.storage_tiers.items() if t.sync is not None}


def tier_sync_policy(desc: Description, key_arn: str) -> dict[str, Any] | None:
    """The least privilege of the primary controller's tier copies (roles/storage_sync):
    per `both` tier with a declared sync, its bucket alone, listing it and, by direction,
    reading it (from_cloud) or writing it (to_cloud; deleting only where the sync
    deletes); the pool key through S3 for the objects. None where no tier syncs."""
    synced = tier_syncs(desc)
    if not synced:
        return None
    statements: list[dict[str, Any]] = []
    for name, sync in sorted(synced.items()):
        bucket = f"arn:aws:s3:::{bucket_name(desc, name)}"
        sid = "".join(part.capitalize() for part in name.split("-"))
        # rclone reads an object's metadata (HeadObject, under s3:GetObject) to compare it
        # in both directions; a to_cloud copy never reads an object's body otherwise.
        actions = ["s3:GetObject"]
        if sync.direction is SyncDirection.TO_CLOUD:
            actions += ["s3:PutObject", "s3:AbortMultipartUpload"]
            if sync.delete:
                actions.append("s3:DeleteObject")
        statements += [
            {"Sid": f"List{sid}", "Effect": "Allow", "Action": "s3:ListBucket",
             "Resource": bucket},
            {"Sid": f"Copy{sid}", "Effect": "Allow", "Action": actions,
             "Resource": f"{bucket}/*"}]
    writes = any(s.direction is SyncDirection.TO_CLOUD for s in synced.values())
    statements.append(
        {"Sid": "TierEncryption", "Effect": "Allow",
         "Action": ["kms:Decrypt", *(["kms:GenerateDataKey"] if writes else [])],
         "Resource": [key_arn],
         "Condition": {"StringEquals": {
             "kms:ViaService": via_service("s3", desc.pool.cloud_region)}}})
    return {"Version": "2012-10-17", "Statement": statements}
