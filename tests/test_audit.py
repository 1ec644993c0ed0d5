"""Workload audit: parsing job history, the FCFS sizing, and the report on the real trace."""

from __future__ import annotations

import json
from pathlib import Path

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
    jobs = audit.read_sacct(path)
    # CPU-only 103 and never-started 104 are not GPU work.
    assert [(j.id, j.team, j.task_class, j.gpus) for j in jobs] == [
        ("101", "vision", "training", 8.0), ("102", "nlp", "interactive", 1.0)]
    assert jobs[0].duration == 7200 and jobs[0].wait == 5


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
    [job] = audit.read_sacct(path)
    assert (job.id, job.wait, job.duration) == ("203", 0, 1800)


def test_a_qos_class_the_map_does_not_name_is_reported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(f"{','.join(audit.ALIBABA_COLUMNS)}\n"
                    "p0,1,1000,LS,0,100,10\n"
                    "p1,2,0,Spot,0,150,20\n")
    unmapped: set[str] = set()
    jobs = audit.read_alibaba(path, trace_end=200, unmapped=unmapped)
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


@pytest.mark.parametrize("tres", ["gres/gpu=" + "9" * 30, "gres/gpu=" + "9" * 5000,
                                  "gres/gpu=1,gres/gpu:a100=100001"])
def test_a_gpu_count_no_job_has_names_its_line(tmp_path: Path, tres: str) -> None:
    path = tmp_path / "sacct.txt"
    path.write_text(SACCT + f"105|nlp|training|{tres}|2026-11-01T10:00:00"
                    "|2026-11-01T10:00:01|2026-11-01T11:00:00|COMPLETED\n")
    with pytest.raises(audit.TraceError, match=r"sacct.txt:5: "):
        audit.read_sacct(path)


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
