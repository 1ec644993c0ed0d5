"""Slurm and Kueue renderings of the same pool agree: quotas, class priorities and which
class may preempt which. Both are parsed back from what they render, not from the model."""

from __future__ import annotations

from collections import defaultdict

import pytest

from gpupool.render import k8s_objects, node_labels, scheduling, slurm
from gpupool.spec import loader

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


def team_read_back(desc):
    """Each team as both renderings state it: Kueue's nominal GPUs per model (ClusterQueues
    through their flavors), fairSharing weights and namespace ceiling; Slurm's fairshare
    shares and GrpTRES of its account."""
    kobjs, objs = kueue(desc)
    k_nominal: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    k_weight: dict[str, set[int]] = defaultdict(set)
    model_of = {o["metadata"]["name"]: o["spec"]["nodeLabels"][node_labels.LABEL_MODEL]
                for o in kobjs if o["kind"] == "ResourceFlavor"}
    for cq in (o for o in kobjs if o["kind"] == "ClusterQueue"):
        team = cq["metadata"]["name"].removesuffix("-preemptible")
        k_weight[team].add(cq["spec"]["fairSharing"]["weight"])
        for group in cq["spec"]["resourceGroups"]:
            for flavor in group["flavors"]:
                for res in flavor["resources"]:
                    k_nominal[team][model_of[flavor["name"]]] += res["nominalQuota"]
    k_ceiling = {o["metadata"]["namespace"]: int(o["spec"]["hard"][
        f"requests.{k8s_objects.GPU_RESOURCE}"]) for o in objs if o["kind"] == "ResourceQuota"}
    acct = slurm.accounting(desc)
    s_fairshare = {a["name"]: a["Fairshare"] for a in acct["accounts"]}
    s_limits = {lim["account"]: dict(kv.split("=") for kv in lim["GrpTRES"].split(","))
                for lim in acct["limits"]}
    return k_nominal, k_weight, k_ceiling, s_fairshare, s_limits


@pytest.mark.parametrize("stack", STACKS)
def test_team_quotas_agree(stack):
    desc = loader.load_stack(stack)
    k_nominal, _, k_ceiling, s_fairshare, s_limits = team_read_back(desc)
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


@pytest.mark.parametrize("stack", loader.stacks())
def test_each_teams_share_agrees(stack):
    """Issue 55: every shipped stack's Kueue objects and Slurm accounts give each team the
    share scheduling.team_share states: one fair-share weight on all its ClusterQueues
    equal to its account's fairshare shares, its nominal GPUs per model, its ceiling
    (Slurm's gres/gpu adds the MIG instances its MIG quota allows) and per-model caps."""
    desc = loader.load_stack(stack)
    shares = scheduling.team_shares(desc)
    k_nominal, k_weight, k_ceiling, s_fairshare, s_limits = team_read_back(desc)
    assert set(shares) == set(k_weight) == set(s_fairshare) == set(k_ceiling) == set(desc.teams)
    for team, share in shares.items():
        assert k_weight[team] == {s_fairshare[team]} == {share.fair_share}, team
        assert share.fair_share == max(1, sum(k_nominal[team].values())), team
        assert dict(k_nominal[team]) == {q.model: q.nominal for q in share.quotas}, team
        assert k_ceiling[team] == share.ceiling, team
        assert int(s_limits[team]["gres/gpu"]) == share.ceiling + sum(n for _, n in share.mig)
        for q in share.quotas:
            assert int(s_limits[team][f"gres/gpu:{q.model}"]) == q.nominal + q.borrowing


def slurm_preemption(desc):
    """partition_prio: a higher tier preempts a lower one unless it is PreemptMode=OFF."""
    parts = slurm_partitions(desc)
    return {(a, b) for a, pa in parts.items() for b, pb in parts.items()
            if int(pa["PriorityTier"]) > int(pb["PriorityTier"]) and pb["PreemptMode"] != "OFF"}


def kueue_preemption(desc):
    """Read back from the rendered queues: a class preempts another when its ClusterQueue
    preempts inside itself by priority (withinClusterQueue), or reclaims from the other's
    queue, which holds nothing of its own (nominal 0: everything it runs is borrowed)."""
    kobjs, _ = kueue(desc)
    prio = {o["metadata"]["name"]: o["value"] for o in kobjs
            if o["kind"] == "WorkloadPriorityClass"}
    cqs = {o["metadata"]["name"]: o["spec"] for o in kobjs if o["kind"] == "ClusterQueue"}
    lqs = [o for o in kobjs if o["kind"] == "LocalQueue"]
    pairs = set()
    for a in lqs:
        for b in lqs:
            qa, qb = cqs[a["spec"]["clusterQueue"]], cqs[b["spec"]["clusterQueue"]]
            ca, cb = a["metadata"]["name"], b["metadata"]["name"]
            within = (qa is qb and qa["preemption"]["withinClusterQueue"] == "LowerPriority"
                      and prio[ca] > prio[cb])
            borrowed_only = all(r["nominalQuota"] == 0 for g in qb["resourceGroups"]
                                for f in g["flavors"] for r in f["resources"])
            reclaim = (qa is not qb and qa["preemption"]["reclaimWithinCohort"] == "Any"
                       and borrowed_only)
            if within or reclaim:
                pairs.add((ca, cb))
    return pairs


@pytest.mark.parametrize("stack", STACKS)
def test_preemption_agrees(stack):
    desc = loader.load_stack(stack)
    assert slurm_preemption(desc) == kueue_preemption(desc)


@pytest.mark.parametrize("stack", STACKS)
def test_kueue_relation_read_back_matches_its_renderer(stack):
    """The Kueue relation parsed here is the one k8s_objects documents."""
    desc = loader.load_stack(stack)
    assert kueue_preemption(desc) == k8s_objects.kueue_preemption_pairs(desc)
