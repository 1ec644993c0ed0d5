"""Shared fixtures: the shipped stacks and helpers to mutate a description."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool import loader
from gpupool.model import Description

ROOT = Path(__file__).resolve().parent.parent


def lab_description() -> Description:
    """The lab the integration tests run on: the `lab` stack, or the description file
    GPUPOOL_LAB_DESCRIPTION names (a second lab with other addresses can then run beside
    the first one on the same machine)."""
    path = os.environ.get("GPUPOOL_LAB_DESCRIPTION")
    return loader.load_file(Path(path)) if path else loader.load_stack("lab", ROOT)


def raw_stack(stack: str) -> dict[str, Any]:
    return yaml.safe_load(loader.description_path(stack, ROOT).read_text())


def _split(path: str) -> list[str | int]:
    parts: list[str | int] = []
    for part in path.split("."):
        name, _, idx = part.partition("[")
        if name:
            parts.append(name)
        if idx:
            parts.append(int(idx.rstrip("]")))
    return parts


def mutate(data: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply {set: path, value: v} / {delete: path} operations to a copy of data.

    Paths use the same notation as error paths: `nodes.lab-gpu1.addresses.training`,
    `network.flows[0].ports`.
    """
    data = copy.deepcopy(data)
    for op in ops:
        key = "set" if "set" in op else "delete"
        *parents, last = _split(op[key])
        target: Any = data
        for p in parents:
            target = target[p]
        if key == "set":
            target[last] = op["value"]
        else:
            del target[last]
    return data


@pytest.fixture
def lab_raw() -> dict[str, Any]:
    return raw_stack("lab")
