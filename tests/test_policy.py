"""Every policy: the shipped stacks pass, and a mutated program input or description
violates it with the expected message (mocks fixture: tests/_pulumi.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from gpupool.render import cloud
from gpupool.spec import loader
from policies import offline
from policies.catalog import GROUPS, POLICIES
from policies.core import Level, Stack
from tests._policy import drop, edit, messages, recorded, violations
from tests._pulumi import declared_mutated
from tests.conftest import ROOT


@pytest.mark.parametrize("stack", ["lab", "example"])
def test_shipped_stacks_pass_every_policy(stack: str) -> None:
    assert violations(recorded(stack), stack) == []


def test_policies_are_grouped_and_levelled() -> None:
    assert {p.group for p in POLICIES.values()} == set(GROUPS)
    assert {p.level for p in POLICIES.values()} == {Level.MANDATORY, Level.ADVISORY}
    assert all(p.description.endswith(".") for p in POLICIES.values())


def _ssh_rule(stack: str = "lab") -> str:
    pool = loader.load_stack(stack, ROOT).pool.name
    region = cloud.regions(loader.load_stack(stack, ROOT))[0]
    admin = loader.load_stack(stack, ROOT).network.admin_cidrs[0].replace("/", "_")
    return f"{pool}-{region}-training-in-{admin.replace('.', '-')}-tcp-22"


def _set_ingress(cidr: str) -> Callable[[dict[str, Any]], None]:
    return lambda p: p.update(cidrIpv4=cidr)


def _sse_aes(p: dict[str, Any]) -> None:
    p["rules"][0]["applyServerSideEncryptionByDefault"] = {"sseAlgorithm": "AES256"}


def _no_checkpoint_writes(p: dict[str, Any]) -> None:
    doc = json.loads(p["policy"])
    doc["Statement"] = [s for s in doc["Statement"] if "Checkpoints" not in s["Sid"]]
    p["policy"] = json.dumps(doc)


def _cq_nominal(p: dict[str, Any]) -> None:
    p["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = 999


def _lifecycle(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    return lambda p: change(p["rules"][0])


# (policy, stack, how the program input is broken, expected message fragment)
CASES: list[tuple[str, str, Callable[[Stack], Stack], str]] = [
    ("storage-encryption-at-rest", "lab",
     lambda s: edit(s, ":BucketServerSideEncryptionConfiguration", "lab-datasets", _sse_aes),
     "encrypts with AES256, not SSE-KMS"),
    ("storage-public-access-blocked", "lab",
     lambda s: edit(s, ":BucketPublicAccessBlock", "lab-archive",
                    lambda p: p.update(blockPublicPolicy=False)),
     "does not block public access: blockPublicPolicy not true"),
    ("storage-bucket-guards", "lab",
     lambda s: drop(s, ":BucketServerSideEncryptionConfiguration", "lab-archive"),
     "bucket lab-archive-eu-west-1 has no default encryption"),
    ("storage-retention-within-bounds", "lab",
     lambda s: edit(s, ":BucketLifecycleConfiguration", "lab-datasets",
                    _lifecycle(lambda r: r.update(expiration={"days": 9999}))),
     "keeps objects 9999 days, beyond tier datasets's retention of 365 days"),
    ("storage-abort-multipart", "lab",
     lambda s: edit(s, ":BucketLifecycleConfiguration", "lab-archive",
                    _lifecycle(lambda r: r.pop("abortIncompleteMultipartUpload"))),
     "keeps incomplete multipart uploads forever"),
    ("network-no-open-ingress", "lab",
     lambda s: edit(s, ":SecurityGroupIngressRule", _ssh_rule(), _set_ingress("0.0.0.0/0")),
     "ingress from 0.0.0.0/0 (the whole internet) to port 22"),
    ("network-declared-flows-only", "lab",
     lambda s: edit(s, ":SecurityGroupIngressRule", _ssh_rule(),
                    lambda p: p.update(fromPort=3306, toPort=3306)),
     "(tcp 3306) matches no declared flow"),
    ("network-management-from-admin-cidrs", "lab",
     lambda s: edit(s, ":SecurityGroupIngressRule", _ssh_rule(),
                    _set_ingress("192.168.7.0/24")),
     "management port 22 is reachable from 192.168.7.0/24, outside the admin CIDRs"),
    ("network-burst-subnet-routes-to-controller", "lab",
     lambda s: edit(s, ":RouteTable", "lab-eu-west-1-private",
                    lambda p: p.update(routes=[r for r in p["routes"]
                                               if r["cidrBlock"] != "10.231.30.0/24"])),
     "burst subnet lab-eu-west-1-training-eu-west-1a has no route to the controller lab-ctl "
     "(10.231.30.10) through the hybrid link"),
    ("network-no-public-ips", "lab",
     lambda s: edit(s, ":Subnet", "lab-eu-west-1-training-eu-west-1a",
                    lambda p: p.update(mapPublicIpOnLaunch=True)),
     "maps a public IP to every instance launched in it"),
    ("compute-imdsv2-required", "lab",
     lambda s: edit(s, ":LaunchTemplate", "lab-l4-burst",
                    lambda p: p["metadataOptions"].update(httpTokens="optional")),
     "allows IMDSv1 (httpTokens=optional)"),
    ("compute-encrypted-volumes", "lab",
     lambda s: edit(s, ":LaunchTemplate", "lab-l4-burst",
                    lambda p: p["blockDeviceMappings"][0]["ebs"].update(encrypted="false")),
     "volume /dev/xvda is not encrypted"),
    ("compute-efa-in-cluster-placement", "example",
     lambda s: edit(s, "autoscaling/group:Group", "prod-h100-burst",
                    lambda p: p.pop("placementGroup")),
     "burst group h100-burst uses EFA but is not in a cluster placement group"),
    ("compute-spot-needs-checkpoints", "lab",
     lambda s: edit(s, "iam/policy:Policy", "lab-l4-burst-node", _no_checkpoint_writes),
     "spot group l4-burst runs without checkpoints: its nodes may not write"),
    ("compute-burst-image-prebuilt", "lab",
     lambda s: drop(edit(s, ":LaunchTemplate", "lab-l4-burst",
                         lambda p: p.update(imageId="ami-0bare0public0ami0")),
                    "imagebuilder/image:Image", "lab-eu-west-1-burst-image"),
     "burst group l4-burst boots ami-0bare0public0ami0, which is no pre-built burst image"),
    ("compute-spot-rebalance", "lab",
     lambda s: edit(s, "autoscaling/group:Group", "lab-l4-burst",
                    lambda p: p.update(capacityRebalance=False)),
     "spot group does not use capacity rebalancing"),
    ("cluster-namespace-guards", "lab",
     lambda s: drop(s, "v1:LimitRange", "limitrange-nlp-defaults"),
     "team namespace nlp has no LimitRange"),
    ("cluster-quota-within-capacity", "lab",
     lambda s: edit(s, ":ClusterQueue", "clusterqueue-vision", _cq_nominal),
     "flavor l4-on-prem: nominal quotas add up to"),
    ("hygiene-cost-tags", "lab",
     lambda s: edit(s, ":Vpc", "lab-eu-west-1", lambda p: p["tags"].pop("cost-centre")),
     "missing tags: cost-centre"),
    ("stack-teams-have-queues", "lab",
     lambda s: drop(s, ":LocalQueue", "localqueue-nlp-training"),
     "team nlp has no LocalQueue for class training"),
    ("stack-priorities-agree", "lab",
     lambda s: edit(s, ":WorkloadPriorityClass", "workloadpriorityclass-training",
                    lambda p: p.update(value=1)),
     "WorkloadPriorityClass training has value 1; task class training has priority 500"),
    ("stack-burst-groups-declared", "lab",
     lambda s: edit(s, "autoscaling/group:Group", "lab-l4-burst",
                    lambda p: p.update(maxSize=50)),
     "burst group l4-burst scales 0..50, declared 0..2"),
]


@pytest.mark.parametrize(("policy", "stack", "mutate", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_mutated_program_input_violates(policy: str, stack: str,
                                        mutate: Callable[[Stack], Stack],
                                        expected: str) -> None:
    found = violations(mutate(recorded(stack)), stack)
    assert any(expected in m for m in messages(found, policy)), found
    level = POLICIES[policy].level.value
    assert {v.level for v in found if v.policy == policy} == {level}


def test_cost_tags_name_the_teams_cost_centre() -> None:
    s = edit(recorded("lab"), "v1:Namespace", "namespace-vision",
             lambda p: p["metadata"]["labels"].update({"gpupool.io/cost-centre": "cc-nlp"}))
    assert messages(violations(s, "lab"), "hygiene-cost-tags") == [
        "cost-centre tag cc-nlp is not vision's cost centre cc-vision"]


def test_unversioned_checkpoints_from_the_description() -> None:
    """The description validator allows an unversioned checkpoints tier; the policy does not."""
    run = declared_mutated("lab", [{"set": "storage_tiers.checkpoints.versioning",
                                    "value": False}])
    desc = loader.parse(_lab_with(("storage_tiers", "checkpoints", "versioning"), False))
    found = offline.check(run, desc)
    assert messages(found, "storage-checkpoints-versioned") == [
        "checkpoints bucket lab-checkpoints-eu-west-1 is not versioned: an overwritten or "
        "deleted checkpoint cannot be recovered"]


def _lab_with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    from tests.conftest import raw_stack  # noqa: PLC0415

    data = raw_stack("lab")
    target = data
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    return data


def test_plain_secret_config_is_rejected_and_secret_config_passes() -> None:
    base = recorded("lab")
    plain = Stack(base.resources, {**base.config, "gpupool:slackToken": ("xoxb-123", False)})
    assert messages(violations(plain, "lab"), "hygiene-no-plain-secrets") == [
        "config gpupool:slackToken looks like a secret but is plain text; set it with "
        "`pulumi config set --secret`"]
    key = Stack(base.resources, {**base.config, "gpupool:note": ("AKIA" + "A" * 16, False)})
    assert messages(violations(key, "lab"), "hygiene-no-plain-secrets") == [
        "config gpupool:note holds a credential in plain text; make it a secret"]
    secret = Stack(base.resources, {**base.config, "gpupool:slackToken": ("v1:abc", True)})
    assert violations(secret, "lab") == []


def test_software_lock_pinned_and_not_blocklisted() -> None:
    """The validator rejects both first (pinned-version, version-not-blocklisted); the
    policy checks the same on a description built past it."""
    for value, rule in (("latest", "pinned-version"), ("535.104.05", "version-not-blocklisted")):
        with pytest.raises(loader.DescriptionError) as exc:
            loader.parse(_lab_with(("software", "nvidia_driver"), value))
        assert rule in {p.rule for p in exc.value.problems}
    lab = loader.load_stack("lab", ROOT)
    for value, expected in (("latest", "software.nvidia_driver is 'latest', not one exact "
                                       "version"),
                            ("535.104.05", "software.nvidia_driver 535.104.05 is blocklisted")):
        desc = lab.model_copy(update={"software": lab.software.model_copy(
            update={"nvidia_driver": value})})
        assert messages(violations(recorded("lab"), desc), "cluster-software-pinned") == [
            expected]


def test_every_policy_has_a_violation_test() -> None:
    covered = {c[0] for c in CASES} | {"storage-checkpoints-versioned",
                                        "hygiene-no-plain-secrets", "cluster-software-pinned"}
    assert covered == set(POLICIES)


def _burst_subnets(stack: Stack) -> list[str]:
    return [r.name for r in stack.of_type(":Subnet")]


@pytest.mark.parametrize("stack", ["lab", "example"])
def test_every_burst_subnet_routes_the_controller_over_the_link(stack: str) -> None:
    rec = recorded(stack)
    assert _burst_subnets(rec)
    assert messages(violations(rec, stack), "network-burst-subnet-routes-to-controller") == []
    # Without any on-prem route every subnet is reported, each by name.
    table = next(r.name for r in rec.of_type(":RouteTable") if r.name.endswith("-private"))
    found = messages(violations(edit(rec, ":RouteTable", table,
                                     lambda p: p.update(routes=[])), stack),
                     "network-burst-subnet-routes-to-controller")
    assert len(found) == len(_burst_subnets(rec))


def test_a_route_without_a_link_target_or_an_unassociated_subnet_is_reported() -> None:
    rec = recorded("lab")

    def to_nowhere(p: dict[str, Any]) -> None:
        for r in p["routes"]:
            r.pop("gatewayId", None)

    found = messages(violations(edit(rec, ":RouteTable", "lab-eu-west-1-private", to_nowhere),
                                "lab"), "network-burst-subnet-routes-to-controller")
    assert found and all("has no route to the controller lab-ctl" in m for m in found)
    found = messages(violations(drop(rec, ":RouteTableAssociation",
                                     "lab-eu-west-1-management-eu-west-1b"), "lab"),
                     "network-burst-subnet-routes-to-controller")
    assert found == ["burst subnet lab-eu-west-1-management-eu-west-1b is not associated with "
                     "its route table lab-eu-west-1-private"]
    found = messages(violations(edit(rec, ":Subnet", "lab-eu-west-1-storage-eu-west-1a",
                                     lambda p: p["tags"].pop("route-table")), "lab"),
                     "network-burst-subnet-routes-to-controller")
    assert found == ["burst subnet lab-eu-west-1-storage-eu-west-1a names no declared route "
                     "table (route-table tag None)"]


def test_launch_template_asking_for_a_public_ip_is_reported() -> None:
    def public(p: dict[str, Any]) -> None:
        p["networkInterfaces"][0]["associatePublicIpAddress"] = "true"

    found = messages(violations(edit(recorded("lab"), ":LaunchTemplate", "lab-l4-burst",
                                     public), "lab"), "network-no-public-ips")
    assert found == ["network interface 0 asks for a public IP (associatePublicIpAddress)"]
