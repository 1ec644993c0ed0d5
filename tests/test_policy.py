"""Every policy: the shipped stacks pass, and a mutated program input or description
violates it with the expected message (mocks fixture: tests/_pulumi.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from gpupool.render.cloud import names
from gpupool.render.k8s_objects import POD_SECURITY_PREFIX, RBAC_API, ROLE_RULES
from gpupool.spec import loader
from policies import offline
from policies.catalog import GROUPS, POLICIES
from policies.cluster import reads_secrets
from policies.core import Level, Res, Stack
from policies.types import K8S_CLUSTER_ROLE_BINDING, K8S_ROLE
from tests._policy import add, drop, edit, messages, recorded, violations
from tests._pulumi import declared_mutated
from tests.conftest import ROOT


@pytest.mark.parametrize("stack", ["lab", "example"])
def test_shipped_stacks_pass_every_policy(stack: str) -> None:
    # A lab stack is told what its description weakens (tests/test_lab_controls.py), and
    # nothing else.
    found = [v for v in violations(recorded(stack), stack)
             if v.policy != "hygiene-lab-weakened-controls"]
    assert found == []


def test_policies_are_grouped_and_levelled() -> None:
    assert {p.group for p in POLICIES.values()} == set(GROUPS)
    assert {p.level for p in POLICIES.values()} == {Level.MANDATORY, Level.ADVISORY}
    assert all(p.description.endswith(".") for p in POLICIES.values())


def _ssh_rule(stack: str = "lab") -> str:
    pool = loader.load_stack(stack, ROOT).pool.name
    region = names.regions(loader.load_stack(stack, ROOT))[0]
    admin = loader.load_stack(stack, ROOT).network.admin_cidrs[0].replace("/", "_")
    return f"{pool}-{region}-training-in-{admin.replace('.', '-')}-tcp-22"


def _set_ingress(cidr: str) -> Callable[[dict[str, Any]], None]:
    return lambda p: p.update(cidrIpv4=cidr)


def _sse_aes(p: dict[str, Any]) -> None:
    p["rules"][0]["applyServerSideEncryptionByDefault"] = {"sseAlgorithm": "AES256"}


def _no_tls_deny(p: dict[str, Any]) -> None:
    doc = json.loads(p["policy"])
    doc["Statement"] = [s for s in doc["Statement"] if s["Sid"] != "DenyWithoutTLS"]
    p["policy"] = json.dumps(doc)


def _no_checkpoint_writes(p: dict[str, Any]) -> None:
    doc = json.loads(p["policy"])
    doc["Statement"] = [s for s in doc["Statement"] if "Checkpoints" not in s["Sid"]]
    p["policy"] = json.dumps(doc)


def _cq_nominal(p: dict[str, Any]) -> None:
    p["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = 999


def _subject(kind: str, name: str, namespace: str | None = None) -> dict[str, str]:
    if kind == "ServiceAccount":
        return {"kind": kind, "name": name, "namespace": namespace or ""}
    return {"kind": kind, "apiGroup": RBAC_API, "name": name}


def _also_bind(*subjects: dict[str, str]) -> Callable[[dict[str, Any]], None]:
    return lambda p: p["subjects"].extend(subjects)


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
    ("storage-bucket-tls-only", "lab",
     lambda s: edit(s, ":BucketPolicy", "lab-archive", _no_tls_deny),
     "bucket lab-archive-eu-west-1 has no bucket policy denying requests without TLS"),
    ("network-no-open-ingress", "lab",
     lambda s: edit(s, ":SecurityGroupIngressRule", _ssh_rule(), _set_ingress("0.0.0.0/0")),
     "ingress from 0.0.0.0/0 (the whole internet) to port 22"),
    ("network-declared-flows-only", "lab",
     lambda s: edit(s, ":SecurityGroupIngressRule", _ssh_rule(),
                    lambda p: p.update(fromPort=3306, toPort=3306)),
     "(tcp 3306) matches no declared flow"),
    ("network-declared-flows-only", "lab",
     lambda s: edit(s, ":SecurityGroupIngressRule", _ssh_rule(),
                    lambda p: p.update(fromPort=22, toPort=65535)),
     "opens the port range 22-65535, which no declared flow or service names"),
    ("network-management-from-admin-cidrs", "lab",
     lambda s: edit(s, ":SecurityGroupIngressRule", _ssh_rule(),
                    _set_ingress("192.168.7.0/24")),
     "management port 22 is reachable from 192.168.7.0/24, outside the admin CIDRs"),
    ("network-management-from-admin-cidrs", "lab",
     lambda s: edit(s, ":SecurityGroupIngressRule", _ssh_rule(),
                    lambda p: p.update(cidrIpv4="192.168.7.0/24", fromPort=1, toPort=1024)),
     "management port 22 is reachable from 192.168.7.0/24, outside the admin CIDRs"),
    ("network-burst-subnet-routes-to-controller", "lab",
     lambda s: edit(s, ":RouteTable", "lab-eu-west-1-private",
                    lambda p: p.update(routes=[r for r in p["routes"]
                                               if r["cidrBlock"] != "10.231.30.0/24"])),
     "burst subnet lab-eu-west-1-training-eu-west-1a has no route to the controller lab-ctl "
     "(10.231.30.10) or lab-ctl2 (10.231.30.20) through the hybrid link"),
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
    ("cluster-pod-security-restricted", "lab",
     lambda s: edit(s, "v1:Namespace", "namespace-nlp", lambda p: p["metadata"]["labels"].update(
         {POD_SECURITY_PREFIX + "enforce": "baseline"})),
     "team namespace nlp: pod-security.kubernetes.io/enforce is baseline, not restricted"),
    ("cluster-secrets-stay-in-namespace", "lab",
     lambda s: edit(s, ":RoleBinding", "rolebinding-vision-admin",
                    _also_bind(_subject("User", "erin"))),
     "RoleBinding vision/admin lets User erin, not of namespace vision, read its Secrets "
     "(ClusterRole admin)"),
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


def test_pod_security_labels_missing_or_unpinned() -> None:
    def strip(p: dict[str, Any]) -> None:
        labels = p["metadata"]["labels"]
        del labels[POD_SECURITY_PREFIX + "audit"]
        labels[POD_SECURITY_PREFIX + "enforce-version"] = "latest"

    s = edit(recorded("lab"), "v1:Namespace", "namespace-vision", strip)
    assert messages(violations(s, "lab"), "cluster-pod-security-restricted") == [
        "team namespace vision: pod-security.kubernetes.io/audit is unset, not restricted",
        "team namespace vision: pod-security.kubernetes.io/enforce-version is latest, not "
        "v1.33"]


def test_no_team_role_reads_secrets() -> None:
    assert not any(reads_secrets(rules) for rules in ROLE_RULES.values())
    assert reads_secrets([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["list"]}])
    assert not reads_secrets([{"apiGroups": [""], "resources": ["secrets"],
                               "verbs": ["create", "delete"]}])


def _cluster_binding(role: str, *subjects: dict[str, str]) -> Res:
    return Res(K8S_CLUSTER_ROLE_BINDING, f"clusterrolebinding-{role}", f"urn:crb:{role}",
               {"metadata": {"name": role},
                "roleRef": {"apiGroup": RBAC_API, "kind": "ClusterRole", "name": role},
                "subjects": list(subjects)})


def test_cluster_wide_bindings_of_team_subjects_or_secret_readers() -> None:
    s = add(recorded("lab"),
            _cluster_binding("view", _subject("User", "frank"),
                             _subject("ServiceAccount", "default", "nlp"),
                             _subject("Group", "ops")),
            _cluster_binding("edit", _subject("Group", "ops"),
                             _subject("ServiceAccount", "kueue", "kueue-system")))
    assert messages(violations(s, "lab"), "cluster-secrets-stay-in-namespace") == [
        "ClusterRoleBinding edit lets Group ops read Secrets in every namespace "
        "(ClusterRole edit)",
        "ClusterRoleBinding edit lets ServiceAccount kueue-system/kueue read Secrets in "
        "every namespace (ClusterRole edit)",
        "ClusterRoleBinding view binds ServiceAccount nlp/default of a team cluster-wide; "
        "bind team roles in the team's namespace",
        "ClusterRoleBinding view binds User frank of a team cluster-wide; bind team roles "
        "in the team's namespace"]


def test_a_team_role_reading_secrets_is_bound_only_in_its_namespace() -> None:
    def read_secrets(p: dict[str, Any]) -> None:
        p["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})

    base = edit(recorded("lab"), "v1:Role", "role-nlp-researcher", read_secrets)
    assert [r.type for r in base.resources if r.name == "role-nlp-researcher"] == [K8S_ROLE]
    assert messages(violations(base, "lab"), "cluster-secrets-stay-in-namespace") == []
    s = edit(base, ":RoleBinding", "rolebinding-nlp-researcher",
             _also_bind(_subject("User", "alice"), _subject("Group", "nlp"),
                        _subject("ServiceAccount", "default", "vision"),
                        _subject("ServiceAccount", "default", "nlp")))
    assert messages(violations(s, "lab"), "cluster-secrets-stay-in-namespace") == [
        f"RoleBinding nlp/researcher lets {who}, not of namespace nlp, read its Secrets "
        "(Role researcher)"
        for who in ("Group nlp", "ServiceAccount vision/default", "User alice")]


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
    assert messages(violations(secret, "lab"), "hygiene-no-plain-secrets") == []


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
                                        "hygiene-no-plain-secrets", "cluster-software-pinned",
                                        # tests/test_lab_controls.py
                                        "hygiene-lab-weakened-controls",
                                        # tests/test_cost.py
                                        "stack-cost-within-budget", "stack-cost-priced"}
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
