"""Network checks: segment MTUs, and every declared flow into this node open and every
other one closed.

The probes run on a peer (one per segment this node sits on) toward this node's address
on that segment, so what they find is this node's own firewall. They go only to the
pool's own hosts. A closed port must be filtered (the firewall drops), not merely without
a listener: an open-but-refused port still reaches the host's stack.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import testinfra

from gpupool.gate import probes
from gpupool.gate.actions import Action
from gpupool.gate.expect import NodeExpect
from gpupool.gate.plugin import Measure


def _peer_host(request: pytest.FixtureRequest, peer: str):  # type: ignore[no-untyped-def]
    """The peer, reached the way the node under test is (the same inventory)."""
    spec = request.config.getoption("--hosts")
    if not spec.startswith("ansible://"):
        pytest.skip("peers are reached through an inventory (ansible://NODE?...), or "
                    "their probes' output is given (--gate-probes)")
    node = request.config.getoption("--gate-node")
    return testinfra.get_host(spec.replace(f"ansible://{node}?", f"ansible://{peer}?", 1))


@pytest.fixture(scope="module")
def probe_results(request: pytest.FixtureRequest, expect: NodeExpect) -> dict[str, str]:
    """(peer, address:port) -> open | refused | filtered: probed here from each peer, or
    read from the peers' output that role admission collected (--gate-probes)."""
    if not expect.probes:
        pytest.skip("no peers share a segment with this node")
    given = request.config.getoption("--gate-probes")
    if given:
        raw = json.loads(Path(given).read_text())
        outputs = {peer: str(raw.get(peer, "")) for peer in probes.commands(expect)}
        silent = sorted(peer for peer, out in outputs.items() if not probes.results(peer, out))
        if silent:  # as a peer the suite cannot reach: the checks error, they do not pass
            raise RuntimeError(f"no probe output from {', '.join(silent)}")
    else:
        outputs = {peer: _peer_host(request, peer).run(command).stdout
                   for peer, command in probes.commands(expect).items()}
    return {k: v for peer, out in outputs.items() for k, v in probes.results(peer, out).items()}


def test_interface_mtu(host, expect: NodeExpect, measure: Measure) -> None:  # type: ignore[no-untyped-def]
    links = json.loads(host.check_output("ip -j addr show"))
    mtu_of = {a["local"]: link["mtu"] for link in links for a in link.get("addr_info", [])}
    got = {seg: mtu_of.get(addr) for seg, addr in expect.addresses.items()}
    measure(got, expect.mtu, got == expect.mtu, action=Action.RECONFIGURE.value)


@pytest.mark.tier(probes.TIER)
@pytest.mark.action(Action.RECONFIGURE)
def test_declared_flows_open(expect: NodeExpect, probe_results: dict[str, str],
                             measure: Measure) -> None:
    blocked = sorted(p.id for p in expect.probes if p.allowed
                     and probe_results.get(f"{p.peer}>{p.address}:{p.port}") == "filtered")
    measure(blocked, [], not blocked, f"declared flows blocked: {blocked}")


@pytest.mark.tier(probes.TIER)
@pytest.mark.action(Action.RECONFIGURE)
def test_undeclared_flows_closed(expect: NodeExpect, probe_results: dict[str, str],
                                 measure: Measure) -> None:
    leaking = sorted(p.id for p in expect.probes if not p.allowed
                     and probe_results.get(f"{p.peer}>{p.address}:{p.port}") != "filtered")
    measure(leaking, [], not leaking, f"reachable without a declared flow: {leaking}")
