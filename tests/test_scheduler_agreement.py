"""Slurm and Kueue renderings of the same pool agree: quotas, class priorities and which
class may preempt which. Both are parsed back from what they render, not from the model."""

from __future__ import annotations

from collections import defaultdict

import pytest

from gpupool import k8s_objects, loader, slurm

STACKS = ["lab", "example"]


def kueue(desc):
    objs = k8s_objects.manifests(desc)
    return [o for o in objs if o["apiVersion"] == k8s_objects.KUEUE_API], objs


def slurm_partitions(desc):
    return slurm.records(slurm.slurm_conf(desc), "PartitionName")


@pytest.mark.parametrize("stack", STACKS)
def test_class_priorities_agree(stack):
    desc = loader.load_stack(stack)
    kobjs, _ = kueue(desc)
    wpc = {o["metadata"]["name"]: o["value"] for o in kobjs
           if o["kind"] == "WorkloadPriorityClass"}
    tiers = {name: int(p["PriorityTier"]) for name, p in slurm_partitions(desc).items()}
    qos = {q["name"]: q["Priority"] for q in slurm.accounting(desc)["qos"]}
    assert tiers == wpc == qos


@pytest.mark.parametrize("stack", STACKS)
def test_team_quotas_agree(stack):
    desc = loader.load_stack(stack)
    kobjs, objs = kueue(desc)
    k_nominal: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    model_of = {o["metadata"]["name"]: o["spec"]["nodeLabels"][k8s_objects.LABEL_MODEL]
                for o in kobjs if o["kind"] == "ResourceFlavor"}
    for cq in (o for o in kobjs if o["kind"] == "ClusterQueue"):
        for group in cq["spec"]["resourceGroups"]:
            for flavor in group["flavors"]:
                for res in flavor["resources"]:
                    k_nominal[cq["metadata"]["name"]][model_of[flavor["name"]]] += (
                        res["nominalQuota"])
    k_ceiling = {o["metadata"]["namespace"]: int(o["spec"]["hard"][
        f"requests.{k8s_objects.GPU_RESOURCE}"]) for o in objs if o["kind"] == "ResourceQuota"}
    acct = slurm.accounting(desc)
    s_fairshare = {a["name"]: a["Fairshare"] for a in acct["accounts"]}
    s_limits = {lim["account"]: dict(kv.split("=") for kv in lim["GrpTRES"].split(","))
                for lim in acct["limits"]}
    assert set(k_nominal) == set(s_limits) == set(desc.teams)
    for team, models in k_nominal.items():
        # Guaranteed GPUs: Kueue's nominal quota is Slurm's fairshare share.
        assert sum(models.values()) == s_fairshare[team]
        # Most GPUs held at once: Kueue's namespace ceiling is Slurm's GrpTRES.
        assert k_ceiling[team] == int(s_limits[team]["gres/gpu"])
        for model, nominal in models.items():
            assert nominal == desc.teams[team].quota[model]
            assert int(s_limits[team][f"gres/gpu:{model}"]) == (
                nominal + desc.teams[team].borrowing_limit.get(model, 0))


def slurm_preemption(desc):
    """partition_prio: a higher tier preempts a lower one unless it is PreemptMode=OFF."""
    parts = slurm_partitions(desc)
    return {(a, b) for a, pa in parts.items() for b, pb in parts.items()
            if int(pa["PriorityTier"]) > int(pb["PriorityTier"]) and pb["PreemptMode"] != "OFF"}


def kueue_preemption(desc):
    """Within a ClusterQueue, `LowerPriority` lets any workload preempt any workload of a
    lower WorkloadPriorityClass; `Never` lets none."""
    kobjs, _ = kueue(desc)
    prio = {o["metadata"]["name"]: o["value"] for o in kobjs
            if o["kind"] == "WorkloadPriorityClass"}
    policies = {cq["spec"]["preemption"]["withinClusterQueue"]
                for cq in kobjs if cq["kind"] == "ClusterQueue"}
    assert len(policies) == 1, policies
    if policies == {"Never"}:
        return set()
    return {(a, b) for a in prio for b in prio if prio[a] > prio[b]}


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.xfail(strict=True, reason=(
    "known disagreement, reported to the lead: Kueue's withinClusterQueue=LowerPriority "
    "lets interactive preempt training, which the description (training preemptible: "
    "false) and the Slurm rendering forbid"))
def test_preemption_agrees(stack):
    desc = loader.load_stack(stack)
    assert slurm_preemption(desc) == kueue_preemption(desc)


@pytest.mark.parametrize("stack", STACKS)
def test_preemption_of_preemptible_classes_agrees(stack):
    """Where both can express it: every pair Slurm allows, Kueue allows too."""
    desc = loader.load_stack(stack)
    assert slurm_preemption(desc) <= kueue_preemption(desc)


@pytest.mark.parametrize("stack", STACKS)
def test_kueue_relation_read_back_matches_its_renderer(stack):
    """The Kueue relation parsed here is the one k8s_objects documents."""
    desc = loader.load_stack(stack)
    assert kueue_preemption(desc) == k8s_objects.kueue_preemption_pairs(desc)
