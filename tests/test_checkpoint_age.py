"""The checkpoint-age collector (gpupool/onhost/checkpoint_age.py) over a /proc tree and a
checkpoint tier made in a temporary folder, with `scontrol listpids` answered by a stub
(the real command and slurmd run in tests/integration/test_monitoring_lab.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.onhost import checkpoint_age as ca

NOW = 1_000_000.0
BOOT = 900_000.0
TICKS = os.sysconf("SC_CLK_TCK")
HEADER = "PID      JOBID    STEPID   LOCALID GLOBALID\n"


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text(f"cpu  1 2 3\nbtime {int(BOOT)}\nprocesses 7\n")
    return root


@pytest.fixture
def tier(tmp_path: Path) -> Path:
    t = tmp_path / "checkpoints"
    t.mkdir()
    return t


def process(proc: Path, pid: int, env: dict[str, str], started: float = NOW - 600) -> None:
    d = proc / str(pid)
    d.mkdir()
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")
    ticks = int((started - BOOT) * TICKS)
    # Field 22 is the start time; the name holds a space and a parenthesis on purpose.
    (d / "stat").write_text(f"{pid} (python3 (x)) S 1 " + " ".join(["0"] * 17) + f" {ticks} 0 0\n")


def checkpoint(directory: Path, age_s: float) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    f = directory / "ckpt-10.json"
    f.write_text("{}")
    os.utime(f, (NOW - age_s, NOW - age_s))
    os.utime(directory, (NOW - age_s, NOW - age_s))


def ages(tier: Path, proc: Path, listpids: str) -> dict[tuple[str, str], float]:
    registry = ca.collect(tier, run=lambda argv: ca.Listing(listpids), proc=proc,
                          now=lambda: NOW)
    text = generate_latest(registry).decode()
    return {(s.labels["job_id"], s.labels["team"]): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "gpupool_checkpoint_age_seconds"}


def test_a_job_is_as_old_as_its_newest_checkpoint_by_the_convention(proc: Path, tier: Path
                                                                   ) -> None:
    process(proc, 4242, {"SLURM_JOB_ACCOUNT": "vision", "SLURM_JOB_NAME": "resnet"})
    checkpoint(tier / "vision" / "resnet", 120)
    assert ages(tier, proc, HEADER + "4242 17 batch 0 0\n") == {("17", "vision"): 120.0}


def test_gpupool_ckpt_dir_wins_and_a_child_process_may_carry_it(proc: Path, tier: Path) -> None:
    process(proc, 10, {"SLURM_JOB_ACCOUNT": "nlp", "SLURM_JOB_NAME": "llm"})
    process(proc, 11, {"SLURM_JOB_ACCOUNT": "nlp", "GPUPOOL_CKPT_DIR": str(tier / "nlp" / "run7")})
    checkpoint(tier / "nlp" / "llm", 5000)
    checkpoint(tier / "nlp" / "run7", 30)
    assert ages(tier, proc, HEADER + "10 8 batch 0 0\n11 8 batch 1 1\n") == {("8", "nlp"): 30.0}


def test_a_checkpoint_written_as_a_subdirectory_counts(proc: Path, tier: Path) -> None:
    process(proc, 10, {"SLURM_JOB_ACCOUNT": "nlp", "SLURM_JOB_NAME": "llm"})
    run = tier / "nlp" / "llm"
    checkpoint(run / "step_100", 40)
    os.utime(run, (NOW - 900, NOW - 900))
    assert ages(tier, proc, HEADER + "10 8 batch 0 0\n") == {("8", "nlp"): 40.0}


def test_a_job_without_a_checkpoint_is_as_old_as_its_first_process(proc: Path, tier: Path
                                                                  ) -> None:
    process(proc, 10, {"SLURM_JOB_ACCOUNT": "nlp", "SLURM_JOB_NAME": "llm"}, started=NOW - 7300)
    process(proc, 11, {}, started=NOW - 100)
    (tier / "nlp" / "llm").mkdir(parents=True)  # made, never written to
    got = ages(tier, proc, HEADER + "11 8 batch 1 1\n10 8 batch 0 0\n")
    assert got == {("8", "nlp"): pytest.approx(7300, abs=1)}


@pytest.mark.parametrize("given", ["/etc", "../../etc", "nlp/../../outside"])
def test_a_directory_outside_the_tier_is_never_looked_at(proc: Path, tier: Path, given: str
                                                         ) -> None:
    outside = tier.parent / "outside"
    checkpoint(outside, 1)
    process(proc, 10, {"SLURM_JOB_ACCOUNT": "nlp", "SLURM_JOB_NAME": "llm",
                       "GPUPOOL_CKPT_DIR": given}, started=NOW - 900)
    checkpoint(tier / "nlp" / "llm", 300)
    assert ages(tier, proc, HEADER + "10 8 batch 0 0\n") == {("8", "nlp"): 300.0}


def test_a_link_out_of_the_tier_is_not_followed(proc: Path, tier: Path) -> None:
    outside = tier.parent / "outside"
    checkpoint(outside, 1)
    (tier / "nlp").mkdir()
    (tier / "nlp" / "llm").symlink_to(outside)
    process(proc, 10, {"SLURM_JOB_ACCOUNT": "nlp", "SLURM_JOB_NAME": "llm"}, started=NOW - 900)
    assert ages(tier, proc, HEADER + "10 8 batch 0 0\n") == {("8", "nlp"): 900.0}


@pytest.mark.parametrize("env", [
    {"SLURM_JOB_ACCOUNT": "../x", "SLURM_JOB_NAME": "llm"},
    {"SLURM_JOB_ACCOUNT": "nlp", "SLURM_JOB_NAME": ".."},
    {"SLURM_JOB_ACCOUNT": "nlp", "SLURM_JOB_NAME": "a/b"},
    {"SLURM_JOB_ACCOUNT": 'nlp"}\nx{', "SLURM_JOB_NAME": "llm"},
    {},
])
def test_hostile_or_missing_names_give_the_start_age_and_a_safe_team(
        proc: Path, tier: Path, env: dict[str, str]) -> None:
    process(proc, 10, env, started=NOW - 900)
    got = ages(tier, proc, HEADER + "10 8 batch 0 0\n")
    team = env.get("SLURM_JOB_ACCOUNT", "")
    assert got == {("8", team if ca.TEAM_RE.fullmatch(team) else "unknown"): 900.0}


def test_only_batch_steps_report_and_odd_lines_are_skipped(proc: Path, tier: Path) -> None:
    process(proc, 10, {"SLURM_JOB_ACCOUNT": "nlp", "SLURM_JOB_NAME": "llm"})
    listpids = (HEADER + "10 8 batch 0 0\n20 9 0 0 0\n21 9 extern - -\n"
                "x 10 batch 0 0\n30 1;rm batch 0 0\n\n")
    assert set(ages(tier, proc, listpids)) == {("8", "nlp")}


def test_a_job_gone_while_looked_at_is_left_out(proc: Path, tier: Path) -> None:
    assert ages(tier, proc, HEADER + "99 8 batch 0 0\n") == {}


def test_slurmd_silent_serves_no_job_and_up_0(proc: Path, tier: Path) -> None:
    def fail(argv: list[str]) -> ca.Listing:
        raise ca.SlurmdUnavailable("scontrol: timed out")

    text = generate_latest(ca.collect(tier, run=fail, proc=proc)).decode()
    assert "gpupool_checkpoint_age_up 0.0" in text
    assert "gpupool_checkpoint_age_seconds{" not in text


def test_main_writes_the_textfile_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    monkeypatch.setattr(ca, "run_command", lambda argv: ca.Listing(HEADER))
    out = tmp_path / "gpupool_checkpoint_age.prom"
    assert ca.main(["--tier", str(tmp_path), "--output", str(out)]) == 0
    assert "gpupool_checkpoint_age_up 1.0" in out.read_text()
    assert ca.main(["--tier", str(tmp_path), "--output", str(tmp_path / "no" / "x.prom")]) == 1


def scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stdout: str, stderr: str
             ) -> None:
    """A stand-in `scontrol` on PATH printing what the real one prints in that case."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "out").write_text(stdout)
    (fake / "err").write_text(stderr)
    (fake / "scontrol").write_text(f"#!/bin/sh\ncat {fake}/out\ncat {fake}/err >&2\nexit 1\n")
    (fake / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")


def series(text: str) -> dict[str, float]:
    return {s.name + (s.labels.get("job_id", "") and f"/{s.labels['job_id']}"): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_node_without_jobs_is_up_with_no_series(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:
    """Slurm 22.05's scontrol exits 1 with this message when the node runs nothing."""
    scontrol(tmp_path, monkeypatch, HEADER, "No job steps exist on this node.\n")
    text = generate_latest(ca.collect(tmp_path)).decode()
    assert series(text) == {"gpupool_checkpoint_age_up": 1.0,
                            "gpupool_checkpoint_age_unanswered_steps": 0.0}
    scontrol(tmp_path, monkeypatch, "", "Unable to contact slurmd\n")
    assert series(generate_latest(ca.collect(tmp_path)).decode()) == {
        "gpupool_checkpoint_age_up": 0.0}


# What CI's lab node printed (stop 48): the sockets of three steps killed earlier were
# still in slurmd's spool directory, and the running job's batch step was listed anyway.
STALE = "Unable to connect to slurmstepd: Connection refused\n"


@pytest.mark.parametrize("stderr", [
    STALE * 3,
    STALE + "StepId=7.0 does not exist on this node.\n",  # a step ending while listed
    "Job step 7.4294967291 does not exist on this node.\n",  # the wording before 20.11
])
def test_steps_that_do_not_answer_leave_the_others_measured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, proc: Path, stderr: str) -> None:
    """scontrol exits 1 when any step's socket refuses, after listing every other step:
    reading that as 'slurmd is down' left the node blind to its jobs' checkpoints."""
    tier = tmp_path / "checkpoints"
    process(proc, 2997, {"SLURM_JOB_ACCOUNT": "vision", "SLURM_JOB_NAME": "ckpt-age"})
    checkpoint(tier / "vision" / "ckpt-age", 3 * 3600)
    scontrol(tmp_path, monkeypatch, HEADER + "-1       28       extern   0       0\n"
             "2991     28       extern   -       -\n2997     28       batch    0       0\n",
             stderr)
    got = series(generate_latest(ca.collect(tier, proc=proc, now=lambda: NOW)).decode())
    assert got == {"gpupool_checkpoint_age_up": 1.0,
                   "gpupool_checkpoint_age_unanswered_steps": float(stderr.count("\n")),
                   "gpupool_checkpoint_age_seconds/28": 3 * 3600.0}


@pytest.mark.parametrize("stderr", [
    "Unable to contact slurmd\n",
    STALE + "scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error\n",
    STALE + "\x1b[2J does not exist on this node.\n" + "x" * 300 + "\n",
    "",  # exit 1 and nothing said: not a listing to trust
])
def test_anything_but_per_step_complaints_is_slurmd_unavailable(stderr: str) -> None:
    with pytest.raises(ca.SlurmdUnavailable, match="exit 1"):
        ca.read_listing("scontrol listpids", 1, HEADER + "10 8 batch 0 0\n", stderr)


def test_main_never_writes_through_a_planted_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:
    """The collector is root: a link at the final name, or at the temporary name
    prometheus_client used to open (`<name>.<pid>.<thread>`), pointing at a file root
    owns, leaves that file alone (gpupool/onhost/prom_textfile.py)."""
    monkeypatch.setattr(ca, "run_command", lambda argv: ca.Listing(HEADER))
    textfiles = tmp_path / "node-exporter"
    textfiles.mkdir(mode=0o755)
    victim = tmp_path / "passwd"
    victim.write_text("root:x:0:0::/root:/bin/sh\n")
    out = textfiles / "gpupool_checkpoint_age.prom"
    out.symlink_to(victim)
    monkeypatch.setattr(ca.prom_textfile, "_temporary_name", lambda name: f"{name}.guessed")
    (textfiles / f"{out.name}.guessed").symlink_to(victim)
    assert ca.main(["--tier", str(tmp_path), "--output", str(out)]) == 1  # every name planted
    monkeypatch.undo()
    monkeypatch.setattr(ca, "run_command", lambda argv: ca.Listing(HEADER))
    assert ca.main(["--tier", str(tmp_path), "--output", str(out)]) == 0
    assert victim.read_text() == "root:x:0:0::/root:/bin/sh\n"
    assert not out.is_symlink() and "gpupool_checkpoint_age_up 1.0" in out.read_text()
    # A textfile directory others may write is refused: logged, nothing written.
    textfiles.chmod(0o777)
    out.unlink()
    assert ca.main(["--tier", str(tmp_path), "--output", str(out)]) == 1
    assert not out.exists()
