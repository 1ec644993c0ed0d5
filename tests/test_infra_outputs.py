"""The components register every output they expose: what a caller reads of StorageTiers,
NetworkSegments, HybridLink, PrivateEgress, BurstImage, BurstPool, MungeKey and
ClusterServices (their public annotated attributes) is what each hands register_outputs,
the very values, so Pulumi's state and a stack reference see the same outputs as the
program (run under gpupool.preview.pulumi_mock, every shipped stack)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from gpupool.preview import plan
from gpupool.spec import loader
from infra.burst import BurstPool
from infra.cluster import ClusterServices
from infra.components import Component
from infra.hybrid import HybridLink, PrivateEgress
from infra.image import BurstImage
from infra.network import NetworkSegments
from infra.secrets import MungeKey
from infra.storage import StorageTiers
from tests.conftest import ROOT

CHECKED = (StorageTiers, NetworkSegments, HybridLink, PrivateEgress, BurstImage, BurstPool,
           MungeKey, ClusterServices)


def _public_outputs(kind: type[Component]) -> set[str]:
    return {a for a in kind.__annotations__ if not a.startswith("_")}


@pytest.mark.parametrize("stack", loader.stacks(ROOT))
def test_components_register_every_output_they_expose(stack: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[tuple[Component, dict[str, Any]]] = []
    original = Component.register_outputs

    def record(self: Component, outputs: Mapping[str, Any]) -> None:
        registered.append((self, dict(outputs)))
        original(self, outputs)

    monkeypatch.setattr(Component, "register_outputs", record)
    plan.declare(loader.load_stack(stack, ROOT), stack)
    seen: set[type[Component]] = set()
    for component, outputs in registered:
        kind = type(component)
        if kind not in CHECKED:
            continue
        seen.add(kind)
        assert set(outputs) == _public_outputs(kind), kind.__name__
        for name, value in outputs.items():
            assert value is getattr(component, name), (kind.__name__, name)
    assert seen == set(CHECKED)
