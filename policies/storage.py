"""Storage: encryption at rest, no public access, TLS only, versioned checkpoints,
retention."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from fnmatch import fnmatchcase
from typing import Any

from gpupool.render.cloud import names, storage
from gpupool.spec.model import Description, Purpose
from policies.core import (
    Level,
    Res,
    Stack,
    as_list,
    policy_statements,
    resource_policy,
    stack_policy,
)
from policies.types import (
    AWS_BUCKET,
    AWS_BUCKET_POLICY,
    AWS_LIFECYCLE,
    AWS_PUBLIC_BLOCK,
    AWS_SSE,
    AWS_VERSIONING,
)

KMS_ALGORITHMS = ("aws:kms", "aws:kms:dsse")
PUBLIC_ACLS = ("public-read", "public-read-write", "authenticated-read")
BLOCK_FLAGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
               "restrictPublicBuckets")


@resource_policy("storage-encryption-at-rest", "storage", Level.MANDATORY,
                 "Buckets encrypt by default with SSE-KMS and a customer key.", (AWS_SSE,))
def encryption(r: Res, desc: Description) -> Iterator[str]:
    rules = r.props.get("rules") or []
    if not rules:
        yield f"bucket {r.props.get('bucket')} has no default encryption rule"
    for rule in rules:
        default = rule.get("applyServerSideEncryptionByDefault") or {}
        algorithm = default.get("sseAlgorithm")
        if algorithm not in KMS_ALGORITHMS:
            yield (f"bucket {r.props.get('bucket')} encrypts with {algorithm}, not SSE-KMS "
                   "with the pool key")
        elif not default.get("kmsMasterKeyId"):
            yield f"bucket {r.props.get('bucket')} uses SSE-KMS without naming the pool key"


@resource_policy("storage-public-access-blocked", "storage", Level.MANDATORY,
                 "Every bucket blocks public ACLs and policies; none grants a public ACL.")
def public_access(r: Res, desc: Description) -> Iterator[str]:
    if r.type == AWS_PUBLIC_BLOCK:
        open_flags = [f for f in BLOCK_FLAGS if r.props.get(f) is not True]
        if open_flags:
            yield (f"bucket {r.props.get('bucket')} does not block public access: "
                   f"{', '.join(open_flags)} not true")
    elif r.type == AWS_BUCKET and r.props.get("acl") in PUBLIC_ACLS:
        yield f"bucket {r.props.get('bucket')} has the public ACL {r.props['acl']}"


def _for_bucket(stack: Stack, type_: str, bucket: str) -> list[Res]:
    return [r for r in stack.of_type(type_) if r.props.get("bucket") == bucket]


def _named_buckets(stack: Stack) -> list[tuple[Res, str]]:
    """The buckets with an explicit name, which their guards are matched by
    (storage-bucket-guards reports the others)."""
    return [(b, b.props["bucket"]) for b in stack.of_type(AWS_BUCKET) if b.props.get("bucket")]


@stack_policy("storage-bucket-guards", "storage", Level.MANDATORY,
              "Every bucket has a public access block, default encryption and a lifecycle.")
def bucket_guards(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    for b in stack.of_type(AWS_BUCKET):
        if not b.props.get("bucket"):
            yield b.urn, "bucket has no explicit name, so its guards cannot be matched to it"
    for b, name in _named_buckets(stack):
        for type_, what in ((AWS_PUBLIC_BLOCK, "public access block"),
                            (AWS_SSE, "default encryption"), (AWS_LIFECYCLE, "lifecycle rules")):
            if not _for_bucket(stack, type_, name):
                yield b.urn, f"bucket {name} has no {what}"


def _everyone(principal: Any) -> bool:
    if isinstance(principal, Mapping):
        return as_list(principal.get("AWS")) == ["*"]
    return principal == "*"


def _denies_plain_http(statement: Mapping[str, Any], bucket: str) -> bool:
    """Whether a statement refuses every request to the bucket and its objects that does
    not come over TLS, whoever makes it (any other condition would narrow it)."""
    condition = statement.get("Condition") or {}
    if set(condition) - {"Bool", "BoolIfExists"} or any(
            set(keys) != {"aws:SecureTransport"} for keys in condition.values()):
        return False
    insecure = [v for keys in condition.values() for v in as_list(keys["aws:SecureTransport"])]
    resources = [str(r) for r in as_list(statement.get("Resource"))]
    arn = f"arn:aws:s3:::{bucket}"
    return (statement.get("Effect") == "Deny" and _everyone(statement.get("Principal"))
            and any(a in ("*", "s3:*") for a in as_list(statement.get("Action")))
            and all(any(fnmatchcase(target, r) for r in resources)
                    for target in (arn, f"{arn}/*"))
            and any(str(v).lower() == "false" for v in insecure))


@stack_policy("storage-bucket-tls-only", "storage", Level.MANDATORY,
              "Every bucket has a bucket policy that denies requests without TLS.")
def tls_only(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    for b, name in _named_buckets(stack):
        if not any(_denies_plain_http(s, name)
                   for p in _for_bucket(stack, AWS_BUCKET_POLICY, name)
                   for s in policy_statements(p.props.get("policy"))):
            yield b.urn, (f"bucket {name} has no bucket policy denying requests without TLS "
                          "(aws:SecureTransport false)")


@stack_policy("storage-checkpoints-versioned", "storage", Level.MANDATORY,
              "Each checkpoints tier has a bucket with versioning enabled and a lifecycle.")
def checkpoints_versioned(stack: Stack, desc: Description
                          ) -> Iterator[tuple[str | None, str]]:
    for tier, t in storage.bucket_tiers(desc).items():
        if t.purpose is not Purpose.CHECKPOINTS:
            continue
        name = names.bucket_name(desc, tier)
        buckets = [b for b in stack.of_type(AWS_BUCKET) if b.props.get("bucket") == name]
        if not buckets:
            yield None, f"checkpoints tier {tier} has no bucket ({name})"
            continue
        enabled = [v for v in _for_bucket(stack, AWS_VERSIONING, name)
                   if (v.props.get("versioningConfiguration") or {}).get("status") == "Enabled"]
        if not enabled:
            yield buckets[0].urn, (f"checkpoints bucket {name} is not versioned: an "
                                   "overwritten or deleted checkpoint cannot be recovered")
        if not _for_bucket(stack, AWS_LIFECYCLE, name):
            yield buckets[0].urn, f"checkpoints bucket {name} has no lifecycle rules"


def _rules(r: Res) -> list[dict]:
    return [x for x in (r.props.get("rules") or []) if x.get("status") == "Enabled"]


@resource_policy("storage-retention-within-bounds", "storage", Level.MANDATORY,
                 "Lifecycle rules expire objects no later than the tier's retention_days and "
                 "move them before expiry.", (AWS_LIFECYCLE,))
def retention(r: Res, desc: Description) -> Iterator[str]:
    bucket = r.props.get("bucket")
    tier = storage.tier_of_bucket(desc, bucket)
    if tier is None:
        yield f"bucket {bucket} belongs to no storage tier of the description"
        return
    limit = desc.storage_tiers[tier].retention_days
    rules = _rules(r)
    expiries = [x.get("expiration", {}).get("days") for x in rules]
    if not any(expiries):
        yield f"bucket {bucket} never expires objects; tier {tier} keeps them {limit} days"
    for x in rules:
        days = (x.get("expiration") or {}).get("days")
        if days is not None and days > limit:
            yield (f"bucket {bucket} keeps objects {days} days, beyond tier {tier}'s "
                   f"retention of {limit} days")
        noncurrent = (x.get("noncurrentVersionExpiration") or {}).get("noncurrentDays")
        if noncurrent is not None and noncurrent > limit:
            yield (f"bucket {bucket} keeps old versions {noncurrent} days, beyond {limit}")
        for step in x.get("transitions") or []:
            if days is not None and step.get("days", 0) >= days:
                yield (f"bucket {bucket} moves objects to {step.get('storageClass')} on day "
                       f"{step.get('days')}, not before they expire on day {days}")


@resource_policy("storage-abort-multipart", "storage", Level.ADVISORY,
                 "Incomplete multipart uploads are aborted, so failed writes do not pile up.",
                 (AWS_LIFECYCLE,))
def abort_multipart(r: Res, desc: Description) -> Iterator[str]:
    if not any(x.get("abortIncompleteMultipartUpload")
                                       for x in _rules(r)):
        yield f"bucket {r.props.get('bucket')} keeps incomplete multipart uploads forever"
