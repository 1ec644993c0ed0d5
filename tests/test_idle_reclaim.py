"""Idle-GPU reclaim (gpupool/onhost/idle_reclaim.py): the rule from the description to the
controller's configuration, and one pass's decisions with Slurm's commands and Prometheus
answered by FIXTURES (a recorded command log and canned query results; the real squeue,
scontrol, Prometheus and dcgm-exporter's job map run in
tests/integration/test_monitoring_lab.py)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpupool.onhost import idle_reclaim as ir
from gpupool.render import inventory, scheduling
from tests.conftest import lab_description

NOW = 1_000_000.0
RULE = ir.Rule(after_s=600, warn_s=120, action="cancel", threshold_percent=0)
START = "2026-12-01T10:00:00"


class FakeSlurm:
    """FIXTURE Slurm: squeue answers the given running jobs; every command is recorded;
    commands whose first words are in `refuse` fail as Slurm would."""

    def __init__(self, squeue: str, refuse: tuple[str, ...] = (), show: str = "") -> None:
        self.squeue, self.refuse, self.show, self.calls = squeue, refuse, show, []

    def __call__(self, argv: list[str]) -> str:
        self.calls.append(argv)
        if argv[0] == "squeue":
            return self.squeue
        if argv[:4] == ["scontrol", "-o", "show", "job"]:
            if "show" in self.refuse:
                raise ir.Unavailable("scontrol: Invalid job id specified")
            return self.show
        if " ".join(argv[:2]) in self.refuse or argv[0] in self.refuse:
            raise ir.Unavailable(f"{argv[0]}: Invalid job id specified")
        return ""

    def taken(self) -> list[list[str]]:
        return [c for c in self.calls if c[0] != "squeue"]


def fake_query(peak: dict[str, float], samples: dict[str, float]) -> ir.Query:
    """FIXTURE Prometheus: the peak query answers `peak`, the sample count `samples`."""
    def query(promql: str) -> dict[str, float]:
        assert 'DCGM_FI_DEV_GPU_UTIL{hpc_job!=""}[600s]' in promql, promql
        return peak if promql.startswith("max by") else samples
    return query


def started(seconds_ago: float) -> str:
    """A start time as squeue prints it: local time."""
    return datetime.fromtimestamp(NOW - seconds_ago).isoformat(timespec="seconds")


def one_pass(squeue: str, peak: dict[str, float], state: dict[str, Any] | None = None,
             samples: dict[str, float] | None = None, now: float = NOW,
             refuse: tuple[str, ...] = ()) -> tuple[dict[str, Any], FakeSlurm]:
    slurm = FakeSlurm(squeue, refuse)
    counts = samples if samples is not None else dict.fromkeys(peak, 40.0)
    out = ir.reclaim({"interactive": RULE}, state or {}, slurm, fake_query(peak, counts), now)
    return out, slurm


def test_the_description_s_rule_reaches_the_controller_in_seconds() -> None:
    desc = lab_description()
    plan = scheduling.idle_reclaim_plan(desc)
    assert plan == {"interactive": {"after_s": 1800, "warn_s": 600, "action": "cancel",
                                    "threshold_percent": 0}}
    assert inventory.pool_vars(desc)["gpupool_idle_reclaim"] == plan
    auth = {"user": "gpupool", "password_file": "/etc/prometheus/web/password",
            "ca_file": "/etc/prometheus/web/tls.crt"}
    endpoint, rules = ir.load_config(json.dumps({"prometheus": "https://10.0.0.1:9090",
                                                 "auth": auth, "classes": plan}))
    assert endpoint == ir.Endpoint("https://10.0.0.1:9090", **auth)
    assert rules == {"interactive": ir.Rule(1800, 600, "cancel", 0)}


@pytest.mark.parametrize("config", [
    [], {"classes": {}}, {"prometheus": "http://x:9090"},
    {"prometheus": "http://x:9090 --evil", "classes": {}},
    {"prometheus": "file:///etc/shadow", "classes": {}},
    {"prometheus": "http://x:9090", "classes": {"a\nb": {}}},
    {"prometheus": "http://x:9090", "classes": {"a": {"after_s": "x"}}},
    {"prometheus": "http://x:9090", "classes": {"a": {"after_s": 60, "warn_s": 0,
                                                      "action": "rm -rf /",
                                                      "threshold_percent": 0}}},
])
def test_a_malformed_configuration_is_refused(config: Any) -> None:
    with pytest.raises(ValueError):
        ir.load_config(json.dumps(config))


def test_an_idle_job_is_warned_then_cancelled_after_the_warning() -> None:
    squeue = f"41|interactive|vision|{started(700)}\n"
    state, slurm = one_pass(squeue, {"41": 0.0})
    assert state["warned"] == {"41": NOW}
    taken = slurm.taken()
    assert taken[0][:3] == ["scontrol", "update", "JobId=41"]
    assert taken[0][3].startswith("AdminComment=gpupool idle-reclaim warned ")
    assert taken[1][:3] == ["scontrol", "notify", "41"]
    assert not any(c[0] == "scancel" for c in taken)

    # Within the warning: nothing more.
    state, slurm = one_pass(squeue, {"41": 0.0}, state, now=NOW + 60)
    assert slurm.taken() == [] and state["warned"] == {"41": NOW}

    state, slurm = one_pass(squeue, {"41": 0.0}, state, now=NOW + 120)
    assert ["scancel", "41"] in slurm.taken()
    assert state == {"warned": {}, "counts": {"interactive|vision|warned": 1,
                                             "interactive|vision|cancelled": 1}}


def test_a_warned_job_that_uses_its_gpus_again_is_cleared() -> None:
    squeue = f"41|interactive|vision|{started(700)}\n"
    state, _ = one_pass(squeue, {"41": 0.0})
    state, slurm = one_pass(squeue, {"41": 35.0}, state, now=NOW + 200)
    assert state["warned"] == {}
    assert state["counts"]["interactive|vision|cleared"] == 1
    assert not any(c[0] == "scancel" for c in slurm.taken())


def test_requeue_is_the_class_s_other_action() -> None:
    slurm = FakeSlurm(f"7|deferred|nlp|{started(900)}\n")
    rule = ir.Rule(600, 0, "requeue", 0)
    state = ir.reclaim({"deferred": rule}, {"warned": {"7": NOW - 1}}, slurm,
                       fake_query({"7": 0.0}, {"7": 40.0}), NOW)
    assert ["scontrol", "requeue", "7"] in slurm.taken()
    assert state["counts"] == {"deferred|nlp|requeued": 1}


@pytest.mark.parametrize(("why", "squeue", "peak", "samples"), [
    ("busy", f"41|interactive|vision|{started(700)}", {"41": 3.0}, {"41": 40.0}),
    ("younger than the window", f"41|interactive|vision|{started(300)}", {"41": 0.0},
     {"41": 40.0}),
    ("too few samples", f"41|interactive|vision|{started(700)}", {"41": 0.0}, {"41": 2.0}),
    ("no series (exporter down, no job map)", f"41|interactive|vision|{started(700)}", {},
     {}),
    ("a class without a rule", f"41|training|vision|{started(700)}", {"41": 0.0},
     {"41": 40.0}),
    ("not a job id", f"41 ;reboot|interactive|vision|{started(700)}", {"41 ;reboot": 0.0},
     {"41 ;reboot": 40.0}),
    ("no start time", "41|interactive|vision|N/A", {"41": 0.0}, {"41": 40.0}),
])
def test_no_evidence_no_action(why: str, squeue: str, peak: dict[str, float],
                               samples: dict[str, float]) -> None:
    state, slurm = one_pass(squeue + "\n", peak, samples=samples)
    assert slurm.taken() == [], why
    assert state == {"warned": {}, "counts": {}}


def test_a_step_slurm_refuses_is_not_counted_and_the_pass_goes_on() -> None:
    squeue = (f"41|interactive|vision|{started(700)}\n"
              f"42|interactive|nlp|{started(700)}\n")
    state = {"warned": {"41": NOW - 500, "42": NOW - 500}}
    out, slurm = one_pass(squeue, {"41": 0.0, "42": 0.0}, state, refuse=("scancel",))
    assert [c for c in slurm.taken() if c[0] == "scancel"] == [["scancel", "41"],
                                                              ["scancel", "42"]]
    assert out["counts"] == {} and set(out["warned"]) == {"41", "42"}  # tried again next


def test_a_warned_job_that_ended_by_itself_is_forgotten() -> None:
    state, _ = one_pass("", {}, {"warned": {"41": NOW - 10}, "counts": {"a|b|warned": 1}})
    assert state == {"warned": {}, "counts": {"a|b|warned": 1}}


def test_prometheus_is_not_asked_when_no_job_of_a_ruled_class_runs() -> None:
    def down(promql: str) -> dict[str, float]:
        raise ir.Unavailable("Prometheus down")
    slurm = FakeSlurm(f"41|training|vision|{started(700)}\n")
    assert ir.reclaim({"interactive": RULE}, {}, slurm, down, NOW) == {"warned": {},
                                                                        "counts": {}}


def test_damaged_state_is_read_as_empty_and_counts_reach_the_textfile(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("{not json")
    assert ir.read_state(str(path)) == {}
    path.write_text(json.dumps({"warned": {"41": "soon", "42": 5.0},
                                "counts": {"a|b|warned": True, "a|b|cancelled": 2}}))
    state = ir.read_state(str(path))
    assert state == {"warned": {"42": 5.0}, "counts": {"a|b|cancelled": 2}}
    ir.write_state(str(path), state)
    assert json.loads(path.read_text()) == state
    prom = tmp_path / "idle.prom"
    ir.write_textfile(str(prom), {**state["counts"], 'x"y|b|bogus': 3})
    text = prom.read_text()
    assert 'gpupool_idle_reclaim_total{class="a",step="cancelled",team="b"} 2.0' in text
    assert "bogus" not in text


class _Prometheus(http.server.BaseHTTPRequestHandler):
    """FIXTURE Prometheus on loopback: answers every query with the server's `answer`."""

    def do_GET(self) -> None:
        body = self.server.answer  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[http.server.HTTPServer]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Prometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_queries_read_prometheus_s_vector_and_refuse_anything_else(
        prometheus: http.server.HTTPServer) -> None:
    url = f"http://127.0.0.1:{prometheus.server_address[1]}"
    query = ir.prometheus_query(ir.Endpoint(url))
    result = [{"metric": {"hpc_job": "41"}, "value": [1, "0"]},
              {"metric": {"hpc_job": "42"}, "value": [1, "NaN-ish"]}]
    answer = {"status": "success", "data": {"resultType": "vector", "result": result}}
    prometheus.answer = json.dumps(answer).encode()  # type: ignore[attr-defined]
    assert query("up") == {"41": 0.0}
    for answer in (b"<html>", b'{"status": "error", "error": "bad_data"}'):
        prometheus.answer = answer  # type: ignore[attr-defined]
        with pytest.raises(ir.Unavailable):
            query("up")


def test_main_says_why_nothing_was_judged(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.json"
    state = tmp_path / "state.json"
    config.write_text(json.dumps({"prometheus": "http://127.0.0.1:9", "classes": {
        "interactive": {"after_s": 600, "warn_s": 60, "action": "cancel",
                        "threshold_percent": 0}}}))
    monkeypatch.setattr(ir, "run_command", FakeSlurm(f"41|interactive|v|{START}\n"))
    prom = tmp_path / "idle.prom"
    args = ["--config", str(config), "--state", str(state), "--textfile", str(prom)]
    assert ir.main(args) == 1
    assert "nothing judged this time: Prometheus http://127.0.0.1:9" in caplog.text
    assert not state.exists()
    # What the IdleReclaimNotRunning alert reads: this run judged nothing, none ever did.
    assert "gpupool_idle_reclaim_up 0.0" in prom.read_text()
    assert "gpupool_idle_reclaim_last_success_seconds 0.0" in prom.read_text()
    # A run that judges (here: no class declares a rule) says so, and the time is kept.
    config.write_text(json.dumps({"prometheus": "http://127.0.0.1:9", "classes": {}}))
    assert ir.main(args) == 0
    last = json.loads(state.read_text())["last_success"]
    assert last > 0 and "gpupool_idle_reclaim_up 1.0" in prom.read_text()
    assert ir.read_state(str(state))["last_success"] == last
    config.write_text("[]")
    assert ir.main(["--config", str(config), "--state", str(state)]) == 2
    assert ir.main(["--config", str(tmp_path / "missing"), "--state", str(state)]) == 2


# As Slurm 22.05 and 23.02+ print a running job (one line, -o).
SHOW_22 = ("JobId=41 JobName=nb UserId=ana(1001) Partition=interactive "
           "TRES=cpu=4,mem=16G,node=1,billing=4,gres/gpu=2,gres/gpu:fixture=2 "
           "TresPerJob=gres:gpu:2 AdminComment=x")
SHOW_23 = ("JobId=41 ReqTRES=cpu=1,mem=1G,node=1,billing=1,gres/gpu=8 "
           "AllocTRES=cpu=4,mem=16G,node=1,billing=4,gres/gpu=3")


@pytest.mark.parametrize(("show", "gpus"), [(SHOW_22, 2), (SHOW_23, 3), ("", 0),
                                            ("JobId=41 TRES=cpu=4,node=1", 0)])
def test_gpus_held_are_the_allocated_ones(show: str, gpus: int) -> None:
    job = ir.Job("41", "interactive", "vision", NOW)
    assert ir.gpus_held(FakeSlurm("", show=show), job) == gpus
    assert ir.gpus_held(FakeSlurm("", refuse=("show",), show=show), job) == 0


def test_an_action_counts_the_idle_gpu_hours_it_ended(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """GPUs held x (the class's window + warning to action), per class, team and step; in
    the journal line, the AdminComment, the state and the textfile."""
    squeue = f"41|interactive|vision|{started(900)}\n"
    warned_at = NOW - 180  # the warning came 180 s ago; the window is RULE.after_s (600 s)
    slurm = FakeSlurm(squeue, show=SHOW_22)
    caplog.set_level("INFO")
    state = ir.reclaim({"interactive": RULE}, {"warned": {"41": warned_at}}, slurm,
                       fake_query({"41": 0.0}, {"41": 40.0}), NOW)
    want = 2 * (600 + 180) / 3600
    assert state["gpu_hours"] == {"interactive|vision|cancelled": pytest.approx(want)}
    assert ["scancel", "41"] in slurm.taken()
    comment = next(c[3] for c in slurm.taken() if c[:2] == ["scontrol", "update"])
    assert "2 GPU(s) idle 780s: 0.433 GPU-hours reclaimed" in comment
    assert "job 41 (class interactive, team vision): cancelled:" in caplog.text
    assert "0.433 GPU-hours reclaimed" in caplog.text
    # A second action adds; a requeue is its own step.
    state["warned"] = {"41": NOW}
    state = ir.reclaim({"interactive": ir.Rule(600, 0, "requeue", 0)}, state, slurm,
                       fake_query({"41": 0.0}, {"41": 40.0}), NOW)
    assert state["gpu_hours"]["interactive|vision|requeued"] == pytest.approx(2 * 600 / 3600)
    path = tmp_path / "state.json"
    ir.write_state(str(path), state)
    assert ir.read_state(str(path))["gpu_hours"] == state["gpu_hours"]
    prom = tmp_path / "idle.prom"
    ir.write_textfile(str(prom), state["counts"], gpu_hours={
        **state["gpu_hours"], "a|b|warned": 5.0})
    text = prom.read_text()
    assert "# HELP gpupool_idle_reclaim_gpu_hours_total Idle GPU-hours" in text
    assert ('gpupool_idle_reclaim_gpu_hours_total{class="interactive",step="cancelled",'
            f'team="vision"}} {want!r}') in text
    assert 'step="warned"' not in text.split("gpupool_idle_reclaim_gpu_hours_total", 1)[1]


def test_an_action_on_a_job_whose_gpus_slurm_does_not_show_counts_no_hours() -> None:
    slurm = FakeSlurm(f"41|interactive|vision|{started(900)}\n", refuse=("show",))
    state = ir.reclaim({"interactive": RULE}, {"warned": {"41": NOW - 180}}, slurm,
                       fake_query({"41": 0.0}, {"41": 40.0}), NOW)
    assert ["scancel", "41"] in slurm.taken()
    assert state["counts"] == {"interactive|vision|cancelled": 1}
    assert "gpu_hours" not in state


def test_damaged_gpu_hours_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text('{"gpu_hours": {"a|b|cancelled": 1.5, "a|b|requeued": -1, '
                    '"c|d|cancelled": "x", "e|f|cancelled": true, "g|h|cancelled": 2}}')
    assert ir.read_state(str(path))["gpu_hours"] == {"a|b|cancelled": 1.5,
                                                     "g|h|cancelled": 2.0}
