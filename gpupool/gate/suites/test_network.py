"""Network checks: segment MTUs, and every declared flow into this node open and every
other one closed.

The probes run on a peer (one per segment this node sits on) toward this node's address
on that segment, so what they find is this node's own firewall. They go only to the
pool's own hosts. A closed port must be filtered (the firewall drops), not merely without
a listener: an open-but-refused port still reaches the host's stack.
"""

from __future__ import annotations

import json

import pytest
import testinfra

from gpupool.gate.actions import Action
from gpupool.gate.expect import NodeExpect
from gpupool.gate.plugin import Measure

PROBE_TIMEOUT_S = 2
# bash's /dev/tcp: exit 0 connected, 1 refused (reachable), 124 timed out (filtered).
PROBE_SCRIPT = """for spec in {specs}; do
  ( ip=${{spec%:*}}; port=${{spec#*:}}
    timeout {timeout} bash -c "exec 3<>/dev/tcp/$ip/$port" 2>/dev/null; echo "$spec $?" ) &
done; wait"""


def _peer_host(request: pytest.FixtureRequest, peer: str):  # type: ignore[no-untyped-def]
    """The peer, reached the way the node under test is (the same inventory)."""
    spec = request.config.getoption("--hosts")
    if not spec.startswith("ansible://"):
        pytest.skip("peers are reached through an inventory (ansible://NODE?...)")
    node = request.config.getoption("--gate-node")
    return testinfra.get_host(spec.replace(f"ansible://{node}?", f"ansible://{peer}?", 1))


@pytest.fixture(scope="module")
def probe_results(request: pytest.FixtureRequest, expect: NodeExpect) -> dict[str, str]:
    """(peer, address:port) -> open | refused | filtered."""
    if not expect.probes:
        pytest.skip("no peers share a segment with this node")
    state = {"0": "open", "1": "refused", "124": "filtered"}
    results: dict[str, str] = {}
    for peer in sorted({p.peer for p in expect.probes}):
        specs = sorted({f"{p.address}:{p.port}" for p in expect.probes if p.peer == peer})
        out = _peer_host(request, peer).run(
            PROBE_SCRIPT.format(specs=" ".join(specs), timeout=PROBE_TIMEOUT_S))
        for line in out.stdout.splitlines():
            if line.strip():
                spec, rc = line.split()
                results[f"{peer}>{spec}"] = state.get(rc, f"rc={rc}")
    return results


def test_interface_mtu(host, expect: NodeExpect, measure: Measure) -> None:  # type: ignore[no-untyped-def]
    links = json.loads(host.check_output("ip -j addr show"))
    mtu_of = {a["local"]: link["mtu"] for link in links for a in link.get("addr_info", [])}
    got = {seg: mtu_of.get(addr) for seg, addr in expect.addresses.items()}
    measure(got, expect.mtu, got == expect.mtu, action=Action.RECONFIGURE.value)


@pytest.mark.tier("standard")
@pytest.mark.action(Action.RECONFIGURE)
def test_declared_flows_open(expect: NodeExpect, probe_results: dict[str, str],
                             measure: Measure) -> None:
    blocked = sorted(p.id for p in expect.probes if p.allowed
                     and probe_results.get(f"{p.peer}>{p.address}:{p.port}") == "filtered")
    measure(blocked, [], not blocked, f"declared flows blocked: {blocked}")


@pytest.mark.tier("standard")
@pytest.mark.action(Action.RECONFIGURE)
def test_undeclared_flows_closed(expect: NodeExpect, probe_results: dict[str, str],
                                 measure: Measure) -> None:
    leaking = sorted(p.id for p in expect.probes if not p.allowed
                     and probe_results.get(f"{p.peer}>{p.address}:{p.port}") != "filtered")
    measure(leaking, [], not leaking, f"reachable without a declared flow: {leaking}")
