"""A host is what it is, however a description writes it: facts.node_named matches a node's
name, its FQDN in the pool's domain and any of its addresses; facts.mount_servers reads the
servers of NFS and Lustre sources (brackets, NIDs, failover lists)."""

from __future__ import annotations

import pytest

from gpupool.spec import facts, loader
from tests.conftest import ROOT


@pytest.mark.parametrize(("source", "servers"), [
    ("lab-filer:/export/x", ["lab-filer"]),
    ("[fd00::1]:/export/x", ["fd00::1"]),
    ("10.0.0.1@tcp:10.0.0.2@o2ib:/scratch", ["10.0.0.1", "10.0.0.2"]),
    ("10.0.0.1@tcp,10.0.0.3@tcp:10.0.0.2@tcp:/fs", ["10.0.0.1", "10.0.0.3", "10.0.0.2"]),
    (":/nothing", []), ("", []),
])
def test_mount_servers(source: str, servers: list[str]) -> None:
    assert facts.mount_servers(source) == servers


@pytest.mark.parametrize(("host", "node"), [
    ("lab-ctl2", "lab-ctl2"), ("LAB-CTL2", "lab-ctl2"),
    ("lab-ctl2.lab.gpupool.internal", "lab-ctl2"), ("lab-ctl2.lab.gpupool.internal.", "lab-ctl2"),
    ("10.231.20.20", "lab-ctl2"), ("10.231.30.20", "lab-ctl2"), ("[10.231.30.20]", "lab-ctl2"),
    ("lab-ctl2.elsewhere.example", None), ("10.231.20.254", None), ("", None),
    ("lab-ctl2.lab.gpupool.internal.x", None), ("010.231.20.20", None),
])
def test_node_named(host: str, node: str | None) -> None:
    assert facts.node_named(loader.load_stack("lab", ROOT), host) == node
