"""Cluster: guarded team namespaces, queue quotas within capacity, a pinned software lock."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator

from gpupool.render.cloud import LABEL_PREFIX, TAG_TEAM
from gpupool.render.k8s_objects import GPU_RESOURCE
from gpupool.render.node_labels import LABEL_CAPACITY, LABEL_MODEL
from gpupool.spec.facts import gpu_capacity
from gpupool.spec.model import VERSION_RE, Description
from policies.core import Level, Res, Stack, stack_policy
from policies.types import (
    K8S_LIMITS,
    K8S_NAMESPACE,
    K8S_NETPOL,
    K8S_QUOTA,
    KUEUE_CLUSTER_QUEUE,
    KUEUE_FLAVOR,
)


def _meta(r: Res) -> dict:
    return r.props.get("metadata") or {}


def _default_deny(spec: dict) -> bool:
    return (spec.get("podSelector") == {} and set(spec.get("policyTypes") or []) ==
            {"Ingress", "Egress"} and not spec.get("ingress") and not spec.get("egress"))


@stack_policy("cluster-namespace-guards", "cluster", Level.MANDATORY,
              "Every team namespace has a ResourceQuota, a LimitRange and a default-deny "
              "NetworkPolicy.")
def namespace_guards(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    # Grouped once: a scan of every resource per namespace grew with teams x resources.
    by_namespace: dict[str, list[Res]] = defaultdict(list)
    for r in stack.resources:
        by_namespace[_meta(r).get("namespace")].append(r)
    for ns in stack.of_type(K8S_NAMESPACE):
        name = _meta(ns).get("name")
        if name not in desc.teams:
            continue
        inside = by_namespace.get(name, [])
        if not any(r.type == K8S_QUOTA for r in inside):
            yield ns.urn, f"team namespace {name} has no ResourceQuota"
        if not any(r.type == K8S_LIMITS for r in inside):
            yield ns.urn, f"team namespace {name} has no LimitRange"
        if not any(r.type == K8S_NETPOL and _default_deny(r.props.get("spec") or {})
                   for r in inside):
            yield ns.urn, f"team namespace {name} has no default-deny NetworkPolicy"


@stack_policy("cluster-quota-within-capacity", "cluster", Level.MANDATORY,
              "ClusterQueue quotas per flavor never exceed the flavor's physical GPUs, and "
              "no queue lets a team hold more than its quota plus declared borrowing.")
def quota_capacity(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    capacity = gpu_capacity(desc)
    flavors: dict[str, tuple[str, str]] = {}
    for f in stack.of_type(KUEUE_FLAVOR):
        labels = (f.props.get("spec") or {}).get("nodeLabels") or {}
        flavors[_meta(f).get("name")] = (labels.get(LABEL_MODEL), labels.get(LABEL_CAPACITY))
    nominal: dict[str, int] = defaultdict(int)
    for cq in stack.of_type(KUEUE_CLUSTER_QUEUE):
        team = desc.teams.get((_meta(cq).get("labels") or {}).get(LABEL_PREFIX + TAG_TEAM, ""))
        for group in (cq.props.get("spec") or {}).get("resourceGroups") or []:
            for fq in group.get("flavors") or []:
                name = fq.get("name")
                model, kind = flavors.get(name, (None, None))
                gpus = capacity.get(model or "", {}).get(kind or "")
                if gpus is None:
                    yield cq.urn, f"flavor {name} matches no GPU model and capacity type"
                    continue
                for res in fq.get("resources") or []:
                    if res.get("name") != GPU_RESOURCE:
                        continue
                    n, b = int(res.get("nominalQuota", 0)), int(res.get("borrowingLimit", 0))
                    nominal[name] += n
                    if n + b > gpus:
                        yield cq.urn, (f"flavor {name}: nominal {n} + borrowing {b} exceeds "
                                       f"its {gpus} GPUs")
                    ceiling = (team.quota.get(model or "", 0)
                               + team.borrowing_limit.get(model or "", 0)) if team else 0
                    if n + b > ceiling:
                        yield cq.urn, (f"flavor {name}: nominal {n} + borrowing {b} exceeds "
                                       f"the {ceiling} {model} GPUs the team may hold")
    for name, total in sorted(nominal.items()):
        model, kind = flavors[name]
        if total > capacity[model][kind]:
            yield None, (f"flavor {name}: nominal quotas add up to {total}, beyond its "
                         f"{capacity[model][kind]} GPUs")


@stack_policy("cluster-software-pinned", "cluster", Level.MANDATORY,
              "Every version in the software lock is one exact version and not blocklisted.")
def software_pinned(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    sw = desc.software
    locked = {k: v for k, v in sw.__dict__.items() if k != "blocklist"}
    for component, version in locked.items():
        if not re.match(VERSION_RE, str(version)):
            yield None, f"software.{component} is {version!r}, not one exact version"
        elif version in sw.blocklist.get(component, []):
            yield None, f"software.{component} {version} is blocklisted"
