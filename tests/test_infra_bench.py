"""The benchmark's synthetic pools are valid descriptions of the size they claim."""

from __future__ import annotations

from bench import plan as bench_plan
from gpupool.spec.facts import gpu_nodes


def test_synthetic_pools_are_valid_and_sized() -> None:
    desc = bench_plan.synthetic(40)
    assert len(gpu_nodes(desc)) == 40
    assert len(desc.teams) == 2
    assert all(sum(t.quota.values()) > 0 for t in desc.teams.values())
