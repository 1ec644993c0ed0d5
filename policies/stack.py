"""Whole-stack checks: properties no single resource shows."""

from __future__ import annotations

from collections.abc import Iterator

from gpupool.render import cost
from gpupool.render.scheduling import class_policies
from gpupool.spec.model import Description
from policies.core import Level, Stack, by_tag, stack_policy
from policies.types import (
    AWS_ASG,
    AWS_LAUNCH_TEMPLATE,
    K8S_NAMESPACE,
    K8S_PRIORITY,
    KUEUE_CLUSTER_QUEUE,
    KUEUE_LOCAL_QUEUE,
    KUEUE_WORKLOAD_PRIORITY,
)


def _names(stack: Stack, type_: str) -> dict[str, dict]:
    return {(r.props.get("metadata") or {}).get("name"): r.props for r in stack.of_type(type_)}


@stack_policy("stack-teams-have-queues", "stack", Level.MANDATORY,
              "Every team has a namespace, a ClusterQueue in the pool's one cohort and, "
              "for every task class, a LocalQueue that points at one of its queues.")
def teams_queues(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    namespaces = _names(stack, K8S_NAMESPACE)
    queues = _names(stack, KUEUE_CLUSTER_QUEUE)
    cohorts = {(q.get("spec") or {}).get("cohortName") for q in queues.values()}
    if len(cohorts) > 1:
        yield None, f"ClusterQueues are split over cohorts {sorted(map(str, cohorts))}"
    for team in desc.teams:
        if team not in namespaces:
            yield None, f"team {team} has no namespace"
        if team not in queues:
            yield None, f"team {team} has no ClusterQueue"
        local = {(r.props.get("metadata") or {}).get("name"):
                 (r.props.get("spec") or {}).get("clusterQueue")
                 for r in stack.of_type(KUEUE_LOCAL_QUEUE)
                 if (r.props.get("metadata") or {}).get("namespace") == team}
        for task_class in desc.task_classes:
            if local.get(task_class) not in queues:
                yield None, f"team {team} has no LocalQueue for class {task_class}"


@stack_policy("stack-priorities-agree", "stack", Level.MANDATORY,
              "PriorityClasses and WorkloadPriorityClasses carry the task classes' priorities.")
def priorities(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    wanted = {c.name: c.priority for c in class_policies(desc)}
    for type_, what in ((K8S_PRIORITY, "PriorityClass"), (KUEUE_WORKLOAD_PRIORITY,
                                                       "WorkloadPriorityClass")):
        got = {n: p.get("value") for n, p in _names(stack, type_).items()}
        for name, value in wanted.items():
            if got.get(name) != value:
                yield None, (f"{what} {name} has value {got.get(name)}; task class {name} "
                             f"has priority {value}")


@stack_policy("stack-burst-groups-declared", "stack", Level.MANDATORY,
              "Every burst group has a launch template and an autoscaling group sized as "
              "declared, starting from zero.")
def burst_declared(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    for name, g in desc.burst_groups.items():
        if not by_tag(stack.of_type(AWS_LAUNCH_TEMPLATE), "burst-group", name):
            yield None, f"burst group {name} has no launch template"
        asgs = by_tag(stack.of_type(AWS_ASG), "burst-group", name)
        if not asgs:
            yield None, f"burst group {name} has no autoscaling group"
        for asg in asgs:
            size = (asg.props.get("minSize"), asg.props.get("maxSize"))
            if size != (g.min_nodes, g.max_nodes):
                yield asg.urn, (f"burst group {name} scales {size[0]}..{size[1]}, declared "
                                f"{g.min_nodes}..{g.max_nodes}")


def _ceiling(stack: Stack, desc: Description) -> cost.Ceiling:
    return cost.ceiling(((r.type, r.name, r.props) for r in stack.resources), desc)


@stack_policy("stack-cost-within-budget", "stack", Level.MANDATORY,
              "Where the description declares pool.monthly_budget_usd, the plan's monthly cost "
              "ceiling (instances at max nodes all month, file systems, buckets at their "
              "tiers' sizes, NAT, endpoints, links; gpupool/data/prices) is within it, and "
              "every instance group, file system and bucket has a price.")
def cost_within_budget(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    budget = desc.pool.monthly_budget_usd
    if budget is None:
        return
    ceiling = _ceiling(stack, desc)
    if ceiling.total > budget:
        kinds = ", ".join(f"{k} {v:,.0f}" for k, v in ceiling.per_kind.items() if v)
        yield None, (f"the plan's monthly cost ceiling is {ceiling.total:,.2f} USD ({kinds}), "
                     f"above pool.monthly_budget_usd {budget:,}: lower max_nodes or tier "
                     "sizes, keep tiers on-prem, or raise the budget")
    for line in ceiling.open_ended:
        yield None, (f"{line.kind} {line.resource} ({line.region}: {line.what}) has no price "
                     f"in gpupool/data/prices (read {ceiling.read}): the ceiling cannot be "
                     f"held to pool.monthly_budget_usd {budget:,}; add the published rate "
                     "with its source")


@stack_policy("stack-cost-priced", "stack", Level.ADVISORY,
              "Where a monthly budget is declared, the hourly fees the price table has no "
              "rate for (NAT gateways, interface endpoints, hybrid links) are named: the "
              "ceiling leaves them out.")
def cost_priced(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    if desc.pool.monthly_budget_usd is None:
        return
    ceiling = _ceiling(stack, desc)
    for line in ceiling.unpriced:
        if line not in ceiling.open_ended:
            yield None, (f"{line.kind} {line.resource} ({line.region}: {line.what}) has no "
                         "price in gpupool/data/prices: the cost ceiling leaves it out")
