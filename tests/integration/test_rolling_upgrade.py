"""The rolling driver upgrade on the lab stops at the first node that fails its gate and
leaves the rest serving."""

from __future__ import annotations

import time
from typing import Any

import pytest

import bench.rolling_upgrade
from gpupool.lab import slurm_cluster
from tests.conftest import lab_description

pytestmark = pytest.mark.integration
DESC = lab_description()
COMPUTE = [n for n, node in DESC.nodes.items() if "compute" in node.roles]
OOPS = "/etc/ssh/sshd_config.d/00-oops.conf"


def test_rollout_stops_at_the_failing_node(site: Any) -> None:
    first, broken, rest = COMPUTE[0], COMPUTE[1], COMPUTE[2:]
    s = slurm_cluster.ready(DESC)
    s.sh(f"printf 'PasswordAuthentication yes\\n' > {OOPS}", node=broken)
    try:
        t = time.monotonic()
        proc = slurm_cluster.playbook(DESC, "rolling_driver_upgrade.yml")
        took = round(time.monotonic() - t, 1)
        states = s.node_states()
        reason = s.sh(f"sinfo -h -n {broken} -o %E").strip()
    finally:
        s.sh(f"rm -f {OOPS}", node=broken)
        slurm_cluster.playbook(DESC, "gate.yml")  # bring the repaired node back
    bench.write("rolling_upgrade", {"rollout_s": took, "states": states, "reason": reason},
                f"pytest -m integration {bench.rolling_upgrade.TEST}")
    assert proc.returncode != 0, "the rollout must stop at the failing node"
    assert states[first] == "idle", states  # upgraded, gated, resumed
    assert "drain" in states[broken] and "system.sshd_hardened" in reason, (states, reason)
    for node in rest:  # never reached (the first step on a node drains it): still serving
        assert states[node] == "idle", states
