"""Replay metrics over run records, and the baseline configuration."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpupool.exercise import replay_run
from gpupool.lab.slurm_cluster import SlurmLab, SlurmLabError
from gpupool.spec import loader
from gpupool.workload import replay, replay_report, trace
from tests.conftest import ROOT


def run(job: str, cls: str, gpus: int, start: float, end: float,
        state: str = "COMPLETED") -> replay.Run:
    return replay.Run(job, cls, "vision", gpus, 0.0, start, end, state)


def test_metrics_on_a_hand_made_schedule() -> None:
    # 4 GPUs. a (2 GPUs, 10 s) and b (2 GPUs, 10 s) start at once; c (4 GPUs, 5 s) waits
    # for both; d (interactive, 1 GPU, 5 s) preempts nothing and waits behind c.
    demands = [replay.Demand("a", "training", 2, 0, 10), replay.Demand("b", "deferred", 2, 0, 10),
               replay.Demand("c", "training", 4, 1, 5), replay.Demand("d", "interactive", 1, 2, 5)]
    runs = [run("a", "training", 2, 0, 10), run("b", "deferred", 2, 0, 4, "REQUEUED"),
            run("b", "deferred", 2, 21, 27), run("c", "training", 4, 10, 15),
            run("d", "interactive", 1, 15, 20)]
    m = replay.metrics(runs, demands, capacity=4)
    assert m["completed"] == 4 and m["jobs"] == 4
    assert m["wait_s"]["training"] == {"p50": 0.0, "p95": 9.0, "n": 2}
    assert m["wait_s"]["interactive"]["p95"] == 13.0
    assert m["preemptions_and_requeues"] == 1
    assert m["makespan_s"] == 27.0
    # b ran 4 + 6 s for 10 s of work, within accounting resolution (2 runs): nothing lost.
    assert m["work_lost_gpu_s"] == 0.0
    # Saturated from t=0 (a+b want 4) until c and b are done; busy samples average below 1.
    assert 0 < m["gpu_utilization_saturated"] < 1


def test_redone_work_counts_as_lost() -> None:
    demands = [replay.Demand("a", "deferred", 2, 0, 10), replay.Demand("b", "training", 2, 0, 10)]
    runs = [run("a", "deferred", 2, 0, 8, "REQUEUED"), run("a", "deferred", 2, 20, 30),
            run("b", "training", 2, 0, 3, "FAILED")]
    m = replay.metrics(runs, demands, 4, speedup=10.0)
    assert m["work_lost_gpu_s"] == 12.0  # (18-10-2) x 2
    assert m["work_lost_share"] == 0.3  # of 40 GPU-s offered
    assert m["work_lost_per_preemption_s"] == 6.0  # one preemption, 6 s of a's time redone
    assert m["failed_share"] == 0.5
    assert m["makespan_trace_s"] == 10 * m["makespan_s"]
    assert m["wait_trace_s"]["deferred"]["p95"] == 10 * m["wait_s"]["deferred"]["p95"]
    assert m["wait_s_by_team"]["vision"]["n"] == 2


def _policy(util: float | None, p95: float, preemptions: int,
            per: float | None) -> dict[str, object]:
    return {"gpu_utilization_saturated": util, "capacity_gpus": 12, "saturated_s": 100,
            "wait_s": {"interactive": {"p50": 1.0, "p95": p95, "n": 5}},
            "preemptions_and_requeues": preemptions, "work_lost_per_preemption_s": per}


def test_targets_say_met_missed_or_no_evidence_and_why() -> None:
    met = replay.targets({"gpupool": _policy(0.95, 3.0, 2, 0.5),
                          "baseline": _policy(0.7, 40.0, 0, None)}, "interactive", 2, 0.1)
    assert [t["met"] for t in met] == [True, True, True, True]
    assert all(t["why"] == "" for t in met)
    missed = replay.targets({"gpupool": _policy(0.8, 30.0, 3, 4.0),
                             "baseline": _policy(0.85, 40.0, 0, None)}, "interactive", 2, 0.1)
    assert [t["met"] for t in missed] == [False, False, False, False]
    assert "240.0 GPU-s idle in 100 saturated seconds" in missed[0]["why"]  # 0.2 x 12 x 100
    assert "save and requeue" in missed[2]["why"] and "4.0 s redone" in missed[3]["why"]
    none = replay.targets({"gpupool": _policy(None, 3.0, 0, None)}, "interactive", 2, 0.1)
    assert [t["met"] for t in none] == [None, True, None]
    assert "never reached" in none[0]["why"] and "no preemption" in none[2]["why"]


def test_squeue_says_which_replay_jobs_are_left_and_what_the_pending_ones_wait_on() -> None:
    out = ("r1-gpupool-a|RUNNING|None\nr1-gpupool-b|PENDING|Resources\n"
           "r1-gpupool-c|PENDING|BeginTime\nr1-gpupool-d|PENDING|None\n"
           "r1-gpupool-e|PENDING|AssocGrpGRES\nr0-gpupool-f|PENDING|Priority\nother|PENDING|\n")
    assert replay_run.queued(out, "r1-gpupool-") == (5, {"b": "Resources", "e": "AssocGrpGRES"})
    assert replay_run.queued("", "r1-gpupool-") == (0, {})
    # Reasons that carry details count by their code: one row per reason, not per node list.
    detailed = "r1-gpupool-g|PENDING|ReqNodeNotAvail, UnavailableNodes:lab-gpu[1-2]\n"
    assert replay_run.queued(detailed, "r1-gpupool-") == (1, {"g": "ReqNodeNotAvail"})


def test_what_jobs_waited_on_is_counted_per_class_and_explains_a_missed_target() -> None:
    demands = [replay.Demand("a", "interactive", 1, 0, 5),
               replay.Demand("b", "interactive", 1, 0, 5), replay.Demand("c", "training", 2, 0, 5)]
    runs = [run("a", "interactive", 1, 9, 14), run("b", "interactive", 1, 20, 25),
            run("c", "training", 2, 0, 5)]
    waited = {"a": {"Resources": 3}, "b": {"Resources": 2, "AssocGrpGRES": 9},
              "c": {"Priority": 1}, "gone": {"Priority": 4}}
    m = replay.metrics(runs, demands, 4, waited_on=waited)
    assert m["waited_on"] == {"interactive": {"Resources": 2, "AssocGrpGRES": 1},
                              "training": {"Priority": 1}}
    assert replay.metrics(runs, demands, 4)["waited_on"] == {}
    why = next(t["why"] for t in replay.targets({"gpupool": m}, "interactive", 2, 0.1)
               if t["target"].startswith("interactive p95"))
    assert why.startswith("p95 ") and "interactive jobs waited on: no GPUs free" in why
    assert "(Resources, 2 jobs)" in why and "GPU quota plus borrowing (AssocGrpGRES, 1 job)" in why


def test_the_report_has_targets_cdfs_and_trace_time(tmp_path: Path) -> None:
    demands = [replay.Demand("a", "training", 2, 0, 10), replay.Demand("d", "interactive", 1, 2, 5)]
    runs = [run("a", "training", 2, 0, 10), run("d", "interactive", 1, 10, 15)]
    metrics = {p: {**replay.metrics(runs, demands, 4, speedup=2.0), "not_runnable": 0}
               for p in ("gpupool", "baseline")}
    classes = replay.class_figures(demands, 4, 10)
    result = {"trace": "hand-made", "jobs": 2, "speedup": 2.0, "offered_load": 1.6,
              "classes": classes, "policies": metrics,
              "targets": replay.targets(metrics, "interactive", 2, 0.1, classes)}
    waits = {p: {"training": [0.0], "interactive": [8.0]} for p in metrics}
    md = replay_report.write(tmp_path, result, {p: runs for p in metrics}, waits,
                             {p: 0.0 for p in metrics}).read_text()
    assert "## Targets" in md and "| makespan in trace time (s) | 30.0 | 30.0 |" in md
    assert "| wait p50 / p95 (s), team vision |" in md
    assert "jobs held back" not in md  # nothing was seen waiting
    assert "| interactive | 1 | 0.125 | 0.0 / 0.0 |" in md  # 5 GPU-s of 4 GPUs x 10 s
    for png in ("utilization.png", "waits.png"):
        assert (tmp_path / png).stat().st_size > 0
    assert json.loads((tmp_path / "replay.json").read_text())["targets"] == result["targets"]


def test_baseline_pins_nodes_to_their_owners() -> None:
    desc = loader.load_stack("lab", ROOT)
    current = "ClusterName=lab\nPreemptType=preempt/partition_prio\nPriorityType=priority/" \
              "multifactor\nPriorityWeightFairshare=10000\nPartitionName=deferred Nodes=x\n"
    conf = replay_run.baseline_conf(desc, current)
    assert "PartitionName=deferred" not in conf and "partition_prio" not in conf
    assert "PriorityWeightFairshare" not in conf
    assert "SchedulerType=sched/builtin" in conf and "PreemptType=preempt/none" in conf
    assert "PartitionName=vision Nodes=lab-gpu[1-2] " in conf
    assert "PartitionName=nlp Nodes=lab-gpu3 " in conf
    # Marked once, however often it is applied: going back to gpupool's policy knows.
    assert conf.splitlines()[0] == replay_run.BASELINE_MARK
    assert replay_run.baseline_conf(desc, conf).count(replay_run.BASELINE_MARK) == 1


class FileSlurm:
    """A FIXTURE lab for the policy switch: each node's slurm.conf is a file under tmp, and
    the commands use_policy sends run in a real bash with the path moved there."""

    def __init__(self, desc: Any, tmp: Path) -> None:
        self.desc, self.tmp, self.commands = desc, tmp, []
        for node in desc.nodes:
            (tmp / node).mkdir()

    def sh(self, cmd: str, node: str | None = None) -> str:
        self.commands.append(cmd)
        where = self.tmp / (node or next(iter(self.desc.nodes)))
        folder = str(Path(replay_run.CONF).parent)
        return subprocess.run(["bash", "-c", cmd.replace(folder, str(where))],
                              capture_output=True, text=True, check=True).stdout

    write = SlurmLab.write


@pytest.mark.parametrize("text", ["ClusterName=lab\nPartitionName=x Nodes=y\n",
                                  "ClusterName=lab\nno newline at the end",
                                  "ClusterName=lab\n\n$HOME `id` 'q' \"d\"\nGPUPOOL_EOF\n"])
def test_the_baseline_is_undone_byte_for_byte_without_replaying_the_role(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    desc = loader.load_stack("lab", ROOT)
    lab = FileSlurm(desc, tmp_path)
    for node in desc.nodes:
        (tmp_path / node / "slurm.conf").write_text(text)
    restarts: list[str] = []
    monkeypatch.setattr(replay_run, "_restart_all", lambda s: restarts.append("restart"))
    monkeypatch.setattr(replay_run, "playbook", lambda *a: pytest.fail("the role replayed"))
    saved = replay_run.gpupool_conf(lab)
    replay_run.use_policy(lab, "gpupool", saved)  # already in force: nothing done
    assert restarts == []
    replay_run.use_policy(lab, "baseline", saved)
    assert replay_run.gpupool_conf(lab) is None
    replay_run.use_policy(lab, "gpupool", saved)
    assert restarts == ["restart", "restart"]
    for node in desc.nodes:
        assert (tmp_path / node / "slurm.conf").read_text() == text, node


def test_a_baseline_left_by_a_stopped_replay_is_undone_by_the_role(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    desc = loader.load_stack("lab", ROOT)
    lab = FileSlurm(desc, tmp_path)
    for node in desc.nodes:
        (tmp_path / node / "slurm.conf").write_text(replay_run.BASELINE_MARK + "\nX=1\n")
    played: list[str] = []
    monkeypatch.setattr(replay_run, "_restart_all", lambda s: None)
    monkeypatch.setattr(replay_run, "playbook", lambda desc, book: played.append(book) or
                        subprocess.CompletedProcess([], 0, "", ""))
    assert replay_run.gpupool_conf(lab) is None
    replay_run.use_policy(lab, "gpupool", None)
    assert played == ["slurm.yml"]


def test_a_job_wider_than_a_team_owns_is_a_baseline_figure_not_a_crash() -> None:
    desc = loader.load_stack("lab", ROOT)
    fits = trace.TraceJob("1", "nlp", "training", 4, 0, 10)
    wide = trace.TraceJob("2", "nlp", "training", 8, 0, 10)  # nlp owns one 4-GPU node
    widest = trace.TraceJob("3", "vision", "training", 13, 0, 10)  # beyond the 12 on-prem
    replay_run.check_trace(desc, [fits, wide, widest])
    assert replay_run.runnable(desc, "baseline", [fits, wide, widest]) == ([fits],
                                                                          [wide, widest])
    assert replay_run.runnable(desc, "gpupool", [fits, wide, widest]) == ([fits, wide],
                                                                         [widest])


def test_a_trace_naming_an_unknown_team_or_class_is_refused() -> None:
    desc = loader.load_stack("lab", ROOT)
    with pytest.raises(SlurmLabError, match="unknown team 'ops'"):
        replay_run.check_trace(desc, [trace.TraceJob("1", "ops", "training", 1, 0, 10)])
    with pytest.raises(SlurmLabError, match="or class 'batch'"):
        replay_run.check_trace(desc, [trace.TraceJob("1", "nlp", "batch", 1, 0, 10)])


JOBS = {j: trace.TraceJob(j, "training", "vision", 1, 0, 10) for j in ("1", "2")}
PREFIX = "r18c-gpupool-"


def _sacct(*rows: str) -> str:
    return "\n".join(rows) + "\n"


def test_accounting_is_final_only_when_every_jobs_last_record_has_ended() -> None:
    # Job 2 finished on the node, but slurmdbd has not got its end yet: not final, so the
    # replay keeps reading instead of counting it as failed (issue 21).
    lagging = _sacct(
        f"{PREFIX}1|billing=1,gres/gpu=1|2026-11-30T10:00:00|2026-11-30T10:00:01|"
        "2026-11-30T10:01:19|COMPLETED",
        f"{PREFIX}2|billing=1,gres/gpu=1|2026-11-30T10:00:00|2026-11-30T10:00:01|"
        "Unknown|RUNNING")
    runs = replay_run.parse_runs(lagging, PREFIX, JOBS)
    assert replay_run.unfinished(runs, JOBS) == ["2"]
    # A requeued job is final only once its last run has ended.
    requeued = _sacct(
        f"{PREFIX}1|gres/gpu=1|2026-11-30T10:00:00|2026-11-30T10:00:01|"
        "2026-11-30T10:00:09|REQUEUED",
        f"{PREFIX}1|gres/gpu=1|2026-11-30T10:00:30|2026-11-30T10:00:31|"
        "2026-11-30T10:01:19|COMPLETED",
        f"{PREFIX}2|gres/gpu=1|2026-11-30T10:00:00|2026-11-30T10:00:01|"
        "2026-11-30T10:01:19|COMPLETED")
    runs = replay_run.parse_runs(requeued, PREFIX, JOBS)
    assert replay_run.unfinished(runs, JOBS) == []
    assert [r.state for r in runs] == ["REQUEUED", "COMPLETED", "COMPLETED"]


def test_jobs_of_another_run_or_policy_are_not_read() -> None:
    other = _sacct(
        "r17a-gpupool-1|gres/gpu=1|2026-11-30T09:00:00|2026-11-30T09:00:01|"
        "2026-11-30T09:01:00|TIMEOUT",
        "r18c-baseline-1|gres/gpu=1|2026-11-30T10:00:00|2026-11-30T10:00:01|"
        "2026-11-30T10:01:00|COMPLETED")
    runs = replay_run.parse_runs(other, PREFIX, JOBS)
    assert runs == [] and replay_run.unfinished(runs, JOBS) == ["1", "2"]


def test_each_replay_has_its_own_key() -> None:
    first = replay_run.run_key()
    time.sleep(0.002)
    second = replay_run.run_key()
    assert first != second
    assert all(re.fullmatch(r"r[0-9a-f]+", k) for k in (first, second))  # safe in job names


def test_a_submission_quotes_what_it_writes() -> None:
    """Defence in depth behind trace.read's checks: the submission script quotes the job
    name, account and partition."""
    job = trace.TraceJob("a b;id", "vision", "training", 2, 0, 10)
    line = replay_run._submit_line("gpupool", job, "2026-01-01T00:00:00", 1.0, "r-a b;id")
    assert "-J 'r-a b;id' -A vision -p training --requeue --gpus=2" in line


def test_what_each_class_asks_of_the_pool_whatever_the_policy() -> None:
    """Per class: its jobs, offered load, and its waits with the pool to itself, first come
    first served (three 1-GPU jobs at once on 2 GPUs: the third waits for the first)."""
    demands = [replay.Demand("a", "interactive", 1, 0, 10),
               replay.Demand("b", "interactive", 1, 0, 4),
               replay.Demand("c", "interactive", 1, 0, 6),
               replay.Demand("d", "deferred", 2, 1, 5)]
    figures = replay.class_figures(demands, 2, 10)
    assert figures["interactive"]["jobs"] == 3
    assert figures["interactive"]["offered_load"] == 1.0  # 20 GPU-s of 2 GPUs x 10 s
    assert figures["interactive"]["alone_wait_s"] == {"p50": 0.0, "p95": 4.0, "n": 3}
    assert figures["deferred"] == {"jobs": 1, "offered_load": 0.5,
                                   "alone_wait_s": {"p50": 0.0, "p95": 0.0, "n": 1}}
    offered = replay_run.offered([trace.TraceJob("x", "nlp", "deferred", 1, 20.0, 2.0)], 2.0,
                                 100)
    assert offered == [replay.Demand("x", "deferred", 1, 110.0, replay_run.MIN_JOB_S)]


def test_a_top_class_that_alone_overfills_the_pool_is_said_so_and_judged_against_that() -> None:
    """The bench's Alibaba window: its interactive pods alone ask for more GPUs than the pool
    has, so no policy meets the two-cycle target; the reason says so with the wait they
    would have alone, and a second target judges what the policy adds to that."""
    g = {**_policy(0.99, 66.0, 5, 0.0), "waited_on": {"interactive": {"Resources": 9}}}
    crowded = {"interactive": {"jobs": 23, "offered_load": 1.24,
                               "alone_wait_s": {"p50": 10.0, "p95": 64.0, "n": 23}}}
    out = {t["target"]: t
           for t in replay.targets({"gpupool": g}, "interactive", 2, 0.1, crowded)}
    first = out["interactive p95 wait within 2 scheduling cycles (4 s)"]
    assert first["met"] is False
    assert "alone ask for 1.24x the pool's GPUs" in first["why"]
    assert "their p95 wait would be 64 s" in first["why"]
    assert "(Resources, 9 jobs)" in first["why"]
    second = out["interactive p95 wait within 2 scheduling cycles of its wait with the pool "
                 "to itself (64 + 4 s)"]
    assert second["met"] is True and second["value"] == [66.0, 64.0] and second["why"] == ""
    late = {**g, "wait_s": {"interactive": {"p50": 1.0, "p95": 90.0, "n": 23}}}
    second = next(t for t in replay.targets({"gpupool": late}, "interactive", 2, 0.1, crowded)
                  if "pool to itself" in t["target"])
    assert second["met"] is False and second["why"].startswith("p95 90.0 s, 26 s more; ")
    # A class the pool could serve at once: the first target's reason names no crowding.
    light = {"interactive": {**crowded["interactive"], "offered_load": 0.2,
                             "alone_wait_s": {"p50": 0.0, "p95": 0.0, "n": 23}}}
    assert "alone ask" not in " ".join(t["why"] for t in replay.targets(
        {"gpupool": g}, "interactive", 2, 0.1, light))


class _Squeue:
    """A controller that answers squeue and records what else it is asked."""

    def __init__(self, listing: str) -> None:
        self.listing, self.asked = listing, []

    def sh(self, command: str) -> str:
        self.asked.append(command)
        return self.listing if command.startswith("squeue") else ""


def test_a_replay_that_fails_cancels_only_its_own_jobs() -> None:
    s = _Squeue("193 r1-gpupool-s0072\n194 r1-gpupool-s0073\n195 r0-gpupool-s0001\n196 other\n")
    assert replay_run.cancel_left(s, "r1-gpupool-") == ["193", "194"]  # type: ignore[arg-type]
    assert s.asked[-1] == "scancel 193 194"
    quiet = _Squeue("196 other\n")
    assert replay_run.cancel_left(quiet, "r1-gpupool-") == []  # type: ignore[arg-type]
    assert quiet.asked == ["squeue -h -o '%i %j'"]
