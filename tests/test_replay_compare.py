"""`gpupool replay --compare`, the merge gate, without the lab: the change in each figure,
budgets (parsing, verdicts, no evidence), the compared description's fit to the lab, its
slurm.conf, and the command's refusals before the lab is touched."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool import cli
from gpupool.cli.commands import replay as replay_cmd
from gpupool.cli.output import EXIT_BUDGET, EXIT_INVALID, EXIT_USAGE
from gpupool.exercise import replay_run
from gpupool.lab import hosts
from gpupool.lab.slurm_cluster import SlurmLabError
from gpupool.render import slurm
from gpupool.spec import budgets, loader
from gpupool.workload import replay_compare as rc
from tests.conftest import ROOT
from tests.test_replay import FileSlurm

CLASSES = {"interactive", "training", "deferred"}


def _metrics(makespan: float | None = 100.0, util: float | None = 0.9,
             waits: dict[str, float] | None = None, completed: int = 10) -> dict[str, Any]:
    return {"gpu_utilization_saturated": util, "makespan_s": makespan,
            "work_lost_gpu_s": 0.0, "work_lost_share": 0.0, "completed": completed,
            "failed_share": 0.0, "preemptions_and_requeues": 2, "not_runnable": 0,
            "wait_s": {c: {"p50": w / 2, "p95": w, "n": 3}
                       for c, w in (waits or {"interactive": 10.0}).items()}}


@pytest.mark.parametrize(("text", "figure", "direction", "amount", "relative"), [
    ("interactive.wait_p95=+10%", "interactive.wait_p95", 1, 10.0, True),
    ("makespan_s=+0", "makespan_s", 1, 0.0, False),
    (" gpu_utilization_saturated = -5.5% ", "gpu_utilization_saturated", -1, 5.5, True),
    ("completed=-0", "completed", -1, 0.0, False),
    ("training.wait_p50=+.5", "training.wait_p50", 1, 0.5, False),
])
def test_a_budget_reads_figure_direction_and_amount(text: str, figure: str, direction: int,
                                                    amount: float, relative: bool) -> None:
    b = budgets.parse_option(text, CLASSES)
    assert (b.figure, b.direction, b.amount, b.relative) == (figure, direction, amount,
                                                             relative)
    assert budgets.parse_option(b.text(), CLASSES) == b  # what the report says reads back


@pytest.mark.parametrize(("text", "says"), [
    ("makespan=+10%", "--budget makespan: unknown figure 'makespan'"),
    ("batch.wait_p95=+10%", "unknown figure 'batch.wait_p95'"),
    ("interactive.wait_p99=+10%", "unknown figure"),
    ("makespan_s=10%", "is not +N%, -N%, +N or -N"),
    ("makespan_s=+-10%", "is not +N%"),
    ("makespan_s=+nan%", "is not +N%"),
    ("makespan_s=+inf", "is not +N%"),
    ("makespan_s=+1e3%", "is not +N%"),
    ("makespan_s=+", "is not +N%"),
    ("makespan_s=+5000%", "beyond 1000%"),
    ("makespan_s=+99999999999", "beyond"),
    ("makespan_s", "expected FIGURE=LIMIT"),
    ("\x1b[2J=+1", "unknown figure"),
])
def test_a_malformed_budget_is_refused_naming_it(text: str, says: str) -> None:
    with pytest.raises(budgets.BudgetError, match=None) as exc:
        budgets.parse_option(text, CLASSES)
    assert says in str(exc.value), str(exc.value)


def test_a_declared_budget_is_named_by_its_field() -> None:
    with pytest.raises(budgets.BudgetError, match=r"^replay_budgets\.makespan_s: limit 'ten'"):
        budgets.parse_budget("makespan_s", "ten", CLASSES, "replay_budgets.makespan_s")


def test_the_command_line_replaces_a_declared_budget_of_the_same_figure_and_direction() -> None:
    declared = [budgets.parse_budget("makespan_s", "+10%", CLASSES, "replay_budgets.makespan_s"),
                budgets.parse_budget("makespan_s", "-50%", CLASSES, "replay_budgets.makespan_s"),
                budgets.parse_budget("completed", "-0", CLASSES, "replay_budgets.completed")]
    given = [budgets.parse_option("makespan_s=+0", CLASSES)]
    assert [b.text() for b in rc.merge(declared, given)] == [
        "makespan_s=-50%", "completed=-0", "makespan_s=+0"]


def test_each_figure_changes_absolutely_and_relatively() -> None:
    before = _metrics(100.0, 0.8, {"interactive": 10.0, "training": 0.0})
    after = _metrics(130.0, 0.9, {"interactive": 12.0, "training": 4.0}, completed=9)
    ch = {c["figure"]: c for c in rc.changes(before, after)}
    assert ch["makespan_s"] == {"figure": "makespan_s", "before": 100.0, "after": 130.0,
                                "change": 30.0, "relative": 0.3}
    assert ch["interactive.wait_p95"]["relative"] == 0.2
    assert ch["interactive.wait_p50"]["change"] == 1.0
    assert ch["gpu_utilization_saturated"]["change"] == 0.1
    assert ch["completed"]["change"] == -1
    # From 0 a relative change is no number; the absolute one still is.
    assert ch["training.wait_p95"]["change"] == 4.0 and ch["training.wait_p95"]["relative"] is None


def test_a_figure_only_one_run_has_changes_by_nothing_known() -> None:
    before = _metrics(util=None, waits={"interactive": 5.0})
    after = _metrics(util=0.7, waits={"deferred": 3.0})
    ch = {c["figure"]: c for c in rc.changes(before, after)}
    assert ch["gpu_utilization_saturated"]["change"] is None
    assert ch["interactive.wait_p95"]["after"] is None
    assert ch["deferred.wait_p95"] == {"figure": "deferred.wait_p95", "before": None,
                                       "after": 3.0, "change": None, "relative": None}


def _check(text: str, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return rc.check(budgets.parse_option(text, CLASSES), before, after)


def test_a_budget_breaks_only_beyond_its_limit() -> None:
    before, after = _metrics(waits={"interactive": 10.0}), _metrics(waits={"interactive": 11.0})
    assert _check("interactive.wait_p95=+10%", before, after)["broken"] is False  # exactly 10%
    broke = _check("interactive.wait_p95=+5%", before, after)
    assert broke["broken"] is True
    assert broke["why"] == "grew from 10 to 11, more than the 0.5 allowed"
    assert _check("interactive.wait_p95=+1", before, after)["broken"] is False
    # A growth budget says nothing of a shrink, and the other way round.
    assert _check("interactive.wait_p95=-0", before, after)["broken"] is False
    assert _check("interactive.wait_p95=+0", after, before)["broken"] is False
    assert _check("completed=-0", _metrics(completed=10), _metrics(completed=9))["broken"]
    assert _check("completed=-0", _metrics(), _metrics())["why"] == "unchanged at 10"
    assert _check("gpu_utilization_saturated=-5%", _metrics(util=0.9),
                  _metrics(util=0.85))["broken"] is True


def test_a_relative_budget_on_a_figure_that_was_zero_allows_no_growth() -> None:
    before, after = _metrics(waits={"interactive": 0.0}), _metrics(waits={"interactive": 0.5})
    assert _check("interactive.wait_p95=+50%", before, after)["broken"] is True
    assert _check("interactive.wait_p95=+50%", before, before)["broken"] is False


def test_no_evidence_is_neither_pass_nor_fail_and_fails_the_gate_only_when_strict() -> None:
    before, after = _metrics(waits={"training": 5.0}), _metrics(waits={"training": 5.0})
    res = [_check("interactive.wait_p95=+10%", before, after),
           _check("training.wait_p95=+10%", before, after)]
    assert res[0]["broken"] is None and res[0]["why"].startswith("no evidence: neither run")
    assert rc.verdict(res, strict=False) == []
    assert rc.verdict(res, strict=True) == [res[0]]
    one = _check("gpu_utilization_saturated=-5%", _metrics(util=None), _metrics())
    assert one["broken"] is None and "one run" in one["why"]


def test_nan_never_reaches_a_verdict_as_a_pass() -> None:
    # The figures come from replay.metrics (rounded numbers or None); a NaN budget is
    # refused before any replay (test_a_malformed_budget_is_refused_naming_it).
    assert not math.isnan(budgets.MAX_PERCENT)
    with pytest.raises(budgets.BudgetError):
        budgets.parse_budget("makespan_s", "+NaN", CLASSES, "replay_budgets.makespan_s")


# The compared description on the lab's hosts.

def _raw() -> dict[str, Any]:
    return yaml.safe_load(loader.description_path("lab", ROOT).read_text())


def _desc(raw: dict[str, Any]) -> Any:
    return loader.parse(raw)


def test_a_smaller_pool_drains_the_nodes_it_lacks_and_a_larger_one_is_refused() -> None:
    lab = _desc(_raw())
    smaller = _raw()
    del smaller["nodes"]["lab-gpu3"]
    assert replay_run.compared_nodes(lab, _desc(smaller)) == ["lab-gpu3"]
    assert replay_run.compared_nodes(lab, lab) == []
    with pytest.raises(SlurmLabError, match="nodes the lab has not: lab-gpu3"):
        replay_run.compared_nodes(_desc(smaller), lab)


def test_a_compared_description_must_keep_the_lab_hosts_as_they_are() -> None:
    lab = _desc(_raw())
    moved = _raw()
    node = moved["nodes"]["lab-gpu2"]
    node["addresses"] = {k: v.replace(".12", ".99") for k, v in node["addresses"].items()}
    with pytest.raises(SlurmLabError, match="declares lab-gpu2 otherwise than the lab"):
        replay_run.compared_nodes(lab, _desc(moved))


def test_the_compared_policy_is_the_other_descriptions_on_the_lab_hosts() -> None:
    lab = _desc(_raw())
    other_raw = _raw()
    del other_raw["nodes"]["lab-gpu3"]
    other_raw["teams"]["vision"]["quota"]["l4"] = 4
    other_raw["task_classes"]["training"]["priority"] = 700
    other = _desc(other_raw)
    saved = "\n".join(["# daemon settings", "SlurmUser=slurm", replay_run.POLICY_HEAD,
                       *slurm.slurm_conf(lab)]) + "\n"
    conf = replay_run.compare_conf(lab, other, saved)
    lines = conf.splitlines()
    assert lines[:3] == [replay_run.COMPARE_MARK, "# daemon settings", "SlurmUser=slurm"]
    assert lines[3:] == [replay_run.POLICY_HEAD,
                         *slurm.slurm_conf(replay_run.policy_of(lab, other))]
    parts = slurm.records(lines, "PartitionName")
    assert parts["training"]["PriorityTier"] == "700"
    # Every lab node stays declared (the one left out is drained, not unknown to Slurm).
    assert set(slurm.records(lines, "NodeName")) == set(slurm.records(saved.splitlines(),
                                                                      "NodeName"))
    limits = {lim["account"]: lim["GrpTRES"]
              for lim in slurm.accounting(replay_run.policy_of(lab, other))["limits"]}
    assert "gres/gpu:l4=12" in limits["vision"]
    with pytest.raises(SlurmLabError, match="has no line"):
        replay_run.compare_conf(lab, other, "SlurmUser=slurm\n")


def test_the_compared_conf_is_undone_byte_for_byte(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = _desc(_raw())
    fs = FileSlurm(lab, tmp_path)
    saved = "\n".join(["SlurmUser=slurm", replay_run.POLICY_HEAD, *slurm.slurm_conf(lab)])
    for node in lab.nodes:
        (tmp_path / node / "slurm.conf").write_text(saved)
    monkeypatch.setattr(replay_run, "_restart_all", lambda s: None)
    monkeypatch.setattr(replay_run, "playbook", lambda *a: pytest.fail("the role replayed"))
    for node in lab.nodes:
        fs.write(replay_run.CONF, replay_run.compare_conf(lab, lab, saved), node=node)
    assert replay_run.gpupool_conf(fs) is None  # not gpupool's own policy in force
    replay_run.use_policy(fs, "gpupool", saved)
    for node in lab.nodes:
        assert (tmp_path / node / "slurm.conf").read_text() == saved


# The command: refusals before the lab is touched.

@pytest.fixture
def no_lab(monkeypatch: pytest.MonkeyPatch) -> None:
    def touched() -> None:
        pytest.fail("the lab was touched")

    monkeypatch.setattr(hosts, "lab_lock", touched)
    monkeypatch.setattr(replay_cmd.hosts, "lab_lock", touched)


def _write(path: Path, raw: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _main(*argv: str) -> int:
    return cli.main(["replay", "--file", str(loader.description_path("lab", ROOT)), *argv])


@pytest.mark.usefixtures("no_lab")
def test_budget_without_compare_and_compare_with_the_baseline_are_usage_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _main("--budget", "makespan_s=+0") == EXIT_USAGE
    other = _write(tmp_path / "o.yaml", _raw())
    assert _main("--compare", str(other), "--policies", "baseline") == EXIT_USAGE
    assert "the baseline is not compared" in capsys.readouterr().err


@pytest.mark.usefixtures("no_lab")
@pytest.mark.parametrize(("budget", "says"), [
    ("interactive.wait_p95=+ten%", "--budget interactive.wait_p95: limit"),
    ("queue_depth=+1", "--budget queue_depth: unknown figure"),
    ("makespan_s=+1e9999", "is not +N%"),
])
def test_a_malformed_budget_option_is_a_message_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], budget: str, says: str) -> None:
    other = _write(tmp_path / "o.yaml", _raw())
    assert _main("--compare", str(other), "--budget", budget) == EXIT_INVALID
    said = capsys.readouterr().err
    assert says in " ".join(said.split()) and "Traceback" not in said


@pytest.mark.usefixtures("no_lab")
def test_declared_budgets_are_checked_naming_their_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = _raw()
    raw["replay_budgets"] = {"interactive.wait_p95": "+10%", "makespan_s": "-1e400"}
    mine = _write(tmp_path / "mine.yaml", raw)
    other = _write(tmp_path / "o.yaml", _raw())
    rc_ = cli.main(["replay", "--file", str(mine), "--compare", str(other)])
    assert rc_ == EXIT_INVALID
    # Refused when the description is read, before the lab is touched (rule replay-budget).
    assert ("replay_budgets.makespan_s: [replay-budget] limit '-1e400'"
            in " ".join(capsys.readouterr().err.split()))
    raw["replay_budgets"] = ["makespan_s=+0"]
    assert cli.main(["replay", "--file", str(_write(mine, raw)), "--compare",
                     str(other)]) == EXIT_INVALID
    assert "replay_budgets" in capsys.readouterr().err


@pytest.mark.usefixtures("no_lab")
def test_the_compared_description_is_loaded_and_fitted_as_any(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _raw()
    bad["teams"]["vision"]["quota"]["l4"] = -1
    assert _main("--compare", str(_write(tmp_path / "bad.yaml", bad))) == EXIT_INVALID
    assert "bad.yaml" in capsys.readouterr().err
    assert _main("--compare", str(tmp_path / "missing.yaml")) == EXIT_INVALID
    (tmp_path / "bomb.yaml").write_text("a: &a [*a, *a]\n" * 3)
    assert _main("--compare", str(tmp_path / "bomb.yaml")) == EXIT_INVALID
    bigger = _raw()
    extra = dict(bigger["nodes"]["lab-gpu3"])
    extra["addresses"] = {k: v.replace(".13", ".14") for k, v in extra["addresses"].items()}
    bigger["nodes"]["lab-gpu4"] = extra
    path = _write(tmp_path / "bigger.yaml", bigger)
    try:
        loader.load_file(path)
    except loader.DescriptionError:
        pytest.skip("a fourth lab node does not validate here")
    assert _main("--compare", str(path)) == EXIT_INVALID
    assert "nodes the lab has not: lab-gpu4" in capsys.readouterr().err


def test_the_budget_exit_code_is_its_own() -> None:
    assert EXIT_BUDGET not in (0, EXIT_INVALID, EXIT_USAGE, 3, 70)
