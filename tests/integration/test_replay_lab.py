"""`gpupool replay` on the lab's real Slurm: a synthetic saturated trace and a sample of
the Alibaba GPU trace, each under gpupool's policy and the manual-allocation baseline.

Small traces keep CI short; `make bench` replays bigger ones. Figures go to the report;
what is asserted is that every job of both policies completed and the report was written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpupool import cli
from tests.conftest import lab_description_path
from tests.test_audit import TRACE

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _lab(site: Any) -> None:
    """The session's lab, every role converged (fixture `site`); replay reuses it."""


def _replay(tmp_path: Path, *args: str) -> dict:
    rc = cli.main(["replay", "--file", str(lab_description_path()),
                   "--out", str(tmp_path / "report"), *args])
    run = json.loads((tmp_path / "report" / "replay.json").read_text())
    assert rc == cli.EXIT_OK, run
    assert set(run["policies"]) == {"gpupool", "baseline"}
    for policy, m in run["policies"].items():
        assert m["completed"] == m["jobs"] == run["jobs"], policy
    for name in ("replay.md", "utilization.png", "waits.png", "replay.json"):
        assert (tmp_path / "report" / name).stat().st_size > 0
    return run


def test_synthetic_saturated_trace(tmp_path: Path) -> None:
    run = _replay(tmp_path, "--jobs", "24", "--horizon", "45", "--load", "1.5")
    # Preemptible work was preempted and requeued under gpupool's policy only.
    assert run["policies"]["baseline"]["preemptions_and_requeues"] == 0


def test_alibaba_sample(tmp_path: Path) -> None:
    _replay(tmp_path, "--alibaba", str(TRACE), "--jobs", "20", "--horizon", "45")
