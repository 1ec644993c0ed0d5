"""The health loop (gpupool/gate/health.py) against a FIXTURE Slurm and gate: the
decisions of one run, from the verdict and the node's Slurm state. The loop on a real
node, with real Slurm, is the lab drill in tests/integration/test_gate_lab.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpupool.gate import health
from gpupool.gate.health import Config, ConfigError, Loop
from gpupool.spec.model import HealthStep


class FixtureSlurm:
    """sinfo, squeue and scontrol for one node, and every other command recorded."""

    def __init__(self, state: str = "idle", reason: str = "", jobs: tuple[str, ...] = ()):
        self.state, self.reason, self.jobs = state, reason, list(jobs)
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], timeout: float) -> tuple[int, str]:
        self.calls.append(argv)
        if argv[0] == "sinfo":
            return 0, f"{self.state} {self.reason or 'none'}"
        if argv[0] == "squeue":
            return 0, "\n".join(self.jobs)
        if argv[:2] == ["scontrol", "update"]:
            if "State=DRAIN" in argv:
                self.state = "draining" if self.jobs else "drained"
                self.reason = next(a for a in argv if a.startswith("Reason="))[7:]
            if "State=RESUME" in argv:
                self.state, self.reason = "idle", ""
        if argv[:2] == ["scontrol", "requeue"]:
            self.jobs.remove(argv[2])
        return 0, ""

    def ran(self, *prefix: str) -> list[list[str]]:
        return [c for c in self.calls if c[:len(prefix)] == list(prefix)]


def verdict(failed: tuple[str, ...] = (), action: str | None = None) -> dict[str, Any]:
    return {"verdict": "fail" if failed else "pass", "failed": list(failed), "action": action}


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def config(tmp_path: Path, **over: Any) -> Config:
    raw = {"node": "gpu-01", "expect": "/etc/gpupool/health/expect.json",
           "state_dir": str(tmp_path / "state"), "textfile_dir": str(tmp_path),
           "reset": "act", "reboot": "record", "drain_timeout_s": 600,
           "isolate_after": 3, "window_s": 86400, "gpus": 2, **over}
    return Config.parse(raw)


def run(cfg: Config, slurm: FixtureSlurm, *verdicts: dict[str, Any],
        clock: Clock | None = None) -> dict[str, Any]:
    queue = list(verdicts)
    return Loop(cfg, slurm, gate=lambda c: queue.pop(0) if len(queue) > 1 else queue[0],
                now=clock or Clock()).step()


def metrics(tmp_path: Path) -> dict[str, float]:
    lines = (tmp_path / "gpupool_health.prom").read_text().splitlines()
    return {ln.split("{")[0]: float(ln.split()[-1]) for ln in lines if not ln.startswith("#")}


def test_a_passing_node_is_left_alone(tmp_path: Path) -> None:
    slurm = FixtureSlurm()
    entry = run(config(tmp_path), slurm, verdict())
    assert entry["did"] == [] and not slurm.ran("scontrol")
    assert metrics(tmp_path)["gpupool_health_passed"] == 1
    assert metrics(tmp_path)["gpupool_health_up"] == 1
    assert set(metrics(tmp_path)) == set(health.SERIES)


def test_a_failing_node_is_drained_with_the_checks_and_the_action(tmp_path: Path) -> None:
    slurm = FixtureSlurm()
    run(config(tmp_path), slurm, verdict(("software.toolkit",), "reconfigure"))
    assert slurm.state == "drained"
    assert slurm.reason == "gpupool-health: reconfigure: software.toolkit"
    # Reconfigure is on-call's (the roles re-run); the loop takes no action of its own.
    assert not slurm.ran("nvidia-smi") and not slurm.ran("systemctl")


def test_it_returns_the_node_once_it_passes_again(tmp_path: Path) -> None:
    slurm = FixtureSlurm()
    cfg = config(tmp_path)
    run(cfg, slurm, verdict(("software.toolkit",), "reconfigure"))
    run(cfg, slurm, verdict(("software.toolkit",), "reconfigure"))
    assert len(slurm.ran("scontrol", "update")) == 1  # the same failure drains once
    entry = run(cfg, slurm, verdict())
    assert entry["did"] == ["resumed"] and slurm.state == "idle"


@pytest.mark.parametrize("reason", ["maintenance by alice", "gpupool-gate: awaiting gate",
                                    "gpupool-healthy: not ours"])
def test_a_node_drained_by_anyone_else_is_never_touched(tmp_path: Path, reason: str) -> None:
    slurm = FixtureSlurm("drained", reason)
    for v in (verdict(), verdict(("gpu.ecc",), "reset")):
        entry = run(config(tmp_path), slurm, v)
        assert entry["did"][0].startswith("no action: drained by someone else")
    assert not slurm.ran("scontrol") and slurm.reason == reason


def test_monitor_keeps_the_node_serving(tmp_path: Path) -> None:
    slurm = FixtureSlurm()
    entry = run(config(tmp_path), slurm, verdict(("gpu.temperature",), "monitor"))
    assert slurm.state == "idle" and entry["did"] == ["monitor: gpu.temperature"]


def test_reset_waits_for_jobs_then_resets_each_gpu_gates_again_and_returns(
        tmp_path: Path) -> None:
    slurm, clock = FixtureSlurm("mixed", jobs=("41",)), Clock()
    cfg = config(tmp_path)
    failing = verdict(("gpu.ecc",), "reset")
    entry = run(cfg, slurm, failing, clock=clock)
    assert slurm.state == "draining" and "waiting for jobs 41" in entry["did"]
    assert not slurm.ran("nvidia-smi")
    slurm.jobs.clear()
    slurm.state = "drained"
    clock.t += 60
    entry = run(cfg, slurm, failing, verdict(), clock=clock)
    assert slurm.ran("nvidia-smi") == [["nvidia-smi", "-r", "-i", "0"],
                                       ["nvidia-smi", "-r", "-i", "1"]]
    assert entry["did"][-2:] == ["gated again: pass", "resumed"] and slurm.state == "idle"


def test_jobs_that_outlast_the_drain_timeout_are_requeued(tmp_path: Path) -> None:
    slurm, clock = FixtureSlurm("allocated", jobs=("7", "8")), Clock()
    cfg = config(tmp_path)
    failing = verdict(("gpu.ecc",), "reset")
    run(cfg, slurm, failing, clock=clock)
    clock.t += 599
    run(cfg, slurm, failing, clock=clock)
    assert not slurm.ran("scontrol", "requeue")
    clock.t += 1
    entry = run(cfg, slurm, failing, clock=clock)
    assert slurm.ran("scontrol", "requeue") == [["scontrol", "requeue", "7"],
                                                ["scontrol", "requeue", "8"]]
    assert "requeued job 7" in entry["did"]


def test_drain_only_leaves_the_action_to_on_call(tmp_path: Path) -> None:
    slurm = FixtureSlurm()
    run(config(tmp_path, reset="drain"), slurm, verdict(("gpu.ecc",), "reset"))
    assert slurm.state == "drained" and not slurm.ran("nvidia-smi")


def test_reboot_is_requested_after_the_state_is_saved(tmp_path: Path) -> None:
    slurm = FixtureSlurm()
    cfg = config(tmp_path, reboot="act")
    entry = run(cfg, slurm, verdict(("gpu.driver_loaded",), "reboot"))
    assert slurm.ran("systemctl") == [["systemctl", "reboot"]]
    assert entry["did"][-1] == "reboot requested"
    assert json.loads((cfg.state_dir / "state.json").read_text())["failing"] is True


def test_reboot_recorded_in_the_lab_gates_again(tmp_path: Path) -> None:
    slurm = FixtureSlurm()
    entry = run(config(tmp_path), slurm, verdict(("gpu.driver_loaded",), "reboot"),
                verdict())
    assert not slurm.ran("systemctl")
    assert entry["did"][1].startswith("reboot: recorded, not taken")
    assert slurm.state == "idle"


def test_repeated_failures_of_one_check_isolate_the_node_for_good(tmp_path: Path) -> None:
    slurm, clock = FixtureSlurm(), Clock()
    cfg = config(tmp_path, isolate_after=2)
    failing = verdict(("gpu.ecc[0]",), "reset")
    run(cfg, slurm, failing, verdict(), clock=clock)  # reset, back
    assert slurm.state == "idle"
    clock.t += 3600
    run(cfg, slurm, failing, clock=clock)  # the second time within the window
    assert slurm.reason == "gpupool-health: isolate: gpu.ecc[0]"
    assert metrics(tmp_path)["gpupool_health_isolated"] == 1
    assert metrics(tmp_path)["gpupool_health_failures_in_window"] == 2
    clock.t += 600
    run(cfg, slurm, verdict(), clock=clock)  # passing no longer returns it
    assert slurm.state == "drained" and slurm.reason.startswith("gpupool-health: isolate")


def test_failures_outside_the_window_do_not_count(tmp_path: Path) -> None:
    slurm, clock = FixtureSlurm(), Clock()
    cfg = config(tmp_path, isolate_after=2, window_s=3600)
    failing = verdict(("gpu.ecc[0]",), "reset")
    run(cfg, slurm, failing, verdict(), clock=clock)
    clock.t += 3601
    run(cfg, slurm, failing, verdict(), clock=clock)
    assert slurm.state == "idle"


def test_a_gate_that_could_not_run_changes_nothing_and_reports_down(tmp_path: Path) -> None:
    slurm = FixtureSlurm()
    broken = {"verdict": "could-not-run", "failed": [], "action": None}
    entry = run(config(tmp_path), slurm, broken)
    assert not slurm.ran("scontrol") and entry["did"] == ["no action: the gate could not run"]
    assert metrics(tmp_path)["gpupool_health_up"] == 0


def test_hostile_check_ids_cannot_leave_the_reason(tmp_path: Path) -> None:
    slurm = FixtureSlurm()
    run(config(tmp_path), slurm, verdict(("x\nReason=evil; rm -rf /'\"$(id)",), "reconfigure"))
    update = slurm.ran("scontrol", "update")[0]
    assert len(update) == 5 and "\n" not in update[4] and "$(" not in update[4]
    assert update[4].startswith("Reason=gpupool-health: reconfigure: x_Reason_evil_")


def test_a_damaged_state_file_starts_afresh(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    cfg.state_dir.mkdir()
    (cfg.state_dir / "state.json").write_text('{"history": [{"t": "x"}]')
    entry = run(cfg, FixtureSlurm(), verdict())
    assert entry["verdict"] == "pass"


@pytest.mark.parametrize("over", [
    {"node": "gpu-01; reboot"}, {"node": 7}, {"expect": "relative/path"},
    {"state_dir": "/var/lib/../../etc"}, {"reset": "explode"}, {"gpus": True},
    {"isolate_after": 0}, {"drain_timeout_s": -1}, {"textfile_dir": "/tmp/a b"},
])
def test_a_config_not_written_by_the_role_is_refused(tmp_path: Path, over: dict) -> None:
    with pytest.raises(ConfigError):
        config(tmp_path, **over)


def test_main_refuses_a_bad_config_with_a_message(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "c.json"
    bad.write_text("[1]")
    assert health.main([str(bad)]) == 2
    assert "not a JSON object" in capsys.readouterr().err
    assert health.main([]) == 2


def test_health_steps_are_the_descriptions() -> None:
    assert {s.value for s in HealthStep} == {"act", "drain", "record"}


def test_an_isolated_node_returned_by_on_call_starts_afresh(tmp_path: Path) -> None:
    slurm, clock = FixtureSlurm(), Clock()
    cfg = config(tmp_path, isolate_after=1)
    run(cfg, slurm, verdict(("gpu.ecc[0]",), "reset"), clock=clock)
    assert slurm.reason.startswith("gpupool-health: isolate")
    slurm.state, slurm.reason = "idle", ""  # playbooks/node_resume.yml, after service
    clock.t += 60
    entry = run(cfg, slurm, verdict(), clock=clock)
    assert entry["did"] == ["isolation lifted by on-call: failure history cleared"]
    assert metrics(tmp_path)["gpupool_health_failures_in_window"] == 0


def test_a_missing_textfile_directory_does_not_stop_the_loop(tmp_path: Path) -> None:
    slurm = FixtureSlurm()
    entry = run(config(tmp_path, textfile_dir=str(tmp_path / "absent")), slurm,
                verdict(("software.toolkit",), "reconfigure"))
    assert slurm.state == "drained" and entry["did"][-1].startswith("series not written")


def test_a_node_left_with_only_monitor_failures_returns(tmp_path: Path) -> None:
    slurm = FixtureSlurm()
    cfg = config(tmp_path)
    run(cfg, slurm, verdict(("software.toolkit",), "reconfigure"))
    entry = run(cfg, slurm, verdict(("gpu.temperature",), "monitor"))
    assert entry["did"] == ["monitor: gpu.temperature", "resumed"] and slurm.state == "idle"


@pytest.mark.parametrize("text", [
    '{"history": [{"t": 1, "checks": [["x"]]}], "drained_at": "soon"}',
    '{"history": {"t": 1}, "failing": 1}', '{"history": ["x"]}', "[]", "\\u0000",
])
def test_damaged_state_is_read_as_far_as_it_is_sound(tmp_path: Path, text: str) -> None:
    cfg = config(tmp_path)
    cfg.state_dir.mkdir()
    (cfg.state_dir / "state.json").write_text(text)
    slurm = FixtureSlurm("mixed", jobs=("5",))
    entry = run(cfg, slurm, verdict(("gpu.ecc",), "reset"))
    assert slurm.state == "draining" and "waiting for jobs 5" in entry["did"]


def test_the_series_never_go_through_a_planted_link(tmp_path: Path) -> None:
    """The loop is root: links at the final name and at the name it used to write first
    (`gpupool_health.tmp`) pointing at a file root owns leave that file alone, and a
    textfile directory others may write gets no series (gpupool/onhost/prom_textfile.py)."""
    textfiles = tmp_path / "node-exporter"
    textfiles.mkdir(mode=0o755)
    victim = tmp_path / "passwd"
    victim.write_text("root:x:0:0::/root:/bin/sh\n")
    (textfiles / "gpupool_health.prom").symlink_to(victim)
    (textfiles / "gpupool_health.tmp").symlink_to(victim)
    cfg = config(tmp_path, textfile_dir=str(textfiles))
    run(cfg, FixtureSlurm(), verdict())
    assert victim.read_text() == "root:x:0:0::/root:/bin/sh\n"
    assert not (textfiles / "gpupool_health.prom").is_symlink()
    assert metrics(textfiles)["gpupool_health_passed"] == 1
    textfiles.chmod(0o777)
    (textfiles / "gpupool_health.prom").unlink()
    entry = run(cfg, FixtureSlurm(), verdict(("software.toolkit",), "reconfigure"))
    assert "writable by others" in entry["did"][-1] and entry["did"][-1].startswith(
        "series not written")
    assert not (textfiles / "gpupool_health.prom").exists()


def test_a_successful_reset_is_recorded_for_the_xid_check_before_the_gate_runs_again(
        tmp_path: Path) -> None:
    """Issue 51: the XIDs that asked for the reset become history (gpupool/gate/xid.py), so
    the gate run after it can pass; the record is made only when every GPU reset."""
    slurm = FixtureSlurm("drained", reason="gpupool-health: reset: gpu.no_xid_errors")
    entry = run(config(tmp_path), slurm, verdict(("gpu.no_xid_errors",), "reset"), verdict())
    assert slurm.ran(*health.XID_RECORD) == [health.XID_RECORD]
    assert health.XID_RECORD[-4:] == ["-m", "gpupool.gate.xid", "record", "reset"]
    resets = [i for i, c in enumerate(slurm.calls) if c[0] == "nvidia-smi"]
    assert slurm.calls.index(health.XID_RECORD) > max(resets)
    assert entry["did"][-3:] == ["XID cursor: reset recorded", "gated again: pass", "resumed"]


class FailingReset(FixtureSlurm):
    def __call__(self, argv: list[str], timeout: float) -> tuple[int, str]:
        if argv[:2] == ["nvidia-smi", "-r"] and argv[-1] == "1":
            self.calls.append(argv)
            return 1, "Unable to reset this GPU because it's being used by some other process"
        return super().__call__(argv, timeout)


def test_a_failed_reset_leaves_the_xids_counted(tmp_path: Path) -> None:
    slurm = FailingReset("drained", reason="gpupool-health: reset: gpu.no_xid_errors")
    failing = verdict(("gpu.no_xid_errors",), "reset")
    entry = run(config(tmp_path), slurm, failing, failing)
    assert not slurm.ran(*health.XID_RECORD)
    assert entry["did"][-1] == "gated again: fail" and slurm.state == "drained"
