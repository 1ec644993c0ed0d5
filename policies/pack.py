"""The CrossGuard adapter: gpupool's policies as pulumi_policy policies.

Building the PolicyPack starts its gRPC server, so that happens only in __main__.py. The
pack reads the pool description the way the program does: from the stack config
`gpupool:description`, which the Pulumi CLI hands to policy packs in PULUMI_CONFIG.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import pulumi
from pulumi_policy import (
    EnforcementLevel,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy import (
    Policy as CrossGuardPolicy,
)

from gpupool.paths import pulumi_project
from gpupool.spec import loader
from gpupool.spec.model import Description
from policies.catalog import POLICIES
from policies.core import Level, Policy, Res, Stack
from policies.offline import stack_config

LEVELS = {Level.MANDATORY: EnforcementLevel.MANDATORY, Level.ADVISORY: EnforcementLevel.ADVISORY}


@functools.cache
def description() -> Description:
    path = pulumi.runtime.get_config_env().get("gpupool:description")
    if path:
        return loader.load_file(pulumi_project() / path)
    stack = os.environ.get("PULUMI_STACK")
    if stack:
        return loader.load_stack(stack, pulumi_project())
    raise RuntimeError("gpupool policies need the stack config gpupool:description "
                       "(run them with `pulumi preview --policy-pack policies`)")


@functools.cache
def config() -> dict[str, tuple[Any, bool]]:
    stack = os.environ.get("PULUMI_STACK")
    return stack_config(stack, pulumi_project()) if stack else {}


def _res(r: ResourceValidationArgs | PolicyResource) -> Res:
    return Res(r.resource_type, r.name, r.urn, r.props)


def crossguard(p: Policy) -> CrossGuardPolicy:
    """One gpupool policy as a resource or stack validation policy."""
    if p.resource is not None:
        check = p.resource

        def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
            for message in check(_res(args), description()):
                report(message, None)

        return ResourceValidationPolicy(p.name, p.description, validate,
                                        enforcement_level=LEVELS[p.level])
    check_stack = p.stack
    if check_stack is None:
        raise TypeError(f"policy {p.name} has neither a resource nor a stack check")

    def validate_stack(args: StackValidationArgs, report: ReportViolation) -> None:
        stack = Stack([_res(r) for r in args.resources], config())
        for urn, message in check_stack(stack, description()):
            report(message, urn)

    return StackValidationPolicy(p.name, p.description, validate_stack,
                                 enforcement_level=LEVELS[p.level])


def crossguard_policies() -> list[CrossGuardPolicy]:
    return [crossguard(p) for p in POLICIES.values()]
