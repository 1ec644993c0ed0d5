"""The policy model shared by the CrossGuard pack and the offline runner.

A policy is a plain function over resources as the Pulumi engine sees them (type, name,
URN, inputs with engine names) and the pool description. The CrossGuard adapter
(policies.pack) and the offline runner (policies.offline) call the same functions.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpupool.spec.model import Description


class Level(StrEnum):
    MANDATORY = "mandatory"  # blocks preview/up; `gpupool policy` exits 1
    ADVISORY = "advisory"  # reported, does not block


@dataclass(frozen=True)
class Res:
    """One resource: engine type token, logical name, URN and inputs."""

    type: str
    name: str
    urn: str
    props: Mapping[str, Any]


@dataclass(frozen=True)
class Stack:
    """What a whole-stack policy sees."""

    resources: list[Res]
    # Stack config: key -> (value, declared as a Pulumi secret?)
    config: Mapping[str, tuple[Any, bool]] = field(default_factory=dict)

    def of_type(self, *suffixes: str) -> list[Res]:
        return [r for r in self.resources if r.type.endswith(suffixes)]


ResourceCheck = Callable[[Res, Description], Iterable[str]]
StackCheck = Callable[[Stack, Description], Iterable[tuple[str | None, str]]]


@dataclass(frozen=True)
class Policy:
    name: str
    group: str
    level: Level
    description: str
    resource: ResourceCheck | None = None
    stack: StackCheck | None = None


def resource_policy(name: str, group: str, level: Level, description: str,
                    types: tuple[str, ...] = ()) -> Callable[[ResourceCheck], Policy]:
    """Declare a per-resource check; with types, it only sees resources of those types."""
    def declare(fn: ResourceCheck) -> Policy:
        def check(r: Res, desc: Description) -> Iterable[str]:
            return fn(r, desc) if not types or r.type in types else ()

        return Policy(name, group, level, description, resource=check)

    return declare


def stack_policy(name: str, group: str, level: Level, description: str
                 ) -> Callable[[StackCheck], Policy]:
    """Declare a whole-stack check."""
    def declare(fn: StackCheck) -> Policy:
        return Policy(name, group, level, description, stack=fn)

    return declare


@dataclass(frozen=True, order=True)
class Violation:
    resource: str  # URN, or "stack" for the stack as a whole
    policy: str
    level: str
    group: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"resource": self.resource, "policy": self.policy, "level": self.level,
                "group": self.group, "message": self.message}


STACK = "stack"


# --- helpers for reading engine inputs ------------------------------------------------

def tags_of(r: Res) -> dict[str, str]:
    """AWS tags as a dict (autoscaling groups list them), Kubernetes labels unprefixed."""
    if r.type.startswith("kubernetes:"):
        labels = (r.props.get("metadata") or {}).get("labels") or {}
        return {k.removeprefix("gpupool.io/"): v for k, v in labels.items()}
    tags = r.props.get("tags") or {}
    if isinstance(tags, list):
        return {t.get("key"): t.get("value") for t in tags if isinstance(t, Mapping)}
    return dict(tags)


def by_tag(resources: Iterable[Res], key: str, value: str) -> list[Res]:
    return [r for r in resources if tags_of(r).get(key) == value]


def as_list(value: Any) -> list[Any]:
    """An IAM element that may be one value or a list of them, as a list."""
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def policy_statements(document: Any) -> list[Mapping[str, Any]]:
    """The statements of a policy input: a JSON string or an already parsed document."""
    if isinstance(document, str):
        document = json.loads(document)
    if not isinstance(document, Mapping):
        return []
    return [s for s in as_list(document.get("Statement")) if isinstance(s, Mapping)]


def walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, leaf) pairs of a nested input value."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from walk(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from walk(v, f"{path}[{i}]")
    else:
        yield path, value
