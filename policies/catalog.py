"""Every policy of the pack, collected from the group modules in one place.

The group modules declare policies (`policies.core` decorators return `Policy` values) and
import only `policies.core`; this module imports the groups, so nothing imports back.
"""

from __future__ import annotations

from types import ModuleType

from gpupool.spec.model import Description
from policies import cluster, compute, hygiene, network, stack, storage
from policies.core import STACK, Policy, Stack, Violation

GROUP_MODULES: tuple[ModuleType, ...] = (storage, network, compute, cluster, hygiene, stack)
GROUPS = tuple(m.__name__.rpartition(".")[2] for m in GROUP_MODULES)


def _collect() -> dict[str, Policy]:
    found: dict[str, Policy] = {}
    for module, group in zip(GROUP_MODULES, GROUPS, strict=True):
        for p in (v for v in vars(module).values() if isinstance(v, Policy)):
            if p.name in found:
                raise ValueError(f"policy {p.name!r} is declared twice")
            if p.group != group:
                raise ValueError(f"policy {p.name!r} says group {p.group!r} but lives in "
                                 f"policies/{group}.py")
            found[p.name] = p
    return found


POLICIES = _collect()


def evaluate(stack_: Stack, desc: Description) -> list[Violation]:
    """Every violation of every policy, sorted by resource."""
    found: list[Violation] = []
    for p in POLICIES.values():
        if p.resource is not None:
            for r in stack_.resources:
                found += [Violation(r.urn, p.name, p.level.value, p.group, m)
                          for m in p.resource(r, desc)]
        if p.stack is not None:
            found += [Violation(urn or STACK, p.name, p.level.value, p.group, m)
                      for urn, m in p.stack(stack_, desc)]
    return sorted(found)
