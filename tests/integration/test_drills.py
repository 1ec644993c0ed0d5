"""The failure drills, on the lab's real Slurm with the project's roles (gpupool drill).

Every figure is recorded in bench/results/drills.json; what is asserted is the outcome
each drill promises (the job resumed, lost at most one checkpoint interval, ended with
the uninterrupted result), never a duration.
"""

from __future__ import annotations

from typing import Any

import pytest

import bench.drills
from gpupool.exercise import drills
from gpupool.lab import slurm_cluster
from gpupool.spec.model import Description

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def report(site: Any, lab_desc: Description) -> Any:
    """The session's lab, every role converged (fixture `site`); drills run once each."""
    s = slurm_cluster.ready(lab_desc)
    results: dict[str, Any] = {}
    try:
        yield lambda name: results.setdefault(name, drills.run(lab_desc, s, [name])[name])
    finally:
        bench.write("drills", results, f"pytest -m integration {bench.drills.TEST}")


@pytest.mark.parametrize("name", list(drills.DRILLS))
def test_drill(name: str, report: Any) -> None:
    r = report(name)
    assert r["result_parity"], r
    assert all(r["checks"].values()), r["checks"]
