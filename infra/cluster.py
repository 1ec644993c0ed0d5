"""ClusterServices: the Kubernetes and Kueue objects of gpupool.render.k8s_objects, declared."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpupool.render.k8s_objects import KUEUE_API, ClusterPlan, Manifest, object_key
from infra.components import Component


@dataclass(frozen=True)
class ClusterServicesArgs:
    plan: ClusterPlan


class KueueObject(k8s.apiextensions.CustomResource):
    """A Kueue custom resource whose fields sit beside metadata, not under spec
    (WorkloadPriorityClass has top-level value and description)."""

    def __init__(self, name: str, manifest: Manifest, opts: pulumi.ResourceOptions) -> None:
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
            version=k8s._utilities.get_version()))
        pulumi.CustomResource.__init__(
            self, f"kubernetes:{manifest['apiVersion']}:{manifest['kind']}", name,
            dict(manifest), opts)


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()


def _typed(m: Manifest) -> type[pulumi.CustomResource]:
    """pulumi_kubernetes's class for a built-in kind: apps/v1 -> k8s.apps.v1.<Kind>."""
    group, _, version = m["apiVersion"].rpartition("/")
    module = getattr(getattr(k8s, group.split(".")[0] or "core"), version)
    return getattr(module, m["kind"])


def declare(m: Manifest, opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    name = object_key(m)
    if m["apiVersion"] == KUEUE_API:
        if "spec" in m:
            return k8s.apiextensions.CustomResource(
                name, api_version=m["apiVersion"], kind=m["kind"], metadata=m["metadata"],
                spec=m["spec"], opts=opts)
        return KueueObject(name, m, opts)
    fields: dict[str, Any] = {_snake(k): v for k, v in m.items()
                              if k not in ("apiVersion", "kind")}
    return _typed(m)(name, **fields, opts=opts)


class ClusterServices(Component):
    """Per team: namespace, ResourceQuota, LimitRange, default-deny NetworkPolicy plus the
    declared flows, RBAC; per task class: PriorityClass and WorkloadPriorityClass; Kueue
    ResourceFlavors, a ClusterQueue per team in one cohort, LocalQueues."""

    queues: dict[str, dict[str, str]]

    def __init__(self, name: str, args: ClusterServicesArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("ClusterServices", name, opts)
        namespaces: dict[str, pulumi.CustomResource] = {}
        for m in args.plan.manifests:
            ns = m["metadata"].get("namespace")
            # Namespaced objects wait for their namespace.
            res = declare(m, self.child(depends_on=[namespaces[ns]] if ns else []))
            if m["kind"] == "Namespace":
                namespaces[m["metadata"]["name"]] = res
        self.queues = args.plan.queues
        self.register_outputs({"queues": self.queues})
