"""Network checks: segment MTUs, and every declared flow open / every other one closed.

Probes go only to the pool's own hosts, on segments both ends sit on. A closed port must
be filtered (the firewall drops), not merely without a listener: an open-but-refused port
still reaches the host's stack.
"""

from __future__ import annotations

import json

import pytest

from gpupool.gate.actions import Action
from gpupool.gate.expect import NodeExpect
from gpupool.gate.plugin import Measure

PROBE_TIMEOUT_S = 2
# bash's /dev/tcp: exit 0 connected, 1 refused (reachable), 124 timed out (filtered).
PROBE_SCRIPT = """for spec in {specs}; do
  ( ip=${{spec%:*}}; port=${{spec#*:}}
    timeout {timeout} bash -c "exec 3<>/dev/tcp/$ip/$port" 2>/dev/null; echo "$spec $?" ) &
done; wait"""


@pytest.fixture(scope="module")
def probe_results(host, expect: NodeExpect) -> dict[str, str]:  # type: ignore[no-untyped-def]
    if not expect.probes:
        pytest.skip("no peers share a segment with this node")
    specs = sorted({f"{p.address}:{p.port}" for p in expect.probes})
    out = host.run(PROBE_SCRIPT.format(specs=" ".join(specs), timeout=PROBE_TIMEOUT_S))
    state = {"0": "open", "1": "refused", "124": "filtered"}
    return {spec: state.get(rc, f"rc={rc}") for spec, rc in
            (line.split() for line in out.stdout.splitlines() if line.strip())}


def test_interface_mtu(host, expect: NodeExpect, measure: Measure) -> None:  # type: ignore[no-untyped-def]
    links = json.loads(host.check_output("ip -j addr show"))
    mtu_of = {a["local"]: link["mtu"] for link in links for a in link.get("addr_info", [])}
    got = {seg: mtu_of.get(addr) for seg, addr in expect.addresses.items()}
    measure(got, expect.mtu, got == expect.mtu, action=Action.RECONFIGURE.value)


@pytest.mark.tier("standard")
@pytest.mark.action(Action.RECONFIGURE)
def test_declared_flows_open(expect: NodeExpect, probe_results: dict[str, str],
                             measure: Measure) -> None:
    blocked = sorted(p.id for p in expect.probes
                     if p.allowed and probe_results.get(f"{p.address}:{p.port}") == "filtered")
    measure(blocked, [], not blocked, f"declared flows blocked: {blocked}")


@pytest.mark.tier("standard")
@pytest.mark.action(Action.RECONFIGURE)
def test_undeclared_flows_closed(expect: NodeExpect, probe_results: dict[str, str],
                                 measure: Measure) -> None:
    leaking = sorted(p.id for p in expect.probes
                     if not p.allowed and probe_results.get(f"{p.address}:{p.port}") != "filtered")
    measure(leaking, [], not leaking, f"reachable without a declared flow: {leaking}")
