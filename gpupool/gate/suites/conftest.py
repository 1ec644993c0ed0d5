"""Fixtures shared by the gate suites (the plugin supplies `expect` and `measure`)."""

from __future__ import annotations

import pytest

from gpupool.gate.expect import NodeExpect


@pytest.fixture(scope="module")
def in_container(host) -> bool:  # type: ignore[no-untyped-def]
    """Lab hosts are containers: kernel-level checks are rendered there, not applied."""
    return host.run("systemd-detect-virt --container --quiet").rc == 0


@pytest.fixture(scope="module")
def gpu_expect(expect: NodeExpect):  # type: ignore[no-untyped-def]
    if expect.gpu is None:
        pytest.skip(f"node class {expect.node_class} has no GPUs")
    return expect.gpu
