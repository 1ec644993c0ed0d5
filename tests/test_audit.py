"""Workload audit: parsing job history, the FCFS sizing, the capacity per GPU model, the
rows dropped and why, and the report on the real trace."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from gpupool import cli
from gpupool.paths import DATA
from gpupool.workload import audit

TRACE = DATA / "traces" / "alibaba-gpu-2023" / "openb_pod_list_default.csv"

SACCT = """\
101|vision|training|billing=8,cpu=8,gres/gpu=8,gres/gpu:l4=8,node=2|2026-11-01T10:00:00|2026-11-01T10:00:05|2026-11-01T12:00:05|COMPLETED
102|nlp|interactive|billing=1,cpu=2,gres/gpu=1,node=1|2026-11-01T10:01:00|2026-11-01T10:01:01|2026-11-01T10:31:01|COMPLETED
103|nlp|deferred|billing=1,cpu=2,node=1|2026-11-01T10:02:00|2026-11-01T10:02:01|2026-11-01T10:03:01|COMPLETED
104|vision|deferred|billing=2,cpu=2,gres/gpu=2|2026-11-01T10:03:00|Unknown|Unknown|CANCELLED
"""


def _job(i: int, gpus: float = 1, submit: float = 0, duration: float = 100) -> audit.Job:
    return audit.Job(str(i), "t", "training", gpus, submit, submit, submit + duration)


def test_read_sacct(tmp_path: Path) -> None:
    path = tmp_path / "sacct.txt"
    path.write_text(SACCT)
    history = audit.read_sacct(path)
    jobs = history.jobs
    # CPU-only 103 and never-started 104 are not GPU work.
    assert [(j.id, j.team, j.task_class, j.gpus, j.gpu_model) for j in jobs] == [
        ("101", "vision", "training", 8.0, "l4"), ("102", "nlp", "interactive", 1.0, "")]
    assert jobs[0].duration == 7200 and jobs[0].wait == 5
    assert history.dropped == {"no_gpu": 1, "pending": 1}


def test_odd_history_lines_are_read_as_what_they_are(tmp_path: Path) -> None:
    """Lines a real sacct writes besides the plain ones: a GPU count of 0, an end before the
    start (clock skew), a requeued job submitted again after it first started."""
    path = tmp_path / "sacct.txt"
    path.write_text(
        "201|nlp|training|cpu=2,gres/gpu=0|2026-11-01T10:00:00|2026-11-01T10:00:01"
        "|2026-11-01T11:00:00|COMPLETED\n"
        "202|nlp|training|gres/gpu=2|2026-11-01T10:00:00|2026-11-01T10:10:00"
        "|2026-11-01T10:05:00|COMPLETED\n"
        "203|nlp|training|gres/gpu=2|2026-11-01T10:20:00|2026-11-01T10:10:00"
        "|2026-11-01T10:40:00|COMPLETED\n")
    history = audit.read_sacct(path)
    [job] = history.jobs
    assert (job.id, job.wait, job.duration) == ("203", 0, 1800)
    assert history.dropped == {"no_gpu": 1, "no_run_time": 1}


def test_a_qos_class_the_map_does_not_name_is_reported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(f"{','.join(audit.ALIBABA_COLUMNS)}\n"
                    "p0,1,1000,LS,0,100,10\n"
                    "p1,2,0,Spot,0,150,20\n")
    unmapped: set[str] = set()
    jobs = audit.read_alibaba(path, trace_end=200, unmapped=unmapped).jobs
    assert unmapped == {"Spot"}
    assert {j.id: j.task_class for j in jobs} == {"p0": "interactive", "p1": "training"}
    assert cli.main(["audit", "--alibaba", str(path), "--out", str(tmp_path / "r"),
                     "--stack", "lab", "--json"]) == cli.EXIT_OK
    mapping = json.loads(capsys.readouterr().out)["class_mapping"]
    assert mapping["Spot"] == {"class": "training", "why": audit.UNMAPPED_WHY}


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_time_that_is_no_number_names_its_line(tmp_path: Path, value: str) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(f"{','.join(audit.ALIBABA_COLUMNS)}\n"
                    "p0,1,1000,LS,0,100,10\n"
                    f"p1,1,1000,LS,0,{value},10\n")
    with pytest.raises(audit.TraceError, match=r"pods.csv:3: .*finite"):
        audit.read_alibaba(path, trace_end=200)


GOOD_POD = {"name": "p1", "num_gpu": "1", "gpu_milli": "1000", "qos": "LS",
            "creation_time": "0", "deletion_time": "100", "scheduled_time": "10"}
BAD_POD_VALUES = [("num_gpu", v) for v in ("-1", "1.5", "abc", "", "9" * 30, "9" * 5000)] + [
    ("gpu_milli", v) for v in ("-5", "1001", "1e3", " ")] + [
    (col, v) for col in ("creation_time", "deletion_time", "scheduled_time")
    for v in ("-1", "abc", "1e400", "0x10", "9" * 400)] + [("creation_time", "")]


@pytest.mark.parametrize(("column", "value"), BAD_POD_VALUES)
def test_a_pod_value_the_trace_never_holds_names_its_line(
        tmp_path: Path, column: str, value: str) -> None:
    """Whichever reader takes the file (the audit's or the replay's sampler), a value that
    is not what the column holds is one message naming the file and line: never a
    traceback, and never a job of 10^30 GPUs."""
    from gpupool.workload import trace  # noqa: PLC0415 - the sampler, one layer up

    path = tmp_path / "pods.csv"
    bad = GOOD_POD | {column: value}
    path.write_text(",".join(audit.ALIBABA_COLUMNS) + "\n"
                    + "\n".join(",".join(row[c] for c in audit.ALIBABA_COLUMNS)
                                for row in (GOOD_POD | {"name": "p0"}, bad)) + "\n")
    with pytest.raises(audit.TraceError, match=r"pods.csv:3: "):
        audit.read_alibaba(path, trace_end=200)
    with pytest.raises(audit.TraceError, match=r"pods.csv:3: "):
        trace.sample_alibaba(path, ["vision"], jobs=2, horizon_s=10, max_gpus=4)


def test_fcfs_simulation_and_sizing() -> None:
    jobs = [_job(i) for i in range(4)]  # four 1-GPU jobs of 100 s, all at t=0
    assert audit.simulate_fcfs_waits(jobs, 1) == [0, 100, 200, 300]
    assert audit.simulate_fcfs_waits(jobs, 2) == [0, 0, 100, 100]
    assert audit.gpus_for_wait_target(jobs, 0) == 4
    assert audit.gpus_for_wait_target(jobs, 100) == 2
    assert audit.gpus_for_wait_target(jobs, 1000) == 1
    # A wide job blocks the ones behind it (no backfill in the baseline sizing).
    wide = [_job(0, gpus=4), _job(1, gpus=1, submit=1)]
    assert audit.simulate_fcfs_waits(wide, 4) == [0, 99]


def test_audit_groups_and_recommendation() -> None:
    jobs = [_job(i, gpus=2) for i in range(3)] + [
        audit.Job("x", "u", "interactive", 1, 0, 0, 50)]
    report = audit.audit(jobs, 0, {"t": 4})
    assert report["gpus_needed_for_target"] == 7
    groups = {(g["team"], g["class"]): g for g in report["groups"]}
    assert groups[("t", "training")]["parallel_jobs_peak"] == 3
    assert sum(report["recommended_quota"].values()) == 7


def test_audit_on_the_alibaba_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["audit", "--alibaba", str(TRACE), "--out", str(tmp_path), "--json"])
    assert rc == cli.EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["jobs"] > 6000
    assert {g["class"] for g in report["groups"]} == {"interactive", "training", "deferred"}
    peak = max(g["gpus_in_use_p90"] for g in report["groups"])
    assert peak < report["gpus_needed_for_target"] < 8152
    for name in ("audit.md", "audit.json", "durations.png", "demand.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "durations.png").read_bytes()[:4] == b"\x89PNG"


def test_audit_says_how_it_mapped_classes_and_which_percentile(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["audit", "--alibaba", str(TRACE), "--out", str(tmp_path), "--json",
                   "--class-map", "LS=training", "--wait-percentile", "90",
                   "--wait-target", "300"])
    assert rc == cli.EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["class_mapping"]["LS"]["class"] == "training"
    assert "not notebooks" in report["class_mapping"]["LS"]["why"]
    assert "interactive" not in {g["class"] for g in report["groups"]}
    assert (report["wait_percentile"], report["wait_target_s"]) == (90, 300)
    assert report["teams_not_in_description"] == ["trace"]
    md = (tmp_path / "audit.md").read_text()
    assert "p90 wait at or under 300 s" in md and "| LS | training |" in md


@pytest.mark.parametrize("args", [["--class-map", "LS=notebooks"], ["--class-map", "LS"],
                                  ["--wait-percentile", "0"], ["--wait-percentile", "101"]])
def test_audit_refuses_a_class_map_or_percentile_it_cannot_use(args: list[str]) -> None:
    try:
        rc = cli.main(["audit", "--alibaba", str(TRACE), *args])
    except SystemExit as exc:  # argparse: the percentile's argument type refuses it
        rc = int(exc.code or 0)
    assert rc == cli.EXIT_USAGE


# -- capacity per model, dropped rows, the demand plot (issue 52) --------------------------

def _sacct_line(job_id: str, tres: str, account: str = "vision", start: str = "10:00:00",
                end: str = "12:00:00", state: str = "COMPLETED") -> str:
    day = "2026-11-01T"
    return "|".join([job_id, account, "training", tres, f"{day}09:59:00",
                     f"{day}{start}" if start else "Unknown",
                     f"{day}{end}" if end else "Unknown", state])


def _history(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "sacct.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


# The example stack's pool: 176 H100 (128 on-prem, 48 burst) and 40 L40S (24 + 16 burst).
# 200 H100 for two hours fit the 216 GPUs summed over models, but not the 176 H100.
H100_RUSH = [_sacct_line(str(300 + i), "gres/gpu=8,gres/gpu:h100=8") for i in range(25)]


def _by_model(report: dict[str, Any]) -> dict[str | None, dict[str, Any]]:
    return {row["model"]: row for row in report["capacity_by_model"]}


def test_h100_demand_over_its_capacity_is_a_shortage_while_l40s_sit_idle(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _history(tmp_path, H100_RUSH)
    assert cli.main(["audit", "--stack", "example", "--sacct", str(path), "--out",
                     str(tmp_path / "r"), "--json"]) == cli.EXIT_OK
    report = json.loads(capsys.readouterr().out)
    rows = _by_model(report)
    h100, l40s = rows["h100"], rows["l40s"]
    assert (h100["capacity"], h100["peak_gpus"], h100["p95_gpus"]) == (176, 200, 200)
    assert h100["capacity_by_type"] == {"on-prem": 128, "on-demand": 8, "spot": 40}
    assert h100["exceeded"] is True and h100["exceeded_s"] == 7200
    assert h100["exceeded_share"] == 1.0 and h100["exceeded_episodes"] == 1
    assert (l40s["capacity"], l40s["peak_gpus"], l40s["jobs"]) == (40, 0, 0)
    assert l40s["exceeded"] is False and l40s["exceeded_s"] == 0
    assert None not in rows  # every job named its model
    assert report["short_of"] == ["h100"] and report["pool_gpus"] == 216
    # The human output says so too.
    assert cli.main(["audit", "--stack", "example", "--sacct", str(path), "--out",
                     str(tmp_path / "r")]) == cli.EXIT_OK
    text = " ".join(capsys.readouterr().out.split())
    assert "h100: peak 200, p95 200 of 176 GPUs: short 100% of the time" in text
    assert "l40s: peak 0, p95 0 of 40 GPUs" in text


def test_jobs_that_name_no_model_are_compared_with_the_whole_pool() -> None:
    """A plain gres/gpu job may run on any model: its row names the models that could serve
    it, and its demand shares the whole pool with the jobs that named a model."""
    capacity = {"h100": {"on-prem": 8}, "l40s": {"on-prem": 4}}
    named = [audit.Job(str(i), "t", "training", 4, 0, 0, 100, "h100") for i in range(2)]
    plain = [audit.Job(f"p{i}", "t", "training", 2, 0, 50, 150) for i in range(3)]
    rows = _by_model(audit.audit(named + plain, 600, capacity=capacity))
    assert rows["h100"]["peak_gpus"] == 8 and rows["h100"]["exceeded"] is False
    anywhere = rows[None]
    assert anywhere["served_by"] == ["h100", "l40s"] and anywhere["capacity"] == 12
    assert (anywhere["jobs"], anywhere["peak_gpus"]) == (3, 6)
    # From 50 s to 100 s every job runs: 8 + 6 GPUs on a pool of 12.
    assert anywhere["exceeded"] is True and anywhere["exceeded_s"] == 50


def test_dropped_rows_are_counted_by_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _history(tmp_path, [
        _sacct_line("1", "gres/gpu=1,gres/gpu:l4=1"),  # kept
        _sacct_line("2", "gres/gpu=2", start="", end="", state="PENDING"),
        _sacct_line("3", "gres/gpu=2", start="", end="", state="CANCELLED"),
        _sacct_line("4", "gres/gpu=2", end="", state="RUNNING"),
        _sacct_line("5", "gres/gpu=1", account="physics"),
        _sacct_line("6", "gres/gpu=1,gres/gpu:h100=1"),  # the lab has no H100
        _sacct_line("7", "cpu=2"),
        _sacct_line("8", "gres/gpu=1", start="11:00:00", end="10:30:00"),
        "9|vision|training|gres/gpu=1|too few fields"])
    history = audit.read_sacct(path, teams={"vision", "nlp"}, models={"l4"})
    assert [j.id for j in history.jobs] == ["1"] and history.jobs[0].gpu_model == "l4"
    assert history.dropped == {"unparsable": 1, "no_gpu": 1, "pending": 2, "running": 1,
                               "unknown_team": 1, "unknown_gpu_model": 1, "no_run_time": 1}
    assert history.dropped_names == {"unknown_team": {"physics": 1},
                                     "unknown_gpu_model": {"h100": 1}}
    assert cli.main(["audit", "--stack", "lab", "--sacct", str(path), "--out",
                     str(tmp_path / "r"), "--json"]) == cli.EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["jobs"] == 1 and report["dropped_total"] == 8
    assert report["dropped"] == {"unparsable": 1, "no_gpu": 1, "pending": 2, "running": 1,
                                 "unknown_team": 1, "unknown_gpu_model": 1,
                                 "no_run_time": 1}
    assert set(report["drop_reasons"]) == set(report["dropped"])
    assert report["teams_not_in_description"] == ["physics"]
    assert "sacct.txt:9: " in report["unparsable_examples"][0]
    assert cli.main(["audit", "--stack", "lab", "--sacct", str(path), "--out",
                     str(tmp_path / "r")]) == cli.EXIT_OK
    text = " ".join(capsys.readouterr().out.split())
    for said in ("8 rows dropped", "pending: 2", "running: 1", "unknown_team: 1 (physics)",
                 "unparsable: 1", "unknown_gpu_model: 1 (h100)"):
        assert said in text, text
    md = (tmp_path / "r" / "audit.md").read_text()
    assert "| pending | 2 |" in md and "| l4 |" in md


MALFORMED = [
    "1|vision|training|gres/gpu=1",  # too few fields
    "1|vision|training|gres/gpu=1|a|b|c|d|e",  # too many
    _sacct_line("1", "gres/gpu=-1"),
    _sacct_line("1", "gres/gpu=abc"),
    _sacct_line("1", "gres/gpu=1.5"),
    _sacct_line("1", "gres/gpu=" + "9" * 30),
    _sacct_line("1", "gres/gpu=" + "9" * 5000),
    _sacct_line("1", "gres/gpu=1,gres/gpu:l4=100001"),
    _sacct_line("1", "gres/gpu=1").replace("2026-11-01T10:00:00", "yesterday"),
    _sacct_line("1", "gres/gpu=1").replace("2026-11-01T12:00:00", "9" * 400),
    _sacct_line("1", "gres/gpu=1").replace("2026-11-01T10:00:00", "2026-13-45T99:00:00"),
    _sacct_line("1", "gres/gpu=1").replace("2026-11-01T10:00:00", "0001-01-01T00:00:00"),
    _sacct_line("1", "gres/gpu=1").replace("2026-11-01T10:00:00", "2026-11-01T10:00:00+99:00"),
    "\x00\x01|\xff",
]


@pytest.mark.parametrize("line", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_row_is_dropped_as_unparsable_never_a_crash(
        tmp_path: Path, line: str) -> None:
    path = _history(tmp_path, [_sacct_line("0", "gres/gpu=1,gres/gpu:l4=1"), line])
    history = audit.read_sacct(path, teams={"vision"}, models={"l4"})
    assert [j.id for j in history.jobs] == ["0"]
    assert history.dropped == {"unparsable": 1}
    [example] = history.unparsable_examples
    assert example.startswith(f"{path}:2: ")


def test_a_gpu_type_that_is_no_model_of_the_pool_is_dropped_by_name(tmp_path: Path) -> None:
    path = _history(tmp_path, [
        _sacct_line("1", "gres/gpu=1,gres/gpumem=24G,gres/gpu:l4=1"),
        _sacct_line("2", "gres/gpu=1,gres/gpu:rtx9090=1"),
        _sacct_line("3", "gres/gpu=2,gres/gpu:3g.40gb=2"),  # a MIG slice, not a GPU
        # Two models in one allocation: the job asked for any GPU.
        _sacct_line("4", "gres/gpu=2,gres/gpu:l4=1,gres/gpu:l40s=1")])
    history = audit.read_sacct(path, models={"l4", "l40s"})
    assert {j.id: j.gpu_model for j in history.jobs} == {"1": "l4", "4": ""}
    assert history.dropped_names["unknown_gpu_model"] == {"rtx9090": 1, "3g.40gb": 1}


def test_a_history_with_nothing_usable_says_what_it_dropped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _history(tmp_path, MALFORMED)
    assert cli.main(["audit", "--stack", "lab", "--sacct", str(path), "--json"]) \
        == cli.EXIT_USAGE
    error = json.loads(capsys.readouterr().out)["error"]
    assert f"unparsable: {len(MALFORMED)}" in error["message"]


def test_the_demand_plot_draws_each_model_s_capacity(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plots need the 'report' extra")
    from gpupool.workload import audit_report  # noqa: PLC0415 - needs matplotlib

    capacity = {"h100": {"on-prem": 16}, "l40s": {"on-prem": 40}}
    jobs = [audit.Job(str(i), "t", "training", 8, 0, 0, 100, "h100") for i in range(3)]
    report = audit.audit(jobs, 600, capacity=capacity)
    fig = audit_report.demand_figure(report, jobs, "history")
    try:
        labels = {line.get_label(): line for line in fig.axes[0].get_lines()}
        assert "h100 capacity: 16" in labels and "l40s capacity: 40" in labels
        assert set(labels["h100 capacity: 16"].get_ydata()) == {16}
        assert "h100 GPUs in use" in labels
        # Jobs that name no model: no per-model demand line, the capacity lines stay.
        plain = [dataclasses.replace(j, gpu_model="") for j in jobs]
        fig2 = audit_report.demand_figure(audit.audit(plain, 600, capacity=capacity), plain,
                                          "history")
        labels2 = {line.get_label() for line in fig2.axes[0].get_lines()}
        assert {"h100 capacity: 16", "l40s capacity: 40"} <= labels2
        assert "h100 GPUs in use" not in labels2
    finally:
        audit_report.plt.close("all")
