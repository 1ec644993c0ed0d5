"""Runs of the Pulumi program under mocks, shared by the infra and policy tests.

The mocks (gpupool.preview.pulumi_mock) stand in for the Pulumi engine and cloud APIs, which
cannot run here; they echo inputs and invent ids, so tests assert on inputs only.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from gpupool.preview import plan
from gpupool.preview.pulumi_mock import Declared, Run
from gpupool.spec import loader
from tests.conftest import ROOT, mutate, raw_stack


@functools.cache
def declared(stack: str) -> Run:
    return plan.declare(loader.load_stack(stack, ROOT), stack)


def declared_from(data: dict[str, Any], stack: str = "mutated") -> Run:
    return plan.declare(loader.parse(data), stack)


@functools.cache
def _declared_json(text: str) -> Run:
    return declared_from(json.loads(text))


def declared_mutated(stack: str, ops: list[dict[str, Any]]) -> Run:
    """The program's declaration for a mutated copy of a shipped stack (cached)."""
    return _declared_json(json.dumps(mutate(raw_stack(stack), ops), sort_keys=True))


def of_type(run: Run, suffix: str) -> list[Declared]:
    """Resources whose type ends with suffix, e.g. ':Bucket' or 'v1:Namespace'."""
    return [r for r in run.resources if r.type.endswith(suffix)]


def one(run: Run, suffix: str, name: str) -> Declared:
    found = [r for r in of_type(run, suffix) if r.name == name]
    assert len(found) == 1, (suffix, name, [r.name for r in of_type(run, suffix)])
    return found[0]
