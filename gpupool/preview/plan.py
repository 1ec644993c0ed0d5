"""What the Pulumi program declares for a pool, as a preview-like tree or stable JSON.

The program runs under mocks (gpupool.preview.pulumi_mock); the inputs shown are exactly the
inputs the Pulumi engine would receive, ids and ARNs of not-yet-created resources being
mock placeholders.
"""

from __future__ import annotations

import gc
from collections import Counter
from typing import Any

import pulumi
from rich.markup import escape
from rich.tree import Tree

from gpupool.preview import pulumi_mock
from gpupool.preview.walk import walk
from gpupool.render import cost
from gpupool.spec.model import Description

STACK_TYPE = "pulumi:pulumi:Stack"

# The inputs worth a glance per resource type, as dotted paths ([] picks the length).
KEY_INPUTS: dict[str, tuple[str, ...]] = {
    "aws:ec2/vpc:Vpc": ("cidrBlock",),
    "aws:ec2/subnet:Subnet": ("cidrBlock", "availabilityZone"),
    "aws:ec2/securityGroup:SecurityGroup": ("name",),
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": (
        "ipProtocol", "fromPort", "toPort", "cidrIpv4", "referencedSecurityGroupId",
        "prefixListId"),
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": (
        "ipProtocol", "fromPort", "toPort", "cidrIpv4", "referencedSecurityGroupId",
        "prefixListId"),
    "aws:s3/bucket:Bucket": ("bucket",),
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration": (
        "rules.0.expiration.days", "rules.0.transitions"),
    "aws:s3/bucketVersioning:BucketVersioning": ("versioningConfiguration.status",),
    "aws:fsx/lustreFileSystem:LustreFileSystem": ("storageCapacity", "importPath"),
    "aws:ec2/launchTemplate:LaunchTemplate": (
        "metadataOptions.httpTokens", "networkInterfaces[]",
        "blockDeviceMappings.0.ebs.encrypted"),
    "aws:ec2/placementGroup:PlacementGroup": ("strategy",),
    "aws:secretsmanager/secret:Secret": ("name", "replicas[]"),
    "aws:autoscaling/group:Group": (
        "minSize", "maxSize", "mixedInstancesPolicy.instancesDistribution.onDemandBaseCapacity"),
    "kubernetes:core/v1:ResourceQuota": ("spec.hard",),
    "kubernetes:scheduling.k8s.io/v1:PriorityClass": ("value",),
    "kubernetes:kueue.x-k8s.io/v1beta2:WorkloadPriorityClass": ("value",),
    "kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor": ("spec.nodeLabels",),
    "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue": ("spec.cohortName",),
    "kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue": ("spec.clusterQueue",),
    "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding": ("roleRef.name", "subjects[]"),
}


class PlanError(Exception):
    """The program refused the stack (a bad stack config value): its message, for people."""


def declare(desc: Description, stack: str, *, last: bool = False,
            config: dict[str, str] | None = None) -> pulumi_mock.Run:
    """Run the Pulumi program for desc under mocks, with the stack config the program reads
    (e.g. gpupool:burstImageId). last: the caller is a command that only reports this run
    and exits (see below)."""
    # The run allocates a great many small objects (resources, outputs, futures) that all
    # live until it ends: the cyclic collector's passes over them took about half the CPU
    # time of a 1,000-node plan and freed nothing. Nor do its passes over the SDK's classes
    # while the program's modules load. Collect once, after.
    enabled = gc.isenabled()
    gc.disable()
    try:
        from infra import program  # noqa: PLC0415 - pulumi_aws is heavy; load it only here

        return pulumi_mock.run(lambda: program.declare(desc), stack, config)
    except pulumi.RunError as e:
        raise PlanError(str(e)) from None
    finally:
        if last:
            # That one collection, of the run's garbage (some 200,000 objects at 1,000
            # nodes), then costs more than it saves in a process about to end, and the
            # interpreter scans everything once more as it exits: freeze what exists, so
            # neither pass visits it.
            gc.freeze()
        if enabled:
            gc.enable()


def pick(inputs: dict[str, Any], path: str) -> Any:
    """The input at path; `path[]` is the length of the list there."""
    value = walk(inputs, path.removesuffix("[]"))
    return len(value) if path.endswith("[]") and isinstance(value, list) else value


def key_inputs(type_: str, inputs: dict[str, Any]) -> dict[str, Any]:
    out = {p: pick(inputs, p) for p in KEY_INPUTS.get(type_, ())}
    if type_.startswith("kubernetes:") and "namespace" in inputs.get("metadata", {}):
        out = {"namespace": inputs["metadata"]["namespace"], **out}
    return {k: v for k, v in out.items() if v is not None}


def parent_ref(urn: str | None) -> str | None:
    """'type::name' of a parent URN; None for the stack itself."""
    if urn is None:
        return None
    _, _, qualified, name = urn.split("::", 3)
    type_ = qualified.split("$")[-1]
    return None if type_ == STACK_TYPE else f"{type_}::{name}"


def as_json(run: pulumi_mock.Run, desc: Description | None = None) -> dict[str, Any]:
    """The run as stable JSON; with desc, its monthly cost ceiling too (render/cost.py)."""
    resources = sorted(
        ({"type": r.type, "name": r.name, "parent": parent_ref(r.parent),
          "inputs": r.inputs} for r in run.resources),
        key=lambda r: (r["type"], r["name"]))
    out = {"stack": run.stack, "resources": resources,
           "counts": dict(sorted(Counter(r["type"] for r in resources).items())),
           "total": len(resources), "outputs": run.outputs}
    if desc is not None:
        out["cost"] = cost.ceiling(((r.type, r.name, r.inputs) for r in run.resources),
                                   desc).as_json()
    return out


def _label(r: dict[str, Any]) -> str:
    keys = key_inputs(r["type"], r["inputs"])
    # Values are data (a list prints in brackets): none of it is read as markup.
    extra = ("  " + " ".join(f"[dim]{k}[/]={escape(str(v))}" for k, v in keys.items())
             if keys else "")
    return f"[bold]{r['type']}[/] {escape(r['name'])}{extra}"


def as_tree(plan: dict[str, Any]) -> Tree:
    """Stack -> components -> resources, as `pulumi preview` shows them."""
    root = Tree(f"[bold]pulumi:pulumi:Stack[/] gpupool-{escape(plan['stack'])} "
                f"({plan['total']} to create)")
    nodes: dict[str | None, Tree] = {None: root}
    pending = list(plan["resources"])
    # Parents before children: components first, then what hangs below them.
    for _ in range(len(pending) + 1):
        rest = []
        for r in pending:
            parent = nodes.get(r["parent"])
            if parent is None:
                rest.append(r)
                continue
            nodes[f"{r['type']}::{r['name']}"] = parent.add(f"[green]+[/] {_label(r)}")
        if not rest or rest == pending:
            break
        pending = rest
    return root
