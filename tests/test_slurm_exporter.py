"""The scheduler exporter (gpupool/onhost/slurm_exporter.py) over Slurm 22.05's own output
formats: what each series says, finished jobs counted once across scrapes, hostile or broken
output, and Slurm not answering (gpupool_slurm_up 0, never an exception). The same exporter
runs against the lab's real Slurm in tests/integration/test_monitoring_lab.py."""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.gate import health
from gpupool.onhost import checkpoint_age, controller_backup, idle_reclaim
from gpupool.onhost import slurm_exporter as ex

NOW = datetime(2026, 12, 1, 1, 0, 0).timestamp()

SQUEUE = """\
11|RUNNING|training|vision|2026-12-01T00:50:00|2026-12-01T00:52:00|None
12|PENDING|interactive|nlp|2026-12-01T00:58:00|N/A|(Resources)
13|PENDING|deferred|vision|2026-12-01T00:30:00|N/A|(AssocGrpGRES)
14|PENDING|deferred|vision|2026-12-01T02:00:00|N/A|(BeginTime)
15|RUNNING|training|nlp|2026-12-01T00:55:00|2026-12-01T00:55:05|None
"""
SCONTROL = """\
JobId=11 JobName=train x JobState=PENDING
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   NodeList=lab-gpu[1-2]
   JOB_GRES=gpu:l4:8
     Nodes=lab-gpu[1-2] CPU_IDs=0-3 Mem=0 GRES=gpu:l4:4(IDX:0-3)
   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0
JobId=12 JobName=wait
   JobState=PENDING Reason=Resources Dependency=(null)
JobId=15 JobName=Nodes=lab-gpu3 CPU_IDs=0 Mem=0 GRES=gpu:l4:4(IDX:0-3)
   JobState=RUNNING Reason=None Dependency=(null)
   JOB_GRES=gpu:l4:1
     Nodes=lab-gpu3 CPU_IDs=0 Mem=0 GRES=gpu:l4:1(IDX:2)
"""
SINFO = """\
lab-ctl|idle|(null)|none
lab-gpu1|allocated|gpu:l4:4|none
lab-gpu2|allocated|gpu:l4:4|none
lab-gpu3|mixed|gpu:l4:4(S:0)|none
lab-gpu3|mixed|gpu:l4:4(S:0)|none
l4-burst-0|idle~|gpu:l4:1|none
l4-burst-1|drained*|gpu:l4:1|gpupool-gate: fail system.sshd_hardened | and more
"""
CLOUD = """\
l4-burst-0|10.231.40.7|idle
l4-burst-1|l4-burst-1|idle~
l4-burst-2|10.231.40.9|idle%
l4-burst-3|10.231.40.10|mixed
l4-burst-4|fd00::7|allocated
l4-burst-5|10.0.0.1; reboot|idle
l4-burst-6|10.231.40.11|idle#
not a line
"""
SACCT = """\
8|vision|deferred|PREEMPTED|2026-12-01T00:40:00|2026-12-01T00:41:00|2026-12-01T00:59:00
8|vision|deferred|COMPLETED|2026-12-01T00:59:00|2026-12-01T00:59:30|2026-12-01T01:00:00
9|nlp|training|OUT_OF_MEMORY|2026-12-01T00:50:00|2026-12-01T00:50:10|2026-12-01T00:59:59
10|nlp|interactive|CANCELLED by 0|2026-12-01T00:50:00|Unknown|2026-12-01T00:59:00
"""


class FakeSlurm:
    """Slurm's answers from recorded text: a fixture standing in for the commands."""

    def __init__(self, **answers: str) -> None:
        self.answers = {"squeue": SQUEUE, "scontrol": SCONTROL, "sinfo": SINFO,
                        "sacct": SACCT, "cloud": CLOUD, **answers}
        self.calls: list[list[str]] = []
        self.down = False

    def __call__(self, argv: list[str]) -> str:
        self.calls.append(argv)
        if self.down:
            raise ex.SlurmUnavailable(f"{argv[0]}: Unable to contact slurm controller")
        if argv == ex.SINFO_CLOUD:
            return self.answers["cloud"]
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            return {"lab-gpu[1-2]": "lab-gpu1\nlab-gpu2\n"}[argv[3]]
        return self.answers[argv[0]]


def samples(collector: ex.SlurmCollector) -> list[tuple[str, dict[str, str], float]]:
    collector.last = (float("-inf"), [])
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return [(x.name, dict(x.labels), x.value) for f in text_string_to_metric_families(text)
            for x in f.samples]


def values(collector: ex.SlurmCollector, name: str) -> list[tuple[dict[str, str], float]]:
    return [(labels, v) for n, labels, v in samples(collector) if n == name]


def collector(slurm: FakeSlurm | None = None) -> ex.SlurmCollector:
    started = datetime(2026, 12, 1, 0, 45).timestamp()
    return ex.SlurmCollector(run=slurm or FakeSlurm(), clock=lambda: NOW, started=started)


def test_allocated_gpus_per_job_and_node() -> None:
    c = collector()
    held = values(c, "gpupool_job_gpu_allocated")
    assert sorted((x["job_id"], x["Hostname"], x["gpu"]) for x, _ in held) == sorted(
        [("11", h, str(g)) for h in ("lab-gpu1", "lab-gpu2") for g in range(4)]
        + [("15", "lab-gpu3", "2")])
    assert {(x["team"], x["class"]) for x, _ in held} == {("vision", "training"),
                                                          ("nlp", "training")}
    per_node = {(x["node"], x["state"]): v for x, v in values(c, "gpupool_node_gpus")}
    assert per_node[("lab-gpu3", "allocated")] == 1 and per_node[("lab-gpu3", "idle")] == 3
    assert per_node[("lab-gpu1", "idle")] == 0
    assert per_node[("l4-burst-0", "idle")] == 1
    assert all(x["model"] == "l4" for x, _ in values(c, "gpupool_node_gpus"))


def test_a_job_name_cannot_forge_an_allocation() -> None:
    # Job 15's name imitates a detail line; only real detail lines count.
    held = values(collector(), "gpupool_job_gpu_allocated")
    assert [x["gpu"] for x, _ in held if x["job_id"] == "15"] == ["2"]


def test_pending_jobs_and_their_wait_so_far() -> None:
    c = collector()
    pending = {(x["team"], x["class"], x["reason"]): v
               for x, v in values(c, "gpupool_jobs_pending")}
    assert pending == {("nlp", "interactive", "Resources"): 1,
                       ("vision", "deferred", "AssocGrpGRES"): 1,
                       ("vision", "deferred", "BeginTime"): 1}
    waits = {(x["team"], x["class"]): v
             for x, v in values(c, "gpupool_jobs_pending_wait_seconds_max")}
    # Job 14 is not eligible until 02:00: it has not waited yet.
    assert waits == {("nlp", "interactive"): 120.0, ("vision", "deferred"): 1800.0}


def test_finished_jobs_are_counted_once_across_scrapes() -> None:
    c = collector()
    for _ in range(3):  # sacct keeps returning the same records
        finished = {(x["team"], x["class"], x["state"]): v
                    for x, v in values(c, "gpupool_jobs_finished_total")}
    assert finished == {("vision", "deferred", "PREEMPTED"): 1,
                        ("vision", "deferred", "COMPLETED"): 1,
                        ("nlp", "training", "OUT_OF_MEMORY"): 1,
                        ("nlp", "interactive", "CANCELLED"): 1}
    hist = {(x["class"], x.get("le")): v for x, v in values(c, "gpupool_queue_wait_seconds_bucket")}
    assert hist[("deferred", "60")] == 2  # 60 s, then 30 s after the requeue
    assert hist[("training", "5")] == 0 and hist[("training", "15")] == 1
    assert ("interactive", "+Inf") not in hist  # never started: no wait to observe
    # The next query starts at the newest end seen, and a new record there still counts.
    assert c.finished.since() == "2026-12-01T01:00:00"
    c.run.answers["sacct"] = ("16|nlp|training|NODE_FAIL|2026-12-01T00:59:00|"  # type: ignore[attr-defined]
                              "2026-12-01T00:59:10|2026-12-01T01:00:00\n")
    finished = {(x["team"], x["class"], x["state"]): v
                for x, v in values(c, "gpupool_jobs_finished_total")}
    assert finished[("nlp", "training", "NODE_FAIL")] == 1
    assert finished[("vision", "deferred", "COMPLETED")] == 1


def test_node_states_drop_power_flags_into_their_own_label() -> None:
    states = {x["node"]: (x["state"], x["power"], x["reason"])
              for x, _ in values(collector(), "gpupool_node_state")}
    assert states["l4-burst-0"] == ("idle", "off", "none")
    assert states["l4-burst-1"][:2] == ("drained", "on")
    assert states["l4-burst-1"][2] == "gpupool-gate: fail system.sshd_hardened | and more"
    assert states["lab-gpu3"][0] == "mixed"


def test_slurm_not_answering_is_up_zero_and_a_log_line_not_a_crash(caplog) -> None:
    slurm = FakeSlurm()
    slurm.down = True
    c = collector(slurm)
    got = samples(c)
    assert ("gpupool_slurm_up", {}, 0.0) in got
    assert not [n for n, _, _ in got if n == "gpupool_job_gpu_allocated"]
    assert ("gpupool_exporter_errors_total", {"command": "squeue"}, 1.0) in got
    assert "Unable to contact slurm controller" in caplog.text
    slurm.down = False
    assert ("gpupool_slurm_up", {}, 1.0) in samples(c)


@pytest.mark.parametrize("broken", ["", "garbage\n|||\n", "1|RUNNING\n", "\x00\xff|x|y\n"])
def test_malformed_output_is_skipped(broken: str) -> None:
    c = collector(FakeSlurm(squeue=broken, sinfo=broken, sacct=broken, scontrol=broken))
    assert ("gpupool_slurm_up", {}, 1.0) in samples(c)


def test_a_malformed_gpu_index_list_is_skipped_and_logged(caplog) -> None:
    bad = ("JobId=11 JobName=x\n     Nodes=lab-gpu1 CPU_IDs=0 Mem=0 GRES=gpu:l4:1(IDX:0-)\n"
           "JobId=15 JobName=y\n     Nodes=lab-gpu3 CPU_IDs=0 Mem=0 GRES=gpu:l4:1(IDX:2)\n")
    got = samples(collector(FakeSlurm(scontrol=bad)))
    assert ("gpupool_slurm_up", {}, 1.0) in got
    assert [x["job_id"] for n, x, _ in got if n == "gpupool_job_gpu_allocated"] == ["15"]
    assert "not a GPU index list: '0-'" in caplog.text


def test_scrapes_closer_than_the_interval_reuse_one_collection() -> None:
    slurm = FakeSlurm()
    c = collector(slurm)
    registry = CollectorRegistry()
    registry.register(c)  # registering collects once
    generate_latest(registry)
    generate_latest(registry)
    assert sum(1 for a in slurm.calls if a[0] == "squeue") == 1


def test_commands_are_read_only_and_bounded() -> None:
    slurm = FakeSlurm()
    samples(collector(slurm))
    assert {a[0] for a in slurm.calls} == {"squeue", "scontrol", "sinfo", "sacct"}
    assert all(a[0] != "scontrol" or a[1] in ("-d", "show") for a in slurm.calls)
    assert ex.COMMAND_TIMEOUT_S <= 30


def test_every_series_the_rules_and_dashboard_read_is_served() -> None:
    root = Path(__file__).resolve().parent.parent / "monitoring"
    text = (root / "rules" / "gpupool.rules.yml").read_text() + "".join(
        p.read_text() for p in (root / "dashboards").glob("*.json"))
    read = {re.sub(r"_(bucket|sum|count)$", "", n)
            for n in re.findall(r"\b(gpupool_[a-z0-9_]+)", text)}
    served = {n for n, _, _ in samples(collector())}
    served |= {re.sub(r"_(bucket|sum|count)$", "", n) for n in served}
    # The compute nodes' checkpoint-age collector (role storage) serves the rest.
    nothing_listed = checkpoint_age.collect(Path("/nonexistent"),
                                            run=lambda argv: checkpoint_age.Listing(""))
    served |= {m.name for m in nothing_listed.collect()}
    # And the compute nodes' health loop (role acceptance_gate) the gpupool_health_* series.
    served |= set(health.SERIES)
    # And the controller's backup timer (role controller_backup) its own.
    served |= set(controller_backup.SERIES)
    # And the controller's idle-GPU reclaim (role idle_reclaim) its gauges.
    served |= set(idle_reclaim.SERIES)
    assert read - served == set()


def test_a_record_without_a_state_is_no_finished_run() -> None:
    """Found by fuzzing the parsers: a blank state failed the whole scrape (IndexError)."""
    finished = ex.Finished()
    finished.add("17|nlp|training| |2026-12-01T00:59:00|2026-12-01T00:59:10|"
                 "2026-12-01T01:00:00\n"
                 "18|nlp|training|COMPLETED|2026-12-01T00:59:00|2026-12-01T00:59:10|"
                 "2026-12-01T01:00:00\n")
    assert dict(finished.counts) == {("nlp", "training", "COMPLETED"): 1}


def test_service_discovery_lists_the_powered_up_cloud_nodes_at_their_address() -> None:
    # Not resumed (the address is still the name), powering down or up, or an address
    # that is none: not a target.
    assert ex.parse_cloud_nodes(CLOUD) == {"l4-burst-0": "10.231.40.7",
                                           "l4-burst-3": "10.231.40.10",
                                           "l4-burst-4": "fd00::7"}
    assert ex.sd_targets(ex.parse_cloud_nodes(CLOUD), 9100) == [
        {"targets": ["10.231.40.7:9100"], "labels": {"node": "l4-burst-0"}},
        {"targets": ["10.231.40.10:9100"], "labels": {"node": "l4-burst-3"}},
        {"targets": ["[fd00::7]:9100"], "labels": {"node": "l4-burst-4"}}]


@pytest.mark.parametrize("query", ["", "port=", "port=0", "port=65536", "port=9a",
                                   "port=9100&port=9400", "port=9100&node=x", "port=%0a",
                                   "port=9100;x", "port=0009100"])
def test_service_discovery_refuses_any_other_question(query: str) -> None:
    assert ex.sd_port(query) is None


def test_the_exporter_serves_metrics_and_service_discovery_over_http() -> None:
    slurm, registry = FakeSlurm(), CollectorRegistry()
    c = collector(slurm)
    registry.register(c)
    server = ex.serve(c, "127.0.0.1", 0, registry)
    base = f"http://127.0.0.1:{server.server_port}"

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(base + path, timeout=10) as r:  # noqa: S310 - loopback
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    try:
        status, body = get(ex.SD_PATH + "?port=9100")
        assert status == 200
        assert [t["labels"]["node"] for t in json.loads(body)] == [
            "l4-burst-0", "l4-burst-3", "l4-burst-4"]
        assert get(ex.SD_PATH + "?port=9100;reboot")[0] == 400
        status, body = get("/metrics")
        assert status == 200 and "gpupool_slurm_up 1.0" in body
        slurm.down = True
        ex.MIN_INTERVAL_S, saved = 0.0, ex.MIN_INTERVAL_S
        try:
            assert get(ex.SD_PATH + "?port=9100")[0] == 503
        finally:
            ex.MIN_INTERVAL_S = saved
    finally:
        server.shutdown()
        server.server_close()


# The two halves (PrivateData=jobs): the privileged one writes the snapshot, the serving one
# answers the job and node commands from it and runs nothing else that PrivateData hides.

def snapshot_of(slurm: FakeSlurm, directory: Path, taken: float = NOW) -> Path:
    directory.mkdir(mode=0o750, exist_ok=True)
    directory.chmod(0o750)
    ex.write_snapshot(str(directory), run=slurm, clock=lambda: taken)
    return directory / ex.SNAPSHOT_NAME


def from_snapshot(path: Path, fallback: FakeSlurm, max_age: float = 60.0) -> ex.SlurmCollector:
    started = datetime(2026, 12, 1, 0, 45).timestamp()
    run = ex.SnapshotRun(str(path), max_age=max_age, clock=lambda: NOW, run=fallback)
    return ex.SlurmCollector(run=run, clock=lambda: NOW, started=started)


def served(collector: ex.SlurmCollector) -> list[tuple[str, dict[str, str], float]]:
    return sorted((s for s in samples(collector) if s[0] != "gpupool_exporter_collect_seconds"),
                  key=repr)


def test_a_snapshot_serves_the_same_series_as_the_commands(tmp_path: Path) -> None:
    privileged, unprivileged = FakeSlurm(), FakeSlurm()
    path = snapshot_of(privileged, tmp_path / "snap")
    c = from_snapshot(path, unprivileged)
    assert served(c) == served(collector())
    # The privileged half ran exactly the snapshot's fixed command lines, read-only ones.
    assert privileged.calls == list(ex.SNAPSHOT.values())
    assert [a[:2] for a in privileged.calls] == [
        ["squeue", "-h"], ["scontrol", "-d"], ["sinfo", "-h"], ["sacct", "-a"]]
    # The serving half ran none of the commands PrivateData=jobs hides, only what it leaves
    # visible to anyone: hostname expansion (and, for service discovery, the cloud nodes).
    assert {a[0] for a in unprivileged.calls} <= {"scontrol"}
    assert all(a[:3] == ["scontrol", "show", "hostnames"] for a in unprivileged.calls)
    assert c.cloud_nodes() == collector().cloud_nodes()
    assert unprivileged.calls[-1] == ex.SINFO_CLOUD


def test_finished_runs_are_counted_once_across_overlapping_snapshot_windows(
        tmp_path: Path) -> None:
    path = snapshot_of(FakeSlurm(), tmp_path / "snap")
    c = from_snapshot(path, FakeSlurm())
    first = values(c, "gpupool_jobs_finished_total")
    snapshot_of(FakeSlurm(), tmp_path / "snap")  # the next window holds the same runs
    assert values(c, "gpupool_jobs_finished_total") == first
    assert sum(v for _, v in first) == 4


def test_a_stale_missing_or_malformed_snapshot_is_up_zero(tmp_path: Path, caplog) -> None:
    path = snapshot_of(FakeSlurm(), tmp_path / "snap", taken=NOW - 61)
    got = samples(from_snapshot(path, FakeSlurm()))
    assert ("gpupool_slurm_up", {}, 0.0) in got
    assert ("gpupool_exporter_errors_total", {"command": "squeue"}, 1.0) in got
    assert "61 s ago" in caplog.text
    assert ("gpupool_slurm_up", {}, 1.0) in samples(from_snapshot(path, FakeSlurm(), 120))
    for text in (b"", b"{}", b'{"taken": 1, "outputs": {"squeue": 1}, "errors": {}}',
                 b'{"taken": "NaN", "outputs": {}, "errors": {}}'):
        path.write_bytes(text)
        assert ("gpupool_slurm_up", {}, 0.0) in samples(from_snapshot(path, FakeSlurm()))
    path.unlink()
    assert ("gpupool_slurm_up", {}, 0.0) in samples(from_snapshot(path, FakeSlurm()))


def test_a_command_failing_in_the_privileged_half_is_up_zero(tmp_path: Path, caplog) -> None:
    down = FakeSlurm()
    down.down = True
    path = snapshot_of(down, tmp_path / "snap")
    assert "Unable to contact slurm controller" in caplog.text  # the privileged half's log
    got = samples(from_snapshot(path, FakeSlurm()))
    assert ("gpupool_slurm_up", {}, 0.0) in got
    assert not [n for n, _, _ in got if n == "gpupool_job_gpu_allocated"]


def test_the_snapshot_is_never_written_or_read_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "passwd"
    victim.write_text("root:x:0:0:root:/root:/bin/bash\n")
    snap = tmp_path / "snap"
    snap.mkdir(mode=0o750)
    snap.chmod(0o750)
    planted = snap / ex.SNAPSHOT_NAME
    planted.symlink_to(victim)
    ex.write_snapshot(str(snap), run=FakeSlurm(), clock=lambda: NOW)
    assert victim.read_text() == "root:x:0:0:root:/root:/bin/bash\n"  # replaced, not followed
    assert not planted.is_symlink() and json.loads(planted.read_text())["taken"] == NOW
    linked = tmp_path / "linked"
    linked.symlink_to(snap)
    with pytest.raises(ex.prom_textfile.Refused):
        ex.write_snapshot(str(linked), run=FakeSlurm(), clock=lambda: NOW)
    snap.chmod(0o770)  # a directory its (non-root) group may write: refused, not written
    before = planted.read_bytes()
    if os.stat(snap).st_gid != 0:
        with pytest.raises(ex.prom_textfile.Refused):
            ex.write_snapshot(str(snap), run=FakeSlurm(), clock=lambda: NOW + 1)
        assert planted.read_bytes() == before
    snap.chmod(0o750)
    # The serving half opens no link either: one planted at the snapshot's name is refused.
    planted.unlink()
    planted.symlink_to(victim)
    assert ("gpupool_slurm_up", {}, 0.0) in samples(from_snapshot(planted, FakeSlurm()))


def test_the_privileged_program_exits_one_and_writes_nothing_where_refused(
        tmp_path: Path) -> None:
    target = tmp_path / "real"
    target.mkdir(mode=0o750)
    link = tmp_path / "link"
    link.symlink_to(target)
    assert ex.main(["--write-snapshot", str(link)]) == 1
    assert list(target.iterdir()) == []
