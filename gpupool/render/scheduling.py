"""One model of teams and task classes for every scheduler gpupool renders.

Slurm (accounts, QOS, partitions) and Kueue (ClusterQueues, WorkloadPriorityClasses) are
both rendered from these objects, never from the description directly, so the two can
be checked to agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.spec.facts import preemption_wanted
from gpupool.spec.model import Description, duration_seconds


@dataclass(frozen=True)
class ClassPolicy:
    name: str
    priority: int
    max_runtime_s: int
    preemptible: bool
    requeue: bool
    grace_s: int
    preempts: tuple[str, ...]


@dataclass(frozen=True)
class TeamQuota:
    team: str
    model: str
    nominal: int  # GPUs guaranteed to the team
    borrowing: int  # GPUs it may take beyond that from idle capacity


def class_policies(desc: Description) -> list[ClassPolicy]:
    """Task classes, highest priority first."""
    return sorted(
        (ClassPolicy(name, c.priority, duration_seconds(c.max_runtime), c.preemptible,
                     c.requeue, duration_seconds(c.grace_time), tuple(c.preempts))
         for name, c in desc.task_classes.items()),
        key=lambda c: -c.priority)


def team_quotas(desc: Description) -> list[TeamQuota]:
    return [TeamQuota(team, model, gpus, t.borrowing_limit.get(model, 0))
            for team, t in desc.teams.items() for model, gpus in t.quota.items()]


def preemption_pairs(desc: Description) -> set[tuple[str, str]]:
    """(preemptor, victim) class pairs the policy allows."""
    return preemption_wanted(desc)


def idle_reclaim_plan(desc: Description) -> dict[str, dict[str, int | str]]:
    """Per class that declares it, the idle-GPU reclaim the controller's timer applies
    (roles/idle_reclaim, gpupool/onhost/idle_reclaim.py), durations in seconds."""
    return {name: {"after_s": duration_seconds(r.after), "warn_s": duration_seconds(r.warn),
                   "action": r.action.value, "threshold_percent": r.threshold_percent}
            for name, c in desc.task_classes.items() if (r := c.idle_reclaim)}
