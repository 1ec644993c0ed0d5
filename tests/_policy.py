"""Helpers to evaluate the policies over mutated program inputs (see tests/_pulumi.py for
the mocks fixture that records those inputs)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpupool.spec import loader
from gpupool.spec.model import Description
from policies import offline
from policies.catalog import evaluate
from policies.core import Res, Stack, Violation
from tests._pulumi import declared
from tests.conftest import ROOT

# The advisory list of what a lab description weakens (tests/test_lab_controls.py): every
# lab stack reports it, so checks that a lab stack passes leave it out.
LAB_POLICY = "hygiene-lab-weakened-controls"


def unlisted(found: list[Violation]) -> list[Violation]:
    """found without the lab's advisory list."""
    return [v for v in found if v.policy != LAB_POLICY]


def recorded(stack: str) -> Stack:
    """What the program declares for a shipped stack, with that stack's config."""
    return offline.as_stack(declared(stack), offline.stack_config(stack, ROOT))


def edit(stack: Stack, type_suffix: str, name: str,
         change: Callable[[dict[str, Any]], None]) -> Stack:
    """A copy of stack where the named resource's inputs went through change()."""
    hits = [r for r in stack.resources if r.type.endswith(type_suffix) and r.name == name]
    assert len(hits) == 1, (type_suffix, name)
    out = []
    for r in stack.resources:
        if r is hits[0]:
            props = copy.deepcopy(dict(r.props))
            change(props)
            r = Res(r.type, r.name, r.urn, props)  # noqa: PLW2901 - the edited copy
        out.append(r)
    return replace(stack, resources=out)


def drop(stack: Stack, type_suffix: str, name: str) -> Stack:
    kept = [r for r in stack.resources if not (r.type.endswith(type_suffix) and r.name == name)]
    assert len(kept) == len(stack.resources) - 1, (type_suffix, name)
    return replace(stack, resources=kept)


def add(stack: Stack, *resources: Res) -> Stack:
    """A copy of stack that also declares resources (which the program never does)."""
    return replace(stack, resources=[*stack.resources, *resources])


def violations(stack: Stack, desc: Description | str) -> list[Violation]:
    if isinstance(desc, str):
        desc = loader.load_stack(desc, ROOT)
    return evaluate(stack, desc)


def messages(found: list[Violation], policy: str) -> list[str]:
    return [v.message for v in found if v.policy == policy]
