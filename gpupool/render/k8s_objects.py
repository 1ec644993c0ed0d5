"""The Kubernetes and Kueue objects a pool needs, as plain manifests.

Quotas, priorities and preemption come from gpupool.render.scheduling (the model Slurm is
rendered from too), so the two schedulers can be checked to agree. The Pulumi program
declares exactly these manifests (cluster_plan, ClusterServices' args); tests validate
them against the API schemas.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from gpupool.render.cloud.names import labels
from gpupool.render.cloud.network import onprem_sources
from gpupool.render.node_labels import (
    LABEL_CAPACITY,
    LABEL_PREFIX,
    ONPREM,
    flavor_labels,
    flavor_taints,
)
from gpupool.render.scheduling import class_policies, preemption_pairs, team_quotas, team_share
from gpupool.spec.catalog import INSTANCE_TYPES
from gpupool.spec.facts import CAPACITY_TYPES, gpu_capacity, preemption_kueue_expressible
from gpupool.spec.model import Description, NodeRole

# The Kubernetes minor the objects are written for; gpupool.preview.k8s_schema validates
# them against this version's API schemas.
KUBERNETES_VERSION = "1.33"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
GPU_RESOURCE = "nvidia.com/gpu"
RBAC_API = "rbac.authorization.k8s.io"

Manifest = dict[str, Any]

# What each declared role may do in its team's namespace. Researchers run work; on-call
# inspects and stops it; contractors run jobs but cannot exec into pods or delete others'.
_READ = ["get", "list", "watch"]
_WRITE = ["create", "update", "patch", "delete"]
ROLE_RULES: dict[str, list[dict[str, Any]]] = {
    "researcher": [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": _READ + _WRITE},
        {"apiGroups": [""], "resources": ["pods", "pods/log", "events"], "verbs": _READ},
        {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps", "persistentvolumeclaims"],
         "verbs": _READ + _WRITE},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads", "localqueues"],
         "verbs": _READ},
    ],
    "oncall": [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": [*_READ, "delete"]},
        {"apiGroups": [""], "resources": ["pods", "pods/log", "events"],
         "verbs": [*_READ, "delete"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"],
         "verbs": [*_READ, "patch"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues"],
         "verbs": [*_READ, "patch"]},
    ],
    "contractor": [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": [*_READ, "create"]},
        {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": _READ},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": _READ},
    ],
}
ADMIN_CLUSTER_ROLE = "admin"  # the built-in namespace admin role, for declared admins

# Pod Security Admission (built into the API server) reads these namespace labels. Enforce
# checks only pods, so a Job whose pods break the level is admitted and its pods refused;
# audit and warn also check the Job's pod template, so the submitter hears it at once.
# Each mode's -version pins what the level means: a cluster upgrade changes no check
# unreviewed.
POD_SECURITY_PREFIX = "pod-security.kubernetes.io/"
POD_SECURITY_LEVEL = "restricted"
POD_SECURITY_MODES = ("enforce", "audit", "warn")
POD_SECURITY_LABELS: dict[str, str] = {
    key: value for mode in POD_SECURITY_MODES for key, value in (
        (POD_SECURITY_PREFIX + mode, POD_SECURITY_LEVEL),
        (f"{POD_SECURITY_PREFIX}{mode}-version", f"v{KUBERNETES_VERSION}"))}


def _meta(desc: Description, name: str, team: str | None = None,
          namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels(desc, team)}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def flavor_name(model: str, capacity: str) -> str:
    return f"{model}-{capacity}"


def cohort_name(desc: Description) -> str:
    return desc.pool.name


@dataclass(frozen=True)
class FlavorQuota:
    flavor: str
    nominal: int
    borrowing: int


def flavor_quotas(desc: Description) -> dict[str, dict[str, list[FlavorQuota]]]:
    """team -> model -> quota per flavor.

    A team's nominal GPUs are placed on the most dependable capacity first (on-prem, then
    on-demand, then spot), teams in description order, so no flavor is promised beyond
    its GPUs. Borrowing per flavor is the declared limit, capped so nominal + borrowing
    never exceeds the flavor's GPUs; the namespace ResourceQuota caps the total.
    """
    capacity = gpu_capacity(desc)
    free = {m: dict(c) for m, c in capacity.items()}
    out: dict[str, dict[str, list[FlavorQuota]]] = defaultdict(dict)
    for q in team_quotas(desc):
        left = q.nominal
        rows = []
        for kind in CAPACITY_TYPES:
            gpus = capacity[q.model][kind]
            if gpus == 0:
                continue
            take = min(left, free[q.model][kind])
            free[q.model][kind] -= take
            left -= take
            rows.append(FlavorQuota(flavor_name(q.model, kind), take,
                                    min(q.borrowing, gpus - take)))
        out[q.team][q.model] = rows
    return dict(out)


def gpus_per_node(desc: Description, model: str) -> int:
    """The most GPUs of a model one node carries: the largest single request that fits."""
    counts = [nc.gpu.count for nc in desc.node_classes.values()
              if nc.gpu is not None and nc.gpu.model == model]
    counts += [t.gpus for g in desc.burst_groups.values() for t in
               (INSTANCE_TYPES[n] for n in g.instance_types) if t.gpu_model == model]
    return max(counts, default=0)


def per_gpu_share(desc: Description) -> tuple[int, int]:
    """CPUs and GiB of memory per GPU on the leanest GPU node class: a default request
    that fits any GPU node."""
    shares = [(nc.cpus // nc.gpu.count, nc.memory_gib // nc.gpu.count)
              for name, nc in desc.node_classes.items() if nc.gpu is not None
              and any(n.class_ == name and NodeRole.COMPUTE in n.roles
                      for n in desc.nodes.values())]
    return min(s[0] for s in shares), min(s[1] for s in shares)


def _segment_blocks(desc: Description, segment: str) -> list[str]:
    seg = desc.network.segments[segment]
    return [seg.cidr] + ([seg.cloud_cidr] if seg.cloud_cidr else [])


def _ports(protocol: str, ports: list[int]) -> list[dict[str, Any]]:
    if protocol == "all":
        return []
    return [{"protocol": protocol.upper(), "port": p} for p in ports]


def _peers(blocks: list[str]) -> list[dict[str, Any]]:
    return [{"ipBlock": {"cidr": c}} for c in blocks]


def network_policies(desc: Description, team: str) -> list[Manifest]:
    """Default deny, then the declared flows that touch pods (pods sit on the training
    segment); flows between other segments are the host firewall's business."""
    def policy(name: str, spec: dict[str, Any]) -> Manifest:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": _meta(desc, name, team, team),
                "spec": {"podSelector": {}, **spec}}

    out = [
        policy("default-deny", {"policyTypes": ["Ingress", "Egress"]}),
        # Name resolution is cluster plumbing every pod needs, not a pool flow.
        policy("allow-dns", {"policyTypes": ["Egress"], "egress": [{
            "to": [{"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": "kube-system"}}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]}),
    ]
    for i, flow in enumerate(desc.network.flows):
        name = f"allow-flow-{i}-{flow.from_}-to-{flow.to}"
        ports = _ports(flow.protocol, flow.ports)
        port_spec = {"ports": ports} if ports else {}
        if flow.from_ == "training" and flow.to == "training":
            peers = [{"podSelector": {}}, *_peers(_segment_blocks(desc, "training"))]
            out.append(policy(name, {"policyTypes": ["Ingress", "Egress"],
                                     "ingress": [{"from": peers, **port_spec}],
                                     "egress": [{"to": peers, **port_spec}]}))
        elif flow.from_ == "training":
            out.append(policy(name, {"policyTypes": ["Egress"], "egress": [
                {"to": _peers(_segment_blocks(desc, flow.to)), **port_spec}]}))
        elif flow.to == "training":
            seg = desc.network.segments[flow.from_]
            blocks = onprem_sources(desc, flow.from_) + (
                [seg.cloud_cidr] if seg.cloud_cidr else [])
            out.append(policy(name, {"policyTypes": ["Ingress"], "ingress": [
                {"from": _peers(blocks), **port_spec}]}))
    return out


def team_objects(desc: Description, team: str,
                 pool: tuple[dict[str, dict[str, list[FlavorQuota]]], tuple[int, int]]
                 | None = None) -> list[Manifest]:
    """pool: flavor_quotas(desc) and per_gpu_share(desc), which look at every team and
    node, computed once for all teams by manifests() (else here)."""
    t = desc.teams[team]
    share = team_share(desc, team)
    all_quotas, (cpu, mem) = pool or (flavor_quotas(desc), per_gpu_share(desc))
    quotas = all_quotas[team]
    max_gpus = max(gpus_per_node(desc, q.model) for q in share.quotas)
    per_model = ",".join(f"{q.model}={q.nominal}+{q.borrowing}" for q in share.quotas)
    ns_meta = _meta(desc, team, team)
    ns_meta["labels"] |= POD_SECURITY_LABELS
    out: list[Manifest] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": ns_meta},
        {"apiVersion": "v1", "kind": "ResourceQuota",
         "metadata": {**_meta(desc, "gpu-quota", team, team),
                      "annotations": {LABEL_PREFIX + "gpu-quota": per_model}},
         # All GPU models share one resource name; Kueue flavors account per model, this
         # caps the namespace at its nominal plus borrowing whatever the scheduler does.
         "spec": {"hard": {f"requests.{GPU_RESOURCE}": str(share.ceiling)}}},
        {"apiVersion": "v1", "kind": "LimitRange",
         "metadata": _meta(desc, "defaults", team, team),
         "spec": {"limits": [{"type": "Container",
                              "max": {GPU_RESOURCE: str(max_gpus)},
                              "defaultRequest": {"cpu": str(cpu), "memory": f"{mem}Gi"},
                              "default": {"cpu": str(cpu), "memory": f"{mem}Gi"}}]}},
        *network_policies(desc, team),
    ]
    for role, rules in ROLE_RULES.items():
        out.append({"apiVersion": f"{RBAC_API}/v1", "kind": "Role",
                    "metadata": _meta(desc, role, team, team), "rules": rules})
    for role, users in sorted(t.members.items()):
        if not users:
            continue
        ref_kind, ref_name = (("ClusterRole", ADMIN_CLUSTER_ROLE) if role.value == "admin"
                              else ("Role", role.value))
        out.append({"apiVersion": f"{RBAC_API}/v1", "kind": "RoleBinding",
                    "metadata": _meta(desc, role.value, team, team),
                    "roleRef": {"apiGroup": RBAC_API, "kind": ref_kind, "name": ref_name},
                    "subjects": [{"kind": "User", "apiGroup": RBAC_API, "name": u}
                                 for u in users]})
    out.append(job_limits(desc, team))
    out += cluster_queues(desc, team, quotas)
    # One LocalQueue per task class: users name the class, the queue picks the ClusterQueue.
    out += [{"apiVersion": KUEUE_API, "kind": "LocalQueue",
             "metadata": _meta(desc, c, team, team),
             "spec": {"clusterQueue": queue_of(desc, team, c)}} for c in desc.task_classes]
    return out


def preemptible_classes(desc: Description) -> list[str]:
    return [c.name for c in class_policies(desc) if c.preemptible]


def queue_of(desc: Description, team: str, task_class: str) -> str:
    """The ClusterQueue a team's workloads of a class go to."""
    return f"{team}-preemptible" if desc.task_classes[task_class].preemptible else team


def kueue_preemption_pairs(desc: Description) -> set[tuple[str, str]]:
    """(preemptor, victim) class pairs the rendered queues permit.

    Each team has two ClusterQueues. Its guaranteed classes share one with the team's
    nominal quota, never borrow and never preempt inside it (withinClusterQueue: Never),
    so interactive never preempts training and training never preempts training. Its
    preemptible classes share one with no nominal quota: everything they run is borrowed,
    and a guaranteed workload reclaims it (reclaimWithinCohort: Any). Borrowing is
    therefore only ever done by preemptible work, as Kueue's KEP-4400 intends for
    non-preemptible workloads. The relation this expresses is "every guaranteed class
    that preempts anything preempts every preemptible class"; a description asking for
    another one is refused here rather than rendered wrongly.
    """
    wanted = preemption_pairs(desc)
    if not wanted:
        return set()
    expressible = preemption_kueue_expressible(desc)
    if wanted != expressible:
        raise ValueError(
            "Kueue queues can only let every non-preemptible class preempt every "
            f"preemptible one; the task classes ask for {sorted(wanted)}, "
            f"expressible is {sorted(expressible)}")
    return expressible


def _preemption(reclaim: bool) -> dict[str, Any]:
    return {"withinClusterQueue": "Never",
            "reclaimWithinCohort": "Any" if reclaim else "Never",
            "borrowWithinCohort": {"policy": "Never"}}


def cluster_queues(desc: Description, team: str,
                   quotas: dict[str, list[FlavorQuota]]) -> list[Manifest]:
    reclaim = bool(kueue_preemption_pairs(desc))
    weight = team_share(desc, team).fair_share

    def queue(name: str, flavors: list[dict[str, Any]], may_reclaim: bool) -> Manifest:
        return {"apiVersion": KUEUE_API, "kind": "ClusterQueue",
                "metadata": _meta(desc, name, team),
                "spec": {"cohortName": cohort_name(desc),
                         "namespaceSelector": {"matchLabels": {
                             "kubernetes.io/metadata.name": team}},
                         "queueingStrategy": "BestEffortFIFO",
                         "preemption": _preemption(may_reclaim),
                         # Slurm's fairshare shares of the team's account (slurm.accounting):
                         # only used where Kueue's configuration enables fair sharing.
                         "fairSharing": {"weight": weight},
                         # One group: every model is the same resource name, one flavor each.
                         "resourceGroups": [{"coveredResources": [GPU_RESOURCE],
                                             "flavors": flavors}]}}

    rows = [f for per_model in quotas.values() for f in per_model]
    out = [queue(team, [{"name": f.flavor, "resources": [
        {"name": GPU_RESOURCE, "nominalQuota": f.nominal, "borrowingLimit": 0}]}
        for f in rows], reclaim)]
    if preemptible_classes(desc):
        out.append(queue(f"{team}-preemptible", [{"name": f.flavor, "resources": [
            {"name": GPU_RESOURCE, "nominalQuota": 0,
             "borrowingLimit": f.nominal + f.borrowing}]} for f in rows], False))
    return out


def resource_flavors(desc: Description) -> list[Manifest]:
    """One flavor per GPU model and capacity type, selecting the labels its nodes register
    with (gpupool/render/node_labels.py: kubelet on-prem, user data on burst nodes)."""
    out = []
    for model, caps in gpu_capacity(desc).items():
        for kind, gpus in caps.items():
            if gpus == 0:
                continue
            spec: dict[str, Any] = {"nodeLabels": flavor_labels(model, kind)}
            if taints := flavor_taints(kind):
                # Kueue admits a workload to a tainted flavor only if it tolerates the
                # taints; the flavor's tolerations are added to the pods it admits there.
                spec["nodeTaints"] = taints
                spec["tolerations"] = [{**t, "operator": "Equal"} for t in taints]
            out.append({"apiVersion": KUEUE_API, "kind": "ResourceFlavor",
                        "metadata": _meta(desc, flavor_name(model, kind)), "spec": spec})
    return out


def class_objects(desc: Description) -> list[Manifest]:
    out: list[Manifest] = []
    preemptors = {a for a, _ in preemption_pairs(desc)}
    for c in class_policies(desc):
        text = desc.task_classes[c.name].description or c.name
        out.append({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                    "metadata": _meta(desc, c.name), "value": c.priority,
                    "globalDefault": False, "description": text,
                    "preemptionPolicy": ("PreemptLowerPriority" if c.name in preemptors
                                         else "Never")})
        out.append({"apiVersion": KUEUE_API, "kind": "WorkloadPriorityClass",
                    "metadata": _meta(desc, c.name), "value": c.priority,
                    "description": text})
    return out


# Kueue reads a Job's maximum execution time from this label into its Workload and
# deactivates (evicts, without requeueing) a Workload admitted for longer
# (kueue.sigs.k8s.io/docs/concepts/workload/#maximum-execution-time, Kueue v0.10 on, as in
# the pinned v0.19); no ClusterQueue or LocalQueue field sets one, so the job limits
# policy below requires the label and caps it at the class's max_runtime.
MAX_EXEC_LABEL = "kueue.x-k8s.io/max-exec-time-seconds"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_LIMITS = "gpupool-job-limits"
ONPREM_ONLY_KEY = "gpupool.on-prem-only"  # a dot: never a class name (DNS labels)
_SELECTOR = "object.spec.template.spec.nodeSelector"


def onprem_only_classes(desc: Description) -> list[str]:
    """Classes that never run on burst capacity: the top class, as in Slurm, whose
    partition holds only on-prem nodes (it must start in seconds, not wait for a boot)."""
    return [class_policies(desc)[0].name] if desc.burst_groups else []


def job_limits(desc: Description, team: str) -> Manifest:
    """The job limits policy's parameters in a team's namespace: per LocalQueue (task
    class) the longest maximum execution time a Job may ask for, and which classes must
    select on-prem nodes (Kueue assigns only flavors whose nodeLabels a pod's
    nodeSelector allows)."""
    data = {c.name: str(c.max_runtime_s) for c in class_policies(desc)}
    data[ONPREM_ONLY_KEY] = ",".join(onprem_only_classes(desc))
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(desc, JOB_LIMITS, team, team), "data": data}


def job_limits_policy(desc: Description) -> list[Manifest]:
    """A ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, GA in Kubernetes
    1.30) over batch Jobs in team namespaces: a Job names its class's LocalQueue, sets
    the maximum execution time label within the class's max_runtime, and an on-prem-only
    class selects on-prem nodes. Slurm gives a job without --time its partition's
    MaxTime; here a Job without the label is refused instead (no mutation in 1.33)."""
    queue = f"object.metadata.labels['{QUEUE_LABEL}']"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": _meta(desc, JOB_LIMITS),
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["batch"], "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["jobs"]}]},
            "validations": [
                {"expression": (f"has(object.metadata.labels) && '{QUEUE_LABEL}' in "
                                f"object.metadata.labels && {queue} in params.data && "
                                f"{queue} != '{ONPREM_ONLY_KEY}'"),
                 "message": f"a Job names its task class's LocalQueue ({QUEUE_LABEL})"},
                {"expression": (f"'{MAX_EXEC_LABEL}' in object.metadata.labels && "
                                f"int(object.metadata.labels['{MAX_EXEC_LABEL}']) <= "
                                f"int(params.data[{queue}])"),
                 "messageExpression": (f"'{MAX_EXEC_LABEL} must be set, at most ' + "
                                       f"params.data[{queue}]")},
                {"expression": (f"!({queue} in params.data['{ONPREM_ONLY_KEY}'].split(',')) "
                                f"|| (has({_SELECTOR}) && '{LABEL_CAPACITY}' in {_SELECTOR}"
                                f" && {_SELECTOR}['{LABEL_CAPACITY}'] == '{ONPREM}')"),
                 "message": (f"this class runs on on-prem nodes only: set nodeSelector "
                             f"{LABEL_CAPACITY}: {ONPREM}")},
            ]}}
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": _meta(desc, JOB_LIMITS),
        "spec": {"policyName": JOB_LIMITS, "validationActions": ["Deny"],
                 # Each namespace's own ConfigMap of that name (job_limits).
                 "paramRef": {"name": JOB_LIMITS, "parameterNotFoundAction": "Deny"},
                 "matchResources": {"namespaceSelector": {"matchExpressions": [{
                     "key": "kubernetes.io/metadata.name", "operator": "In",
                     "values": list(desc.teams)}]}}}}
    return [policy, binding]


def manifests(desc: Description) -> list[Manifest]:
    """Every object, cluster-scoped first, then per team in description order."""
    out = class_objects(desc) + resource_flavors(desc) + job_limits_policy(desc)
    pool = flavor_quotas(desc), per_gpu_share(desc)
    for team in desc.teams:
        out += team_objects(desc, team, pool)
    return out


@dataclass(frozen=True)
class ClusterPlan:
    """What ClusterServices declares: every manifest, and per team where its users submit
    (the namespace, LocalQueue and ClusterQueue the stack exports)."""

    manifests: list[Manifest]
    queues: dict[str, dict[str, str]]


def cluster_plan(desc: Description) -> ClusterPlan:
    """ClusterServices' args."""
    return ClusterPlan(
        manifests=manifests(desc),
        queues={team: {"namespace": team, "local_queue": team, "cluster_queue": team}
                for team in desc.teams})


def object_key(m: Manifest) -> str:
    """A stable resource name for a manifest: kind, namespace and name."""
    ns = m["metadata"].get("namespace")
    return "-".join(p for p in (m["kind"].lower(), ns, m["metadata"]["name"]) if p)
