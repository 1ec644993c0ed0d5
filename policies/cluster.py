"""Cluster: guarded team namespaces, restricted pods, Secrets read only in their own
namespace, queue quotas within capacity, a pinned software lock."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from gpupool.render.cloud.names import TAG_TEAM
from gpupool.render.k8s_objects import GPU_RESOURCE, POD_SECURITY_LABELS
from gpupool.render.node_labels import LABEL_CAPACITY, LABEL_MODEL, LABEL_PREFIX
from gpupool.render.scheduling import team_shares
from gpupool.spec import os_release
from gpupool.spec.facts import gpu_capacity
from gpupool.spec.model import VERSION_RE, Description
from policies.core import Level, Res, Stack, resource_policy, stack_policy
from policies.types import (
    K8S_CLUSTER_ROLE,
    K8S_CLUSTER_ROLE_BINDING,
    K8S_LIMITS,
    K8S_NAMESPACE,
    K8S_NETPOL,
    K8S_QUOTA,
    K8S_ROLE,
    K8S_ROLE_BINDING,
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


@resource_policy("cluster-pod-security-restricted", "cluster", Level.MANDATORY,
                 "Every team namespace enforces, audits and warns at Pod Security Standard "
                 "restricted, pinned to the pool's Kubernetes minor.", types=(K8S_NAMESPACE,))
def pod_security(r: Res, desc: Description) -> Iterator[str]:
    name = _meta(r).get("name")
    if name not in desc.teams:
        return
    labels = _meta(r).get("labels") or {}
    for key, wanted in POD_SECURITY_LABELS.items():
        if labels.get(key) != wanted:
            yield f"team namespace {name}: {key} is {labels.get(key) or 'unset'}, not {wanted}"


# Kubernetes' built-in user-facing ClusterRoles: cluster-admin, admin and edit read Secrets,
# view does not. A role the stack neither declares nor names here could grant anything.
_BUILTIN_READS_SECRETS = {"cluster-admin": True, "admin": True, "edit": True, "view": False}
_READ_VERBS = frozenset({"get", "list", "watch", "*"})

RoleRef = Mapping[str, Any]


def reads_secrets(rules: Iterable[Mapping[str, Any]]) -> bool:
    """Whether RBAC rules let their holder read Secrets, wildcards included."""
    return any(_READ_VERBS & set(r.get("verbs") or [])
               and {"", "*"} & set(r.get("apiGroups") or [])
               and {"secrets", "*"} & set(r.get("resources") or []) for r in rules)


def _secret_readers(stack: Stack) -> Callable[[RoleRef, str | None], bool]:
    """A binding's roleRef and namespace -> whether the role it grants reads Secrets."""
    declared: dict[tuple[str, str | None, str], bool] = {}
    for r in stack.of_type(K8S_ROLE):
        declared["Role", _meta(r).get("namespace"), _meta(r).get("name")] = reads_secrets(
            r.props.get("rules") or [])
    for r in stack.of_type(K8S_CLUSTER_ROLE):
        # An aggregated role's rules are whatever the roles it selects grant.
        declared["ClusterRole", None, _meta(r).get("name")] = bool(
            r.props.get("aggregationRule")) or reads_secrets(r.props.get("rules") or [])

    def reads(ref: RoleRef, namespace: str | None) -> bool:
        kind, name = ref.get("kind"), ref.get("name")
        key = (kind, namespace if kind == "Role" else None, name)
        if key in declared:
            return declared[key]
        return kind != "ClusterRole" or _BUILTIN_READS_SECRETS.get(name, True)

    return reads


def _who(subject: Mapping[str, Any], namespace: str | None) -> str:
    if subject.get("kind") == "ServiceAccount":
        return f"ServiceAccount {subject.get('namespace') or namespace}/{subject.get('name')}"
    return f"{subject.get('kind')} {subject.get('name')}"


def _own(subject: Mapping[str, Any], namespace: str, members: Mapping[str, set[str]]) -> bool:
    """Whether a subject is the namespace's own: one of its service accounts or a member of
    its team. A Group never is: who is in it is not in the description."""
    if subject.get("kind") == "ServiceAccount":
        return (subject.get("namespace") or namespace) == namespace
    return subject.get("kind") == "User" and subject.get("name") in members.get(namespace, ())


def _of_a_team(subject: Mapping[str, Any], members: Mapping[str, set[str]]) -> bool:
    """Whether a subject is some team's: a member, or a service account of its namespace."""
    if subject.get("kind") == "ServiceAccount":
        return subject.get("namespace") in members
    return subject.get("kind") == "User" and any(subject.get("name") in m
                                                 for m in members.values())


@stack_policy("cluster-secrets-stay-in-namespace", "cluster", Level.MANDATORY,
              "No team member or team service account is bound cluster-wide, no one is "
              "bound to read Secrets in every namespace, and a role that reads Secrets "
              "in a namespace is bound only to its team's members and its service "
              "accounts.")
def secrets_in_namespace(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    reads = _secret_readers(stack)
    members = {name: {u for users in t.members.values() for u in users}
               for name, t in desc.teams.items()}
    for b in stack.of_type(K8S_CLUSTER_ROLE_BINDING):
        ref, name = b.props.get("roleRef") or {}, _meta(b).get("name")
        for s in b.props.get("subjects") or []:
            if _of_a_team(s, members):
                yield b.urn, (f"ClusterRoleBinding {name} binds {_who(s, None)} of a team "
                              "cluster-wide; bind team roles in the team's namespace")
            elif reads(ref, None):
                yield b.urn, (f"ClusterRoleBinding {name} lets {_who(s, None)} read Secrets "
                              f"in every namespace ({ref.get('kind')} {ref.get('name')})")
    for b in stack.of_type(K8S_ROLE_BINDING):
        ref, ns, name = (b.props.get("roleRef") or {}, _meta(b).get("namespace"),
                         _meta(b).get("name"))
        if not reads(ref, ns):
            continue
        for s in b.props.get("subjects") or []:
            if not _own(s, ns, members):
                yield b.urn, (f"RoleBinding {ns}/{name} lets {_who(s, ns)}, not of namespace "
                              f"{ns}, read its Secrets ({ref.get('kind')} {ref.get('name')})")


@stack_policy("cluster-quota-within-capacity", "cluster", Level.MANDATORY,
              "ClusterQueue quotas per flavor never exceed the flavor's physical GPUs, and "
              "no queue lets a team hold more than its quota plus declared borrowing.")
def quota_capacity(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    capacity = gpu_capacity(desc)
    shares = team_shares(desc)
    flavors: dict[str, tuple[str, str]] = {}
    for f in stack.of_type(KUEUE_FLAVOR):
        labels = (f.props.get("spec") or {}).get("nodeLabels") or {}
        flavors[_meta(f).get("name")] = (labels.get(LABEL_MODEL), labels.get(LABEL_CAPACITY))
    nominal: dict[str, int] = defaultdict(int)
    for cq in stack.of_type(KUEUE_CLUSTER_QUEUE):
        share = shares.get((_meta(cq).get("labels") or {}).get(LABEL_PREFIX + TAG_TEAM, ""))
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
                    ceiling = share.ceiling_of(model or "") if share else 0
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
    for path, component, version in os_release.locked_versions(desc):
        if not re.match(VERSION_RE, str(version)):
            yield None, f"{path} is {version!r}, not one exact version"
        elif version in sw.blocklist.get(component, []):
            yield None, f"{path} {version} is blocklisted"
