"""One model of teams and task classes for every scheduler gpupool renders.

Slurm (accounts, QOS, partitions) and Kueue (ClusterQueues, WorkloadPriorityClasses) are
both rendered from these objects, never from the description directly, so the two can
be checked to agree. team_share is the one reader of a team's quota, borrowing limit and
MIG quota, and TeamShare.fair_share the one statement of the fair-share formula; every
renderer, Pulumi component and policy takes them from here
(tests/test_quota_owner.py holds them to it).
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


@dataclass(frozen=True)
class TeamShare:
    """One team's claim on the pool, as every scheduler grants it."""
    team: str
    quotas: tuple[TeamQuota, ...]  # one per GPU model it has a quota for, description order
    mig: tuple[tuple[str, int], ...]  # (MIG profile, instances), by profile

    @property
    def nominal(self) -> int:
        """GPUs guaranteed to the team, every model together."""
        return sum(q.nominal for q in self.quotas)

    @property
    def ceiling(self) -> int:
        """The most GPUs the team may hold at once: nominal plus borrowing, every model."""
        return sum(q.nominal + q.borrowing for q in self.quotas)

    @property
    def fair_share(self) -> int:
        """The team's weight when competing for idle GPUs: Slurm's fairshare shares of its
        account and Kueue's fairSharing weight of its ClusterQueues. Its nominal GPUs, at
        least 1 (a zero weight never wins in either scheduler)."""
        return max(1, self.nominal)

    def ceiling_of(self, model: str) -> int:
        """The most GPUs of one model the team may hold at once (0 without a quota)."""
        return sum(q.nominal + q.borrowing for q in self.quotas if q.model == model)

    def nominal_of(self, model: str) -> int:
        return sum(q.nominal for q in self.quotas if q.model == model)

    def borrowing_of(self, model: str) -> int:
        return sum(q.borrowing for q in self.quotas if q.model == model)


def team_share(desc: Description, team: str) -> TeamShare:
    """The one place a team's quotas are read from the description (a borrowing limit
    names only models the team has a quota for: rule borrowing-needs-quota)."""
    t = desc.teams[team]
    return TeamShare(team,
                     tuple(TeamQuota(team, model, gpus, t.borrowing_limit.get(model, 0))
                           for model, gpus in t.quota.items()),
                     tuple(sorted(t.mig_quota.items())))


def team_shares(desc: Description) -> dict[str, TeamShare]:
    """Every team's share, in description order."""
    return {team: team_share(desc, team) for team in desc.teams}


def team_quotas(desc: Description) -> list[TeamQuota]:
    """Every team's rows, teams and models in description order."""
    return [q for team in desc.teams for q in team_share(desc, team).quotas]


def preemption_pairs(desc: Description) -> set[tuple[str, str]]:
    """(preemptor, victim) class pairs the policy allows."""
    return preemption_wanted(desc)


def idle_reclaim_plan(desc: Description) -> dict[str, dict[str, int | str]]:
    """Per class that declares it, the idle-GPU reclaim the controller's timer applies
    (roles/idle_reclaim, gpupool/onhost/idle_reclaim.py), durations in seconds."""
    return {name: {"after_s": duration_seconds(r.after), "warn_s": duration_seconds(r.warn),
                   "action": r.action.value, "threshold_percent": r.threshold_percent}
            for name, c in desc.task_classes.items() if (r := c.idle_reclaim)}
