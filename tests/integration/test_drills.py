"""The failure drills, on the lab's real Slurm with the project's roles (gpupool drill).

Every figure is recorded in bench/results/drills.json; what is asserted is the outcome
each drill promises (the job resumed, lost at most one checkpoint interval, ended with
the uninterrupted result), never a duration.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pytest

from gpupool import drills, lab, loader, slurm_lab
from tests.conftest import ROOT

pytestmark = pytest.mark.integration
DESC = loader.load_stack("lab", ROOT)
RESULTS = ROOT / "bench" / "results" / "drills.json"


def _prerequisites() -> None:
    missing = [t for t in ("podman", "runc", "debootstrap") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"lab hosts need {', '.join(missing)} (scripts/bootstrap.sh installs them)")
    if os.geteuid() != 0:
        pytest.skip("lab hosts need root (rootful podman)")


@pytest.fixture(scope="module")
def report() -> Any:
    _prerequisites()
    with lab.lab_lock():
        s, figures = slurm_lab.bring_up(DESC, site=True)
        results: dict[str, Any] = {"bring_up": figures}
        try:
            yield lambda name: results.setdefault(name, drills.run(DESC, s, [name])[name])
        finally:
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


@pytest.mark.parametrize("name", list(drills.DRILLS))
def test_drill(name: str, report: Any) -> None:
    r = report(name)
    assert r["result_parity"], r
    assert all(r["checks"].values()), r["checks"]
