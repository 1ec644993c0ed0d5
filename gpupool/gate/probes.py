"""The firewall probes of the network suite: one shell command per peer, run on the peer
toward the node's addresses, and what its output says.

Why a module of its own: the probes must run on a peer, never on the node under test (what
they find is the node's own firewall). Gated from the control host, the suite runs them on
the peer through the same inventory; gated on the node (gpupool/gate/onnode.py), role
admission runs the same commands on the peers (`gpupool gate --print-probes`) and hands
their output to the suite (`--gate-probes`).
"""

from __future__ import annotations

from gpupool.gate.expect import NodeExpect

TIER = "standard"  # the lowest tier whose checks read the probes (suites/test_network.py)
TIMEOUT_S = 2
# bash's /dev/tcp: exit 0 connected, 1 refused (reachable), 124 timed out (filtered).
SCRIPT = """for spec in {specs}; do
  ( ip=${{spec%:*}}; port=${{spec#*:}}
    timeout {timeout} bash -c "exec 3<>/dev/tcp/$ip/$port" 2>/dev/null; echo "$spec $?" ) &
done; wait"""
STATE = {"0": "open", "1": "refused", "124": "filtered"}


def commands(expect: NodeExpect) -> dict[str, str]:
    """peer -> the command that probes this node from it. Addresses and ports come from
    the description, whose rules constrain them to IP addresses and port numbers."""
    return {peer: SCRIPT.format(specs=" ".join(sorted({f"{p.address}:{p.port}"
                                                      for p in expect.probes if p.peer == peer})),
                                timeout=TIMEOUT_S)
            for peer in sorted({p.peer for p in expect.probes})}


def results(peer: str, output: str) -> dict[str, str]:
    """'peer>address:port' -> open | refused | filtered (rc=N for anything else), from one
    peer's output; lines that are not `SPEC RC` are skipped."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) == 2:
            found[f"{peer}>{fields[0]}"] = STATE.get(fields[1], f"rc={fields[1][:8]}")
    return found
