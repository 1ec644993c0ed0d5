"""Who reaches the pool's data: the buckets' and the pool key's own policies, the node
roles' use of the key, the burst launcher's permissions, and the policy that refuses a
bucket open to plain HTTP (mocks fixture: tests/_pulumi.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpupool.preview.pulumi_mock import MOCK_ACCOUNT
from gpupool.render.cloud import iam, names, storage
from gpupool.spec import loader
from gpupool.spec.model import Description
from tests._policy import drop, edit, messages, recorded, violations
from tests._pulumi import declared, one
from tests.conftest import ROOT, raw_stack

STACKS = ["lab", "example"]
TLS_ONLY = "storage-bucket-tls-only"
FAR_REGION = "eu-central-1"


@pytest.fixture(scope="module", params=STACKS)
def stack(request: pytest.FixtureRequest) -> str:
    return request.param


def _doc(text: str) -> dict[str, Any]:
    return json.loads(text)


def _sids(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["Sid"]: s for s in doc["Statement"]}


# --- bucket policies -------------------------------------------------------------------

def test_every_bucket_denies_plain_http_only(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    run = declared(stack)
    for tier in storage.bucket_tiers(desc):
        name, arn = names.bucket_name(desc, tier), names.bucket_arn(desc, tier)
        policy = one(run, ":BucketPolicy", f"{desc.pool.name}-{tier}")
        assert policy.inputs["bucket"] == name
        assert policy.parent is not None and policy.parent.endswith(
            f"StorageTiers::{desc.pool.name}")
        doc = _doc(policy.inputs["policy"])
        assert doc == storage.bucket_policy(desc, tier)
        # Objects are not fenced to the pool's network (on-prem restores and uploads
        # reach S3 from undeclared public addresses): the TLS deny is all there is.
        assert doc["Statement"] == [
            {"Sid": "DenyWithoutTLS", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
             "Resource": [arn, f"{arn}/*"],
             "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]


# --- the pool key ---------------------------------------------------------------------

def test_pool_key_has_its_own_policy(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    key = one(declared(stack), "kms/key:Key", f"{desc.pool.name}-key")
    doc = _doc(key.inputs["policy"])
    assert doc == storage.key_policy(desc, MOCK_ACCOUNT)
    assert storage.lustre_import_tier(desc) == ("datasets" if stack == "example" else None)
    sids = _sids(doc)
    assert sids["AccountAdministers"]["Principal"] == {
        "AWS": f"arn:aws:iam::{MOCK_ACCOUNT}:root"}
    region = desc.pool.cloud_region
    deny = sids["UseOnlyThroughPoolServices"]
    assert deny["Effect"] == "Deny" and deny["Principal"] == "*"
    assert deny["Condition"]["StringNotEquals"] == {"kms:ViaService": [
        f"s3.{region}.amazonaws.com", f"secretsmanager.{region}.amazonaws.com",
        f"ec2.{region}.amazonaws.com"]}
    # FSx's service-linked role is let in through S3 only where a Lustre tier exists.
    lustre = sids.get("LustreThroughS3")
    assert (lustre is not None) == (storage.lustre_import_tier(desc) is not None)
    if lustre is not None:
        assert lustre["Condition"]["StringEquals"] == {
            "kms:ViaService": f"s3.{region}.amazonaws.com", "kms:CallerAccount": MOCK_ACCOUNT}


def test_nodes_use_the_pool_key_only_through_s3_in_its_region() -> None:
    desc = loader.load_stack("example", ROOT)
    node = one(declared("example"), "iam/policy:Policy", "prod-l40s-burst-node")
    use = _sids(_doc(node.inputs["policy"]))["UsePoolKey"]
    assert use["Condition"] == {"StringEquals": {
        "kms:ViaService": f"s3.{desc.pool.cloud_region}.amazonaws.com"}}


# --- the burst launcher (resume/suspend) ------------------------------------------------

def _launcher(desc: Description) -> dict[str, dict[str, Any]]:
    roles = [f"arn:aws:iam::111122223333:role/{names.burst_name(desc, g)}-boot"
             for g in desc.burst_groups]
    return _sids(iam.burst_launch_policy(desc, "111122223333", roles,
                                           "arn:aws:kms:eu-west-1:111122223333:key/k"))


def test_launcher_launches_only_from_the_pools_templates_into_its_network() -> None:
    desc = loader.load_stack("lab", ROOT)
    s = _launcher(desc)
    arn = "arn:aws:ec2:eu-west-1:111122223333"
    assert s["LaunchFromPoolTemplates"]["Resource"] == [f"{arn}:launch-template/*"]
    assert s["LaunchFromPoolTemplates"]["Condition"] == {
        "StringEquals": {"ec2:ResourceTag/pool": "lab"}}
    assert s["LaunchIntoPoolNetwork"]["Condition"] == {
        "StringEquals": {"ec2:ResourceTag/pool": "lab"}}
    # The instance carries the pool tag from launch, so suspend may terminate it later.
    assert s["LaunchPoolInstances"]["Condition"]["StringEquals"] == {
        "aws:RequestTag/pool": "lab"}
    assert s["LaunchTemplateParts"]["Condition"] == {
        "ArnLike": {"ec2:LaunchTemplate": [f"{arn}:launch-template/*"]}}
    assert s["TagAtLaunchOnly"]["Condition"] == {
        "StringEquals": {"ec2:CreateAction": ["CreateFleet", "RunInstances"]}}
    assert s["PassNodeRoles"]["Resource"] == [
        "arn:aws:iam::111122223333:role/lab-l4-burst-boot"]
    # Every launch permission is fenced by the pool's tag or its templates.
    for sid, st in s.items():
        if "ec2:RunInstances" in st["Action"]:
            assert st.get("Condition"), sid


def test_launcher_terminates_only_the_pools_slurm_nodes() -> None:
    desc = loader.load_stack("lab", ROOT)
    st = _launcher(desc)["TerminatePoolNodes"]
    assert st["Action"] == ["ec2:TerminateInstances"]
    assert st["Resource"] == ["arn:aws:ec2:eu-west-1:111122223333:instance/*"]
    # The two tags suspend matches (gpupool.onhost.burst.live_instances).
    assert st["Condition"] == {
        "StringEquals": {"ec2:ResourceTag/pool": "lab"},
        "Null": {f"ec2:ResourceTag/{names.TAG_SLURM_NODE}": "false"}}
    from gpupool.onhost import burst  # noqa: PLC0415

    assert (burst.POOL_TAG, burst.NODE_TAG) == (names.TAG_POOL, names.TAG_SLURM_NODE)
    # Nothing else may terminate or launch outside those statements.
    actions = {a for s in _launcher(desc).values() for a in s["Action"]}
    assert not any(a.endswith("*") and a.startswith("ec2:") for a in actions)


def test_launcher_encrypts_root_volumes_only_through_ec2() -> None:
    desc = loader.load_stack("lab", ROOT)
    st = _launcher(desc)["EncryptRootVolumes"]
    assert st["Condition"]["StringEquals"] == {"kms:ViaService": "ec2.eu-west-1.amazonaws.com"}
    far = loader.parse(_lab_far_only())
    assert "EncryptRootVolumes" not in _launcher(far)


def _lab_far_only() -> dict[str, Any]:
    """The lab with its one burst group moved out of the pool's cloud region."""
    from tests.conftest import mutate, raw_stack  # noqa: PLC0415

    return mutate(raw_stack("lab"), [
        {"set": "burst_groups.l4-burst.region", "value": FAR_REGION},
        {"set": "burst_groups.l4-burst.availability_zones", "value": [f"{FAR_REGION}a"]},
        {"rename": "network.hybrid_links.eu-west-1", "to": FAR_REGION}])


def test_launcher_policy_is_declared_for_the_pool_and_exported(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    run = declared(stack)
    pool = desc.pool.name
    policy = one(run, "iam/policy:Policy", f"{pool}-burst-launcher")
    roles = [f"arn:mock:aws:iam/role:Role:{names.burst_name(desc, g)}-boot"
             for g in desc.burst_groups]
    assert roles
    assert _doc(policy.inputs["policy"]) == iam.burst_launch_policy(
        desc, MOCK_ACCOUNT, roles, f"arn:mock:aws:kms/key:Key:{pool}-key")
    assert policy.inputs["tags"] == names.tags(desc)
    # Operators attach it to the identity the controller's resume/suspend run with.
    assert run.outputs["burst_launcher_policy"] == f"arn:mock:{policy.type}:{policy.name}"


# --- the policy pack ------------------------------------------------------------------

@pytest.mark.parametrize(("change", "why"), [
    (lambda d: d["Statement"][0].update(Effect="Allow"), "allows instead of denying"),
    (lambda d: d["Statement"][0].update(Resource=d["Statement"][0]["Resource"][:1]),
     "covers the bucket, not its objects"),
    (lambda d: d["Statement"][0].update(Action="s3:GetObject"), "one action only"),
    (lambda d: d["Statement"][0].update(Principal={"AWS": "arn:aws:iam::1:root"}),
     "one principal only"),
    (lambda d: d["Statement"][0]["Condition"].update(Bool={"aws:SecureTransport": "true"}),
     "denies TLS instead"),
    (lambda d: d["Statement"][0]["Condition"].update(
        StringEquals={"aws:PrincipalAccount": "111122223333"}), "narrowed to one account"),
])
def test_a_tls_deny_that_does_not_cover_everything_is_reported(change: Any, why: str) -> None:
    def weaken(p: dict[str, Any]) -> None:
        doc = json.loads(p["policy"])
        change(doc)
        p["policy"] = json.dumps(doc)

    found = messages(violations(edit(recorded("lab"), ":BucketPolicy", "lab-datasets", weaken),
                                "lab"), TLS_ONLY)
    assert found == ["bucket lab-datasets-eu-west-1 has no bucket policy denying requests "
                     "without TLS (aws:SecureTransport false)"], why


def test_a_bucket_without_a_policy_is_reported_and_a_wildcard_deny_passes() -> None:
    found = messages(violations(drop(recorded("lab"), ":BucketPolicy", "lab-checkpoints"),
                                "lab"), TLS_ONLY)
    assert found == ["bucket lab-checkpoints-eu-west-1 has no bucket policy denying requests "
                     "without TLS (aws:SecureTransport false)"]

    def wildcard(p: dict[str, Any]) -> None:
        # A parsed document, one statement for every bucket, IfExists: still a TLS deny.
        p["policy"] = {"Statement": {"Effect": "Deny", "Principal": {"AWS": "*"},
                                     "Action": ["*"], "Resource": "arn:aws:s3:::*",
                                     "Condition": {"BoolIfExists": {
                                         "aws:SecureTransport": False}}}}

    assert messages(violations(edit(recorded("lab"), ":BucketPolicy", "lab-checkpoints",
                                    wildcard), "lab"), TLS_ONLY) == []


# --- the tier copies' principal ---------------------------------------------------------

def test_the_tier_copies_get_their_buckets_alone_by_direction() -> None:
    """The controller's copies (roles/storage_sync) need no more than their buckets: read
    where a tier comes from the cloud, write (delete only where the sync deletes) where it
    goes there; the key through S3 alone."""
    desc = loader.load_stack("example", ROOT)
    doc = iam.tier_sync_policy(desc, "arn:key")
    assert doc is not None
    by_sid = {s["Sid"]: s for s in doc["Statement"]}
    datasets = f"arn:aws:s3:::{names.bucket_name(desc, 'datasets')}"
    checkpoints = f"arn:aws:s3:::{names.bucket_name(desc, 'checkpoints')}"
    assert by_sid["ListDatasets"]["Resource"] == datasets
    assert by_sid["CopyDatasets"] == {
        "Sid": "CopyDatasets", "Effect": "Allow", "Resource": f"{datasets}/*",
        "Action": ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"]}
    assert by_sid["CopyCheckpoints"]["Action"] == ["s3:GetObject"]  # from_cloud: read
    assert by_sid["CopyCheckpoints"]["Resource"] == f"{checkpoints}/*"
    assert by_sid["TierEncryption"]["Resource"] == ["arn:key"]
    assert by_sid["TierEncryption"]["Condition"]["StringEquals"]["kms:ViaService"] == \
        f"s3.{desc.pool.cloud_region}.amazonaws.com"
    actions = [a for s in doc["Statement"] for a in
               ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])]
    assert not any("*" in a for a in actions)
    assert "s3:DeleteObject" not in actions  # no declared sync deletes


def test_a_deleting_copy_may_delete_and_no_copy_declares_no_policy() -> None:
    raw = raw_stack("example")
    raw["storage_tiers"]["datasets"]["sync"]["delete"] = True
    doc = iam.tier_sync_policy(loader.parse(raw), "arn:key")
    assert doc is not None
    copy = next(s for s in doc["Statement"] if s["Sid"] == "CopyDatasets")
    assert "s3:DeleteObject" in copy["Action"]
    for tier in raw["storage_tiers"].values():
        tier.pop("sync", None)
    assert iam.tier_sync_policy(loader.parse(raw), "arn:key") is None


@pytest.mark.parametrize("stack", ["lab", "example"])
def test_the_tier_copies_policy_is_declared_and_exported(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    run = declared(stack)
    pool = desc.pool.name
    policy = one(run, "iam/policy:Policy", f"{pool}-tier-sync")
    assert _doc(policy.inputs["policy"]) == iam.tier_sync_policy(
        desc, f"arn:mock:aws:kms/key:Key:{pool}-key")
    assert policy.inputs["tags"] == names.tags(desc)
    # Operators attach it to the identity the controller's tier copies run with.
    assert run.outputs["tier_sync_policy"] == f"arn:mock:{policy.type}:{policy.name}"
