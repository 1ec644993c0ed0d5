"""The spot interruption watcher (gpupool/onhost/spot_watch.py) against a fixture IMDSv2
and stubbed Slurm commands.

`imds` is the lab's FIXTURE metadata service (gpupool/lab/fixture_imds.py, the one inside
each lab burst host) on 127.0.0.1, standing in for EC2's. It serves the paths the watcher
reads, issues session tokens on `PUT /latest/api/token` (which must carry a TTL header)
and refuses a GET without a live token with 401; the tests set which notices it serves
and can revoke its tokens. It claims no AWS behaviour beyond the documented paths and
status codes the watcher relies on.

`slurm` puts fake `scontrol`, `squeue` and `scancel` first on PATH: each appends its argv
to a log; squeue lists the jobs the test names, and `scontrol requeue` refuses the jobs
the test says cannot be requeued.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpupool.lab import fixture_imds
from gpupool.onhost import spot_watch

NODE = "burst-p5-1"
WHEN = "2026-12-01T11:20:00Z"
INTERRUPT = json.dumps({"action": "terminate", "time": WHEN})
REBALANCE = json.dumps({"noticeTime": "2026-12-01T11:15:00Z"})


class FakeImds:
    """The lab's metadata FIXTURE (gpupool/lab/fixture_imds.py) as the watcher's tests drive
    it: the instance's type and zone in its state file, the notices in the files beside it
    (absent: 404), and what it saw (its Seen: tokens, puts, refused, paths, broken)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.seen, self.base = folder, fixture_imds.Seen(), ""
        self.state = folder / "state.json"
        self.state.write_text(json.dumps({"meta-data": {}}))
        self.instance_type, self.zone = "p5.48xlarge", "us-east-1a"

    def _meta(self, key: str, value: str) -> None:
        data = json.loads(self.state.read_text())
        data["meta-data"][key] = value
        self.state.write_text(json.dumps(data))

    def _notice(self, path: str, text: str | None) -> None:
        file = self.folder / fixture_imds.NOTICE_FILES[path]
        if text is None:
            file.unlink(missing_ok=True)
        else:
            file.write_text(text)

    instance_type = property(None, lambda self, v: self._meta("instance-type", v))
    zone = property(None, lambda self, v: self._meta("placement/availability-zone", v))
    instance_action = property(None, lambda self, v: self._notice("spot/instance-action", v))
    rebalance = property(None, lambda self, v: self._notice(
        "events/recommendations/rebalance", v))

    @property
    def tokens(self) -> set[str]:
        return self.seen.tokens

    @property
    def puts(self) -> int:
        return self.seen.puts

    @property
    def refused(self) -> int:
        return self.seen.refused

    @property
    def paths(self) -> list[str]:
        return self.seen.paths

    broken = property(None, lambda self, v: setattr(self.seen, "broken", v))


@pytest.fixture
def imds(tmp_path: Path) -> Iterator[FakeImds]:
    state = FakeImds(tmp_path / "imds")
    with fixture_imds.serving(state.state, state.seen) as base:
        state.base = base
        yield state


FAKE = """#!{python}
import json, os, sys
name = os.path.basename(sys.argv[0])
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps([name, *sys.argv[1:]]) + "\\n")
if name == "squeue":
    print("\\n".join(os.environ.get("FAKE_JOBS", "").split()))
if name == "scontrol" and sys.argv[1] == "requeue" \\
        and sys.argv[2] in os.environ.get("FAKE_NOREQUEUE", "").split():
    sys.exit("Requested operation is presently disabled")
"""


@dataclass
class FakeSlurm:
    log: Path

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("scontrol", "squeue", "scancel"):
        fake = bin_dir / name
        fake.write_text(FAKE.format(python=sys.executable))
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("FAKE_JOBS", "101 102")
    return FakeSlurm(tmp_path / "calls.jsonl")


def _watcher(imds: FakeImds) -> spot_watch.Watcher:
    return spot_watch.Watcher(NODE, spot_watch.Imds(imds.base))


def _drains(slurm: FakeSlurm) -> list[str]:
    return [c[4].removeprefix("reason=") for c in slurm.calls()
            if c[:4] == ["scontrol", "update", f"nodename={NODE}", "state=drain"]]


def test_no_notice_does_nothing(imds: FakeImds, slurm: FakeSlurm) -> None:
    watcher = _watcher(imds)
    assert watcher.run(0.05, once=True) == 0
    assert not watcher.poll()
    assert slurm.calls() == []
    # Type and zone are asked only when there is something to record.
    assert spot_watch.INSTANCE_TYPE_PATH not in imds.paths


def test_rebalance_only_drains_once(imds: FakeImds, slurm: FakeSlurm) -> None:
    imds.rebalance = REBALANCE
    watcher = _watcher(imds)
    assert not watcher.poll()
    assert not watcher.poll()
    assert [c[0] for c in slurm.calls()] == ["scontrol"]  # no squeue, requeue or signal
    [reason] = _drains(slurm)
    assert reason == ("gpupool: spot rebalance recommendation at 2026-12-01T11:15:00Z "
                      "[instance-type=p5.48xlarge zone=us-east-1a]")
    record = spot_watch.RECORD.fullmatch(reason)
    assert record and record["kind"] == "rebalance recommendation"


def test_interruption_drains_requeues_and_records_once(imds: FakeImds,
                                                       slurm: FakeSlurm) -> None:
    imds.rebalance, imds.instance_action = REBALANCE, INTERRUPT
    sleeps: list[float] = []
    watcher = _watcher(imds)
    assert watcher.run(0.05, sleep=sleeps.append) == 0  # stops once interrupted
    assert watcher.run(0.05, sleep=sleeps.append) == 0  # polled again: acts on nothing new
    assert sleeps == []
    calls = slurm.calls()
    interruption = ("gpupool: spot interruption notice, terminating at 2026-12-01T11:20:00Z "
                    "[instance-type=p5.48xlarge zone=us-east-1a]")
    assert _drains(slurm)[0] == interruption  # the interruption first, then the rebalance
    assert len(_drains(slurm)) == 2
    assert calls[1] == ["squeue", "--noheader", f"--nodelist={NODE}",
                        "--states=RUNNING,SUSPENDED,CONFIGURING", "--format=%A"]
    assert [c for c in calls if c[0] != "squeue" and c[1] == "requeue"] == [
        ["scontrol", "requeue", "101"], ["scontrol", "requeue", "102"]]
    assert not [c for c in calls if c[0] == "scancel"]
    record = spot_watch.RECORD.fullmatch(interruption)
    assert record and (record["verb"], record["time"], record["instance_type"],
                       record["zone"]) == ("terminating", WHEN, "p5.48xlarge", "us-east-1a")


def test_a_job_slurm_will_not_requeue_is_signalled(imds: FakeImds, slurm: FakeSlurm,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NOREQUEUE", "102")
    monkeypatch.setenv("FAKE_JOBS", "101 102 not-a-job")
    imds.instance_action = json.dumps({"action": "stop", "time": WHEN})
    assert _watcher(imds).poll()
    calls = slurm.calls()
    assert "stopping at" in _drains(slurm)[0]
    assert calls[2:] == [["scontrol", "requeue", "101"], ["scontrol", "requeue", "102"],
                         ["scancel", "--signal=TERM", "102"]]


def test_a_failed_drain_is_tried_again(imds: FakeImds, slurm: FakeSlurm,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    imds.instance_action = INTERRUPT
    monkeypatch.setenv("PATH", "/nonexistent")  # slurmctld's commands are missing
    watcher = _watcher(imds)
    assert not watcher.poll()
    monkeypatch.setenv("PATH", f"{slurm.log.parent / 'bin'}:/usr/bin:/bin")
    assert watcher.poll()
    assert len(_drains(slurm)) == 1


@pytest.mark.parametrize("hostile", [
    {"instance_type": "p5.48xlarge;reboot"},
    {"instance_type": "p5.48xlarge zone=eu-west-1a]"},
    {"zone": 'us-east-1a" state=resume reason="x'},
    {"instance_action": json.dumps({"action": "terminate",
                                    "time": '2026-12-01T11:20:00Z" state=resume'})},
    {"instance_action": json.dumps({"action": "terminate", "time": "2026-13-01T11:20:00Z"})},
    {"instance_action": json.dumps({"action": "terminate;reboot", "time": WHEN})},
    {"instance_action": "not json"},
    {"instance_action": json.dumps(["terminate"])},
], ids=["type-separator", "type-space", "zone-quotes", "time-quotes", "time-month",
        "action", "not-json", "not-object"])
def test_hostile_imds_values_never_reach_a_command(imds: FakeImds, slurm: FakeSlurm,
                                                   hostile: dict[str, str]) -> None:
    imds.instance_action = INTERRUPT
    for name, value in hostile.items():
        setattr(imds, name, value)
    assert _watcher(imds).poll()  # a malformed notice is still acted on
    [reason] = _drains(slurm)
    # An unknown action is taken for termination, the spot default and the worst case.
    assert spot_watch.UNKNOWN in reason or "terminate;" in str(hostile)
    assert spot_watch.RECORD.fullmatch(reason)
    for call in slurm.calls():
        assert not any(c in arg for arg in call for c in ";\"'`$\n")
        assert "resume" not in " ".join(call) and "reboot" not in " ".join(call)


@pytest.mark.parametrize("node", ["node;reboot", "-x", "a b", "x" * 64, ""])
def test_a_hostile_node_name_is_refused(imds: FakeImds, node: str) -> None:
    with pytest.raises(ValueError, match="node name"):
        spot_watch.Watcher(node, spot_watch.Imds(imds.base))


@pytest.mark.parametrize("base", ["file:///etc/passwd", "https://169.254.169.254",
                                  "http://169.254.169.254/latest", "http://u@host",
                                  "http://"])
def test_imds_base_must_be_a_plain_http_origin(base: str) -> None:
    with pytest.raises(ValueError, match="IMDS base"):
        spot_watch.Imds(base)


def test_token_is_renewed_before_it_expires_and_when_refused(imds: FakeImds,
                                                             slurm: FakeSlurm) -> None:
    now = [1000.0]
    client = spot_watch.Imds(imds.base, ttl_s=60, clock=lambda: now[0])
    assert client.get(spot_watch.INSTANCE_ACTION) is None
    assert client.get(spot_watch.REBALANCE) is None
    assert imds.puts == 1  # one token serves many requests
    now[0] += 60 - spot_watch.TOKEN_MARGIN_S  # within the margin of its expiry
    assert client.get(spot_watch.INSTANCE_ACTION) is None
    assert (imds.puts, imds.refused) == (2, 0)  # renewed before IMDS had to refuse it
    imds.tokens.clear()  # IMDS forgot its tokens (restart)
    assert client.get(spot_watch.INSTANCE_TYPE_PATH) == "p5.48xlarge"
    assert (imds.puts, imds.refused) == (3, 1)


def test_unreachable_imds_fails_bounded(slurm: FakeSlurm) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    sleeps: list[float] = []
    watcher = spot_watch.Watcher(NODE, spot_watch.Imds(f"http://127.0.0.1:{port}"))
    assert watcher.run(0.05, once=True) == 1
    assert watcher.run(0.05, sleep=sleeps.append) == 1
    assert len(sleeps) == spot_watch.MAX_FAILURES - 1
    assert slurm.calls() == []


def test_a_hung_imds_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spot_watch, "REQUEST_TIMEOUT_S", 0.2)
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        client = spot_watch.Imds(f"http://127.0.0.1:{silent.getsockname()[1]}")
        start = time.monotonic()
        with pytest.raises(spot_watch.ImdsError):
            client.get(spot_watch.INSTANCE_ACTION)
        assert time.monotonic() - start < 2


@pytest.mark.parametrize("status", [503, 302])
def test_an_imds_error_or_redirect_is_a_failure(imds: FakeImds, status: int) -> None:
    imds.broken = status  # a redirect is not followed: the token stays with IMDS
    with pytest.raises(spot_watch.ImdsError, match=f"HTTP {status}"):
        spot_watch.Imds(imds.base).get(spot_watch.INSTANCE_ACTION)


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="no system python3")
def test_runs_as_a_script_on_the_standard_library_alone(imds: FakeImds,
                                                        slurm: FakeSlurm) -> None:
    imds.instance_action = INTERRUPT
    script = Path(spot_watch.__file__)
    # -I -S: no site-packages, no PYTHONPATH, no user site: what a bare node has.
    argv = ["/usr/bin/python3", "-I", "-S", str(script), "--node", NODE, "--imds",
            imds.base, "--once"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert len(_drains(slurm)) == 1
    assert ["scontrol", "requeue", "101"] in slurm.calls()
    bad = subprocess.run(["/usr/bin/python3", "-I", "-S", str(script), "--node", "a;b",
                          "--once"], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "node name" in bad.stderr
