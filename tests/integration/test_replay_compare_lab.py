"""`gpupool replay --compare` on the lab's real Slurm: the merge gate.

A short saturated sample of the Alibaba trace (12 pods, offered load 1.5) replayed under
the lab description's policy and under a revision of it with one compute node fewer and
the vision team's quota cut, gpupool's policy only (CI stays short: two replays, one
policy switch there and one back). Asserted: the report holds every figure's change, the
second run ran under the revision (its node drained, its quota in accounting), a budget
that must break (makespan may not grow at all, on a smaller saturated pool) exits with the
budget code naming it, and the lab is back on its own policy afterwards: gpupool's
slurm.conf, the role's team limits, every node resumed and idle.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool import cli
from gpupool.cli.output import EXIT_BUDGET
from gpupool.exercise import replay_run
from gpupool.lab import slurm_cluster
from gpupool.render import slurm
from gpupool.spec.model import Description
from tests.conftest import lab_description_path
from tests.test_audit import TRACE

pytestmark = pytest.mark.integration
SAMPLE = ("--alibaba", str(TRACE), "--jobs", "12", "--horizon", "20", "--load", "1.5",
          "--preemptible-first", "--timeout", "300")
DROPPED = "lab-gpu3"


@pytest.fixture(autouse=True)
def _lab(site: Any) -> None:
    """The session's lab, every role converged (fixture `site`); replay reuses it."""


def _smaller(path: Path) -> Path:
    raw = yaml.safe_load(lab_description_path().read_text())
    del raw["nodes"][DROPPED]
    raw["teams"]["vision"]["quota"]["l4"] = 4
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_smaller_pool_breaks_a_makespan_budget_and_the_lab_comes_back(
        tmp_path: Path, lab_desc: Description) -> None:
    other = _smaller(tmp_path / "smaller.yaml")
    rc = cli.main(["replay", "--file", str(lab_description_path()), "--compare", str(other),
                   "--budget", "makespan_s=+0", "--budget", "completed=-0",
                   "--out", str(tmp_path / "report"), *SAMPLE])
    run = json.loads((tmp_path / "report" / "compare.json").read_text())
    print(json.dumps({"changes": run["changes"], "budgets": run["budgets"]}, indent=1))
    assert rc == EXIT_BUDGET, run
    assert run["broken"] == ["makespan_s=+0"], run
    for label, m in run["policies"].items():
        assert m["completed"] == m["jobs"] == run["jobs"] - m["not_runnable"], label
    changes = {c["figure"]: c for c in run["changes"]}
    assert changes["makespan_s"]["change"] > 0, changes
    for figure in ("gpu_utilization_saturated", "work_lost_gpu_s", "completed"):
        assert figure in changes, changes
    assert any(f.endswith(".wait_p95") for f in changes), changes
    # The second run ran under the revision: its node drained, its quota in accounting.
    before, after = run["policies"]["before"]["in_force"], run["policies"]["after"]["in_force"]
    assert before["drained"] == [] and after["drained"] == [DROPPED], run["policies"]
    assert "gres/gpu:l4=12" in after["team_limits"]["vision"], after
    assert "gres/gpu:l4=16" in before["team_limits"]["vision"], before
    assert (tmp_path / "report" / "compare.md").read_text().count("makespan_s") >= 2

    # The lab is back on its own policy, every node resumed.
    s = slurm_cluster.SlurmLab(lab_desc)
    assert replay_run.gpupool_conf(s) is not None
    assert replay_run.drained_by_compare(s) == []
    states = s.node_states()
    assert all(states.get(n) == "idle" for n in slurm_cluster.onprem_nodes(lab_desc)), states
    limits = replay_run.team_limits(s)
    for lim in slurm.accounting(lab_desc)["limits"]:
        assert sorted(limits[lim["account"]].split(",")) == sorted(lim["GrpTRES"].split(",")), \
            limits
