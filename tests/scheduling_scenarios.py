"""Scheduling scenarios on the lab pool, each stated once, and what Slurm and Kueue do.

Each scenario is jobs already running (started in order) and one arriving job; the
outcome is whether it starts, which running classes it preempts and whether it lands on
burst capacity. `expect` is the policy gpupool renders; where Kueue cannot express it,
`kueue` holds what the rendered Kueue objects do instead and `limitation` names the
README paragraph ("Kueue and Slurm") that says why.

Two readers evaluate the table from the rendered configuration, never from the model:
slurm_outcome() from slurm.conf's node and partition records and the accounting limits
(the rules of slurm.conf(5) PreemptType=preempt/partition_prio and association GrpTRES),
kueue_outcome() from the rendered Kueue objects by Kueue v0.19's documented admission
rules (kueue.sigs.k8s.io/docs/concepts/cluster_queue/: nominalQuota and borrowingLimit
within a cohort, flavorFungibility, preemption reclaimWithinCohort/withinClusterQueue;
/docs/concepts/resource_flavor/: nodeLabels against a pod's nodeSelector, nodeTaints and
tolerations). tests/integration/test_slurm_lab.py replays each scenario on the lab's real
Slurm and checks slurmctld's answer against slurm_outcome(). Jobs take whole nodes (the
lab's GPU nodes carry 4 L4 each).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpupool.render import k8s_objects, slurm
from gpupool.render.node_labels import LABEL_CAPACITY, ONPREM
from gpupool.spec.model import Description


@dataclass(frozen=True)
class Job:
    team: str
    task_class: str
    nodes: int  # whole GPU nodes


@dataclass(frozen=True)
class Outcome:
    starts: bool
    preempts: tuple[str, ...] = ()  # classes of running jobs preempted to start it
    on_burst: bool = False  # starts on burst (cloud) capacity


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    running: tuple[Job, ...]
    arriving: Job
    expect: Outcome
    kueue: Outcome | None = None  # what Kueue does where it differs from expect
    limitation: str = ""
    max_runtime_s: int | None = None  # the arriving job's limit, in both schedulers


WAITS = Outcome(starts=False)

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("borrow-deferred", "A team at its quota borrows idle on-prem GPUs for deferred "
             "work.", (Job("vision", "training", 2),), Job("vision", "deferred", 1),
             Outcome(True)),
    Scenario("borrow-guaranteed", "A team at its quota asks for more training GPUs while "
             "GPUs are idle and its borrowing limit allows.",
             (Job("vision", "training", 2),), Job("vision", "training", 1),
             Outcome(True), kueue=WAITS,
             limitation="Only preemptible classes borrow in Kueue"),
    Scenario("interactive-on-full-pool", "Interactive work arrives while deferred work of "
             "another team fills every on-prem node.", (Job("nlp", "deferred", 3),),
             Job("vision", "interactive", 1), Outcome(True, ("deferred",))),
    Scenario("training-against-training", "Training arrives while training fills the "
             "on-prem nodes: it never preempts training; its quota lies partly on burst.",
             (Job("vision", "training", 2), Job("nlp", "training", 1)),
             Job("nlp", "training", 1), Outcome(True, on_burst=True)),
    Scenario("interactive-stays-on-prem", "Interactive work never takes burst capacity, "
             "so it waits while training fills the on-prem nodes.",
             (Job("vision", "training", 2), Job("nlp", "training", 1)),
             Job("nlp", "interactive", 1), WAITS),
    Scenario("burst-only-flavor", "Deferred work that only fits on burst capacity starts "
             "there (spot: tainted, tolerated by Kueue's flavor).",
             (Job("vision", "training", 2), Job("nlp", "training", 1)),
             Job("nlp", "deferred", 1), Outcome(True, on_burst=True)),
    Scenario("deferred-at-max-runtime", "A deferred job is stopped at its class's "
             "maximum run time, not requeued.", (), Job("vision", "deferred", 1),
             Outcome(True), max_runtime_s=86400),
)


def _seconds(limit: str) -> int:
    days, _, rest = limit.partition("-")
    h, m, s = (int(x) for x in rest.split(":"))
    return int(days) * 86400 + h * 3600 + m * 60 + s


def expand(hostlist: str) -> list[str]:
    """Slurm's compressed host list back to names: gpu[1-3],x -> gpu1,gpu2,gpu3,x."""
    out = []
    for prefix, inner, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,]+)", hostlist):
        if plain:
            out.append(plain)
            continue
        for span in inner.split(","):
            a, _, b = span.partition("-")
            out += [f"{prefix}{i}" for i in range(int(a), int(b or a) + 1)]
    return out


class SlurmPool:
    """The rendered Slurm policy, read back from slurm.conf and the accounting plan."""

    def __init__(self, desc: Description) -> None:
        conf = slurm.slurm_conf(desc)
        self.nodes = slurm.records(conf, "NodeName")
        self.parts = slurm.records(conf, "PartitionName")
        self.members = {p: expand(r["Nodes"]) for p, r in self.parts.items()}
        acct = slurm.accounting(desc)
        self.limits = {lim["account"]: dict(kv.split("=") for kv in lim["GrpTRES"].split(","))
                       for lim in acct["limits"]}
        self.qos_wall = {q["name"]: _seconds(q["MaxWall"]) for q in acct["qos"]}
        self.running: list[tuple[Job, list[str]]] = []

    def gpus(self, node: str) -> int:
        return int(self.nodes[node]["Gres"].rsplit(":", 1)[1])

    def cloud(self, node: str) -> bool:
        return self.nodes[node]["State"] == "CLOUD"

    def busy(self) -> set[str]:
        return {n for _, nodes in self.running for n in nodes}

    def free(self, job: Job, exclude: set[str]) -> list[str]:
        # Lower Weight first: on-prem (1) before cloud (1000), which power up on demand.
        return sorted((n for n in self.members[job.task_class] if n not in exclude),
                      key=lambda n: (int(self.nodes[n]["Weight"]), n))

    def over_limit(self, job: Job, nodes: list[str]) -> bool:
        model = self.nodes[nodes[0]]["Gres"].split(":")[1] if nodes else ""
        used = sum(self.gpus(n) for j, ns in self.running if j.team == job.team for n in ns)
        want = used + sum(self.gpus(n) for n in nodes)
        lim = self.limits[job.team]
        return want > int(lim["gres/gpu"]) or want > int(lim.get(f"gres/gpu:{model}", want))

    def submit(self, job: Job) -> Outcome:
        free = self.free(job, self.busy())[:job.nodes]
        if len(free) == job.nodes:
            # Association limits hold a job pending; they never preempt.
            if self.over_limit(job, free):
                return WAITS
            self.running.append((job, free))
            return Outcome(True, on_burst=any(self.cloud(n) for n in free))
        tier = int(self.parts[job.task_class]["PriorityTier"])
        victims = sorted(
            ((j, ns) for j, ns in self.running
             if int(self.parts[j.task_class]["PriorityTier"]) < tier
             and self.parts[j.task_class]["PreemptMode"] != "OFF"
             and set(ns) <= set(self.members[job.task_class])),
            key=lambda v: int(self.parts[v[0].task_class]["PriorityTier"]))
        taken: list[tuple[Job, list[str]]] = []
        for v in victims:
            if len(self.free(job, self.busy() - {n for _, ns in taken for n in ns})) >= job.nodes:
                break
            taken.append(v)
        freed = self.free(job, self.busy() - {n for _, ns in taken for n in ns})[:job.nodes]
        if len(freed) < job.nodes:
            return WAITS
        before = self.running
        self.running = [r for r in self.running if r not in taken]
        if self.over_limit(job, freed):
            self.running = before
            return WAITS
        self.running.append((job, freed))
        return Outcome(True, tuple(sorted({j.task_class for j, _ in taken})),
                       any(self.cloud(n) for n in freed))

    def max_runtime_s(self, task_class: str) -> int:
        part = _seconds(self.parts[task_class]["MaxTime"])
        assert part == self.qos_wall[task_class], "partition MaxTime and QOS MaxWall differ"
        return part


class KueuePool:
    """The rendered Kueue objects and Kueue's admission rules over them."""

    def __init__(self, desc: Description) -> None:
        objs = k8s_objects.manifests(desc)
        self.gpus_per_node = k8s_objects.gpus_per_node(desc, next(iter(
            desc.teams[next(iter(desc.teams))].quota)))
        self.flavors = {o["metadata"]["name"]: o["spec"] for o in objs
                        if o["kind"] == "ResourceFlavor"}
        self.cqs = {o["metadata"]["name"]: o["spec"] for o in objs
                    if o["kind"] == "ClusterQueue"}
        self.lqs = {(o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"]["clusterQueue"]
                    for o in objs if o["kind"] == "LocalQueue"}
        self.priority = {o["metadata"]["name"]: o["value"] for o in objs
                         if o["kind"] == "WorkloadPriorityClass"}
        self.limits = {o["metadata"]["namespace"]: o["data"] for o in objs
                       if o["kind"] == "ConfigMap"
                       and o["metadata"]["name"] == k8s_objects.JOB_LIMITS}
        self.admitted: list[tuple[Job, str, str]] = []  # job, cluster queue, flavor

    def quota(self, cq: str, flavor: str) -> tuple[int, int | None]:
        for group in self.cqs[cq]["resourceGroups"]:
            for f in group["flavors"]:
                if f["name"] == flavor:
                    r = f["resources"][0]
                    return r["nominalQuota"], r.get("borrowingLimit")
        return 0, 0

    def usage(self, flavor: str, cqs: set[str]) -> int:
        return sum(j.nodes * self.gpus_per_node for j, q, f in self.admitted
                   if f == flavor and q in cqs)

    def cohort(self, cq: str) -> set[str]:
        return {q for q, s in self.cqs.items() if s["cohortName"] == self.cqs[cq]["cohortName"]}

    def node_selector(self, job: Job) -> dict[str, str]:
        """What the job limits policy makes a Job of this class select."""
        only = self.limits[job.team][k8s_objects.ONPREM_ONLY_KEY].split(",")
        return {LABEL_CAPACITY: ONPREM} if job.task_class in only else {}

    def borrowing(self, cq: str, flavor: str) -> bool:
        return self.usage(flavor, {cq}) > self.quota(cq, flavor)[0]

    def submit(self, job: Job) -> Outcome:
        cq = self.lqs[(job.team, job.task_class)]
        want = job.nodes * self.gpus_per_node
        spec = self.cqs[cq]
        selector = self.node_selector(job)
        preempt_option: tuple[str, list[tuple[Job, str, str]]] | None = None
        for flavor in (f["name"] for g in spec["resourceGroups"] for f in g["flavors"]):
            labels = self.flavors[flavor]["nodeLabels"]
            if any(labels.get(k, v) != v for k, v in selector.items()):
                continue  # the pod's nodeSelector excludes this flavor's nodes
            nominal, borrow = self.quota(cq, flavor)
            used = self.usage(flavor, {cq})
            cohort = self.cohort(cq)
            lendable = sum(self.quota(q, flavor)[0] for q in cohort)
            cq_ok = borrow is None or used + want <= nominal + borrow
            if cq_ok and self.usage(flavor, cohort) + want <= lendable:
                # whenCanBorrow: MayStopSearch (the default): the first flavor that fits
                # is taken, borrowing or not.
                self.admitted.append((job, cq, flavor))
                return Outcome(True, on_burst=self._burst(flavor))
            if preempt_option is None and used + want <= nominal:
                victims = self._reclaim_candidates(job, cq, flavor)
                freed = sum(v[0].nodes * self.gpus_per_node for v in victims)
                if self.usage(flavor, cohort) - freed + want <= lendable:
                    preempt_option = (flavor, victims)
            # whenCanPreempt: TryNextFlavor (the default): look for a fit elsewhere first.
        if preempt_option is None:
            return WAITS
        flavor, victims = preempt_option
        need = self.usage(flavor, self.cohort(cq)) + want - sum(
            self.quota(q, flavor)[0] for q in self.cohort(cq))
        taken = []
        for v in sorted(victims, key=lambda v: self.priority[v[0].task_class]):
            if need <= 0:
                break
            taken.append(v)
            need -= v[0].nodes * self.gpus_per_node
        self.admitted = [a for a in self.admitted if a not in taken]
        self.admitted.append((job, cq, flavor))
        return Outcome(True, tuple(sorted({v[0].task_class for v in taken})),
                       self._burst(flavor))

    def _reclaim_candidates(self, job: Job, cq: str, flavor: str) -> list[Any]:
        """reclaimWithinCohort: workloads of other ClusterQueues that borrow this flavor
        (Any: whatever their priority; LowerPriority: lower only); withinClusterQueue:
        lower-priority workloads of the same queue."""
        pre = self.cqs[cq]["preemption"]
        mine = self.priority[job.task_class]
        out = []
        for a in self.admitted:
            other, q, f = a
            if f != flavor:
                continue
            theirs = self.priority[other.task_class]
            reclaim = q != cq and self.borrowing(q, flavor) and (
                pre["reclaimWithinCohort"] == "Any"
                or (pre["reclaimWithinCohort"] == "LowerPriority" and theirs < mine))
            within = (q == cq and pre["withinClusterQueue"] == "LowerPriority"
                      and theirs < mine)
            if reclaim or within:
                out.append(a)
        return out

    def _burst(self, flavor: str) -> bool:
        return self.flavors[flavor]["nodeLabels"][LABEL_CAPACITY] != ONPREM

    def max_runtime_s(self, job: Job) -> int:
        return int(self.limits[job.team][job.task_class])


def slurm_outcome(desc: Description, s: Scenario) -> Outcome:
    pool = SlurmPool(desc)
    for job in s.running:
        assert pool.submit(job).starts, f"{s.name}: running job {job} could not start"
    return pool.submit(s.arriving)


def kueue_outcome(desc: Description, s: Scenario) -> Outcome:
    pool = KueuePool(desc)
    for job in s.running:
        assert pool.submit(job).starts, f"{s.name}: running job {job} could not start"
    return pool.submit(s.arriving)
