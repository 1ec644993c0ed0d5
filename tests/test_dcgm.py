"""GPU telemetry (roles/dcgm, issue 16): the exporter's counters cover every DCGM field the
monitoring rules and dashboards read; the Slurm prolog/epilog parts that keep dcgm-exporter's
HPC job map, and the slurm role's run-parts runners, run with bash in a temp directory; the
lab's FIXTURE exporter serves what Prometheus' parser reads, labelled by that map."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpupool.lab import fixture_dcgm_exporter, mirror
from gpupool.spec import catalog, loader
from tests.conftest import ROOT, render_role_template

DCGM = ROOT / "roles" / "dcgm"
DEFAULTS = yaml.safe_load((DCGM / "defaults" / "main.yml").read_text())
BASH = "/bin/bash"


def _fields(text: str) -> set[str]:
    return set(re.findall(r"\bDCGM_FI_[A-Z0-9_]*[A-Z0-9]\b", text))


def _exprs(value: object) -> Iterator[str]:
    """Every `expr` string in a parsed rules file or dashboard."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "expr" and isinstance(v, str):
                yield v
            else:
                yield from _exprs(v)
    elif isinstance(value, list):
        for v in value:
            yield from _exprs(v)


def test_counters_cover_every_field_the_rules_and_dashboards_use() -> None:
    counters = {c[0] for c in DEFAULTS["dcgm_exporter_counters"]}
    docs = [yaml.safe_load((ROOT / "monitoring" / "rules" / "gpupool.rules.yml").read_text())]
    docs += [json.loads(d.read_text())
             for d in sorted((ROOT / "monitoring" / "dashboards").glob("*.json"))]
    used = {f for doc in docs for e in _exprs(doc) for f in _fields(e)}
    assert len(used) >= 4, f"the rules and dashboards read only {used}: the check is broken"
    assert used <= counters, f"not exported by roles/dcgm: {sorted(used - counters)}"


def test_counters_are_well_formed_with_the_issues_fields() -> None:
    types = {}
    for c in DEFAULTS["dcgm_exporter_counters"]:
        assert len(c) == 3 and c[1] in ("gauge", "counter") and "," not in c[2], c
        types[c[0]] = c[1]
    assert len(types) == len(DEFAULTS["dcgm_exporter_counters"]), "a field listed twice"
    # Throttle durations and remapped rows accumulate (counters); a failed remap is a state.
    assert {k: types.get(k) for k in ("DCGM_FI_DEV_THERMAL_VIOLATION",
                                      "DCGM_FI_DEV_POWER_VIOLATION",
                                      "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                                      "DCGM_FI_DEV_ROW_REMAP_FAILURE")} == {
        "DCGM_FI_DEV_THERMAL_VIOLATION": "counter", "DCGM_FI_DEV_POWER_VIOLATION": "counter",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge"}


def test_software_lock_pairs_the_exporter_with_dcgm() -> None:
    for stack, pair in (("lab", ("3.3.9", "3.6.1")), ("example", ("4.2.3", "4.1.3"))):
        sw = loader.load_stack(stack, ROOT).software
        assert (sw.dcgm, sw.dcgm_exporter) == pair


# --- rendering role templates as Ansible does (trim_blocks) --------------------------------

def test_exporter_unit_flags() -> None:
    unit = render_role_template("dcgm", "dcgm-exporter.service.j2", **{
        **{k: v for k, v in DEFAULTS.items() if "{{" not in str(v)},
        "dcgm_exporter_address": "10.0.0.5", "dcgm_config_dir": "/etc/dcgm-exporter",
        "dcgm_service": "nvidia-dcgm"})
    start = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    assert start == ("ExecStart=/usr/bin/dcgm-exporter --remote-hostengine-info localhost:5555"
                     " --collectors /etc/dcgm-exporter/counters.csv"
                     " --address ${DCGM_EXPORTER_HOST}:9400"
                     " --hpc-job-mapping-dir /run/gpupool/dcgm-job-map")
    # The host, systemd-quoted, in a variable a burst node's boot overrides
    # (cloud.launch.user_data).
    assert 'Environment="DCGM_EXPORTER_HOST=10.0.0.5"' in unit.splitlines()
    assert "ConditionPathExists" not in unit
    v6 = render_role_template("dcgm", "dcgm-exporter.service.j2", **{
        **{k: v for k, v in DEFAULTS.items() if "{{" not in str(v)},
        "dcgm_exporter_address": "fd00::5", "dcgm_config_dir": "/etc/dcgm-exporter",
        "dcgm_service": "nvidia-dcgm"})
    assert 'Environment="DCGM_EXPORTER_HOST=[fd00::5]"' in v6.splitlines()


# --- the job map's prolog and epilog parts -------------------------------------------------

@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("parts")
    out = {}
    for phase in ("prolog", "epilog"):
        path = d / phase
        path.write_text(render_role_template("dcgm", f"dcgm-job-map-{phase}.sh.j2",
                                dcgm_exporter_job_map_dir="/nonexistent/job-map"))
        path.chmod(0o755)
        out[phase] = path
    return out


def _run(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return subprocess.run([BASH, str(script)], env={**base, **env}, capture_output=True,
                          text=True, timeout=60, check=False)


def _map(d: Path) -> dict[str, list[str]]:
    return {f.name: f.read_text().split() for f in sorted(d.iterdir())
            if not f.name.startswith(".")}


def test_prolog_records_and_epilog_clears_the_jobs_gpus(parts: dict[str, Path],
                                                        tmp_path: Path) -> None:
    d = tmp_path / "map"
    env = {"GPUPOOL_DCGM_JOB_MAP_DIR": str(d)}
    assert _run(parts["prolog"], {**env, "SLURM_JOB_ID": "41", "SLURM_JOB_GPUS": "0,2"}
                ).returncode == 0
    assert _map(d) == {"0": ["41"], "2": ["41"]}
    # A second job sharing GPU 2; a prolog run twice records a job once.
    for _ in range(2):
        assert _run(parts["prolog"], {**env, "SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "2,3"}
                    ).returncode == 0
    assert _map(d) == {"0": ["41"], "2": ["41", "42"], "3": ["42"]}
    assert _run(parts["epilog"], {**env, "SLURM_JOB_ID": "41"}).returncode == 0
    assert _map(d) == {"2": ["42"], "3": ["42"]}
    # The epilog searches every GPU file (a MIG instance's too), whatever SLURM_JOB_GPUS says.
    (d / "5.1").write_text("42\n")
    assert _run(parts["epilog"], {**env, "SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "2"}
                ).returncode == 0
    assert _map(d) == {}
    # An epilog for a job never recorded, or with no map directory at all, is quiet.
    assert _run(parts["epilog"], {**env, "SLURM_JOB_ID": "7"}).returncode == 0
    assert _run(parts["epilog"], {"GPUPOOL_DCGM_JOB_MAP_DIR": str(tmp_path / "none"),
                                  "SLURM_JOB_ID": "7"}).returncode == 0


@pytest.mark.parametrize(("job", "gpus"), [
    ("41", "0;touch /tmp/x"), ("41", "0,,1"), ("41", "../0"), ("41", "0 1"), ("41", "0-3"),
    ("4 1", "0"), ("../41", "0"), ("", "0"), ("$(id)", "0")])
def test_prolog_refuses_what_is_not_digits_and_commas(parts: dict[str, Path], tmp_path: Path,
                                                      job: str, gpus: str) -> None:
    """Telemetry must not drain the node: the part logs, writes nothing and exits 0."""
    d = tmp_path / "map"
    run = _run(parts["prolog"], {"GPUPOOL_DCGM_JOB_MAP_DIR": str(d), "SLURM_JOB_ID": job,
                                 "SLURM_JOB_GPUS": gpus})
    assert run.returncode == 0 and "nothing recorded" in run.stderr
    assert not d.exists() or _map(d) == {}


def test_a_job_without_gpus_records_nothing(parts: dict[str, Path], tmp_path: Path) -> None:
    d = tmp_path / "map"
    run = _run(parts["prolog"], {"GPUPOOL_DCGM_JOB_MAP_DIR": str(d), "SLURM_JOB_ID": "9"})
    assert run.returncode == 0 and run.stderr == "" and not d.exists()


# --- the slurm role's run-parts runners ---------------------------------------------------

def test_runner_runs_parts_in_order_and_fails_with_the_first_failure(tmp_path: Path) -> None:
    parts_dir = tmp_path / "prolog.d"
    parts_dir.mkdir()
    log = tmp_path / "log"
    runner = tmp_path / "runner"
    runner.write_text(render_role_template("slurm", "gpupool-slurm-run-parts.sh.j2",
                              item={"phase": "prolog", "dir": str(parts_dir)},
                              slurm_prolog_part_timeout_s=2))
    for name, body in (("20-b", "echo b >> {log}"), ("10-a", "echo a >> {log}"),
                       ("30-c.dpkg-old", "echo skipped >> {log}"),
                       ("40-noexec", "echo skipped >> {log}")):
        p = parts_dir / name
        p.write_text("#!/bin/sh\n" + body.format(log=log) + "\n")
        p.chmod(0o644 if name == "40-noexec" else 0o755)
    assert _run(runner, {"SLURM_JOB_ID": "1"}).returncode == 0
    assert log.read_text().split() == ["a", "b"]
    (parts_dir / "25-fails").write_text("#!/bin/sh\nexit 3\n")
    (parts_dir / "25-fails").chmod(0o755)
    log.unlink()
    run = _run(runner, {"SLURM_JOB_ID": "1"})
    assert run.returncode == 3 and "25-fails failed (exit 3)" in run.stderr
    assert log.read_text().split() == ["a", "b"]  # nothing after the failure
    (parts_dir / "25-fails").write_text("#!/bin/sh\nexec sleep 30\n")
    t0 = time.monotonic()
    run = _run(runner, {"SLURM_JOB_ID": "1"})
    assert run.returncode != 0 and time.monotonic() - t0 < 20  # bounded
    assert _run(runner, {}).returncode != 0
    (parts_dir / "25-fails").unlink()
    runner.write_text(render_role_template("slurm", "gpupool-slurm-run-parts.sh.j2",
                              item={"phase": "epilog", "dir": str(tmp_path / "none")},
                              slurm_prolog_part_timeout_s=2))
    assert _run(runner, {}).returncode == 0  # no directory: nothing to run


# --- the lab's FIXTURE exporter -----------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """The fixture package's /usr/bin/dcgm-exporter on a free loopback port, with two
    fixture GPU devices and an empty job map; yields (URL, device dir, map dir)."""
    desc = loader.load_stack("lab", ROOT)
    version, files = mirror._fixture_files(desc)["datacenter-gpu-manager-exporter"]
    assert version == f"{desc.software.dcgm_exporter}-1"
    program = tmp_path / "dcgm-exporter"
    program.write_text(files["usr/bin/dcgm-exporter"])
    assert mirror.FIXTURE_MARK in program.read_text()
    counters = tmp_path / "counters.csv"
    counters.write_text(render_role_template("dcgm", "counters.csv.j2",
                                dcgm_exporter_counters=DEFAULTS["dcgm_exporter_counters"]))
    devices, job_map = tmp_path / "dev", tmp_path / "map"
    devices.mkdir()
    job_map.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (devices / name).touch()
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(program), "--remote-hostengine-info", "localhost:5555",
         "--collectors", str(counters), "--address", f"127.0.0.1:{port}",
         "--hpc-job-mapping-dir", str(job_map), "--unknown-flag", "x"],
        env={**os.environ, "GPUPOOL_FIXTURE_DEV_DIR": str(devices),
             "GPUPOOL_FIXTURE_PROC_DIR": str(tmp_path / "proc")},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "the fixture exporter never answered"
                time.sleep(0.1)
        yield url, devices, job_map
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _scrape(url: str) -> dict[str, tuple[str, str, list[dict[str, str]], list[float]]]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()  # noqa: S310 - loopback
    return {f.name: (f.type, f.documentation, [dict(s.labels) for s in f.samples],
                     [s.value for s in f.samples])
            for f in text_string_to_metric_families(text)}


def test_fixture_exporter_serves_every_counter_per_fixture_gpu(
        exporter: tuple[str, Path, Path]) -> None:
    url, _, _ = exporter
    got = _scrape(url)
    want = {c[0]: c[1] for c in DEFAULTS["dcgm_exporter_counters"]}
    # prometheus_client names a counter family without its _total suffix.
    assert {n: t for n, (t, *_) in got.items()} == {
        n.removesuffix("_total") if t == "counter" else n: t for n, t in want.items()}
    host = socket.gethostname()
    for _, help_, labels, values in got.values():
        assert help_.startswith("FIXTURE")
        assert values == [0.0, 0.0]
        assert labels == [{"gpu": str(i), "UUID": f"FIXTURE-{host}-{i}", "device": f"nvidia{i}",
                           "modelName": "FIXTURE", "Hostname": host, "fixture": "1"}
                          for i in (0, 1)]


def test_fixture_exporter_labels_gpus_with_their_jobs(exporter: tuple[str, Path, Path],
                                                      parts: dict[str, Path]) -> None:
    url, _, job_map = exporter
    env = {"GPUPOOL_DCGM_JOB_MAP_DIR": str(job_map)}
    assert _run(parts["prolog"], {**env, "SLURM_JOB_ID": "77", "SLURM_JOB_GPUS": "1"}
                ).returncode == 0
    _, _, labels, _ = _scrape(url)["DCGM_FI_DEV_GPU_UTIL"]
    assert [(x["gpu"], x.get("hpc_job")) for x in labels] == [("0", None), ("1", "77")]
    # A GPU shared by two jobs: one series per job, as the real exporter does.
    assert _run(parts["prolog"], {**env, "SLURM_JOB_ID": "78", "SLURM_JOB_GPUS": "1"}
                ).returncode == 0
    _, _, labels, _ = _scrape(url)["DCGM_FI_DEV_GPU_UTIL"]
    assert [(x["gpu"], x.get("hpc_job")) for x in labels] == [
        ("0", None), ("1", "77"), ("1", "78")]
    for job in ("77", "78"):
        assert _run(parts["epilog"], {**env, "SLURM_JOB_ID": job}).returncode == 0
    _, _, labels, _ = _scrape(url)["DCGM_FI_DEV_GPU_UTIL"]
    assert [x.get("hpc_job") for x in labels] == [None, None]


def test_exporter_ports_are_the_ones_validation_wants_open() -> None:
    """Validation requires a management flow carrying the exporters' ports
    (management-metrics-flow): they are the roles' and the monitoring role's own."""
    node = yaml.safe_load((ROOT / "roles/node_exporter/defaults/main.yml").read_text())
    mon = yaml.safe_load((ROOT / "roles/monitoring/defaults/main.yml").read_text())
    assert node["node_exporter_port"] == mon["monitoring_node_exporter_port"] \
        == catalog.NODE_EXPORTER_PORT
    assert DEFAULTS["dcgm_exporter_port"] == mon["monitoring_dcgm_exporter_port"] \
        == catalog.DCGM_EXPORTER_PORT


# --- the health check's series: root writes through no planted link ---------------------

def _health(tmp_path: Path, textfiles: Path) -> subprocess.CompletedProcess[str]:
    """The rendered check, run with /bin/sh (its shebang) and a stand-in dcgmi that passes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "dcgmi").write_text("#!/bin/sh\necho '{\"body\": {}}'\nexit 0\n")
    (bin_dir / "dcgmi").chmod(0o755)
    script = tmp_path / "gpupool-dcgm-health"
    script.write_text(render_role_template(
        "dcgm", "gpupool-dcgm-health.sh.j2", dcgm_health_result=str(tmp_path / "health.json"),
        dcgm_health_textfile_dir=str(textfiles)))
    return subprocess.run(["/bin/sh", str(script)], capture_output=True, text=True, timeout=60,
                          check=False, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})


def test_health_series_never_go_through_a_planted_link(tmp_path: Path) -> None:
    textfiles = tmp_path / "node-exporter"
    textfiles.mkdir(mode=0o755)
    victim = tmp_path / "passwd"
    victim.write_text("root:x:0:0::/root:/bin/sh\n")
    final = textfiles / "gpupool_dcgm_health.prom"
    final.symlink_to(victim)
    (textfiles / "gpupool_dcgm_health.prom.tmp").symlink_to(victim)  # the name it once used
    done = _health(tmp_path, textfiles)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "root:x:0:0::/root:/bin/sh\n"
    assert not final.is_symlink() and "gpupool_dcgm_health_pass 1" in final.read_text()
    assert json.loads((tmp_path / "health.json").read_text())["status"] == "pass"
    assert stat.S_IMODE(final.stat().st_mode) == 0o644
    assert sorted(p.name for p in textfiles.iterdir()) == [
        "gpupool_dcgm_health.prom", "gpupool_dcgm_health.prom.tmp"]  # no temporary left


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o757])
def test_health_series_refused_in_a_directory_others_may_write(tmp_path: Path, mode: int
                                                                ) -> None:
    textfiles = tmp_path / "node-exporter"
    textfiles.mkdir()
    textfiles.chmod(mode)
    done = _health(tmp_path, textfiles)
    assert done.returncode == 0 and "series not written" in done.stderr
    assert list(textfiles.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_health_series_refused_where_a_group_but_roots_may_write(tmp_path: Path) -> None:
    textfiles = tmp_path / "node-exporter"
    textfiles.mkdir()
    textfiles.chmod(0o775)
    os.chown(textfiles, 0, 65534)  # root:prometheus 0775, as role node_exporter once made it
    done = _health(tmp_path, textfiles)
    assert "series not written" in done.stderr and list(textfiles.iterdir()) == []
    os.chown(textfiles, 65534, 0)
    textfiles.chmod(0o755)
    assert "series not written" in _health(tmp_path, textfiles).stderr
    os.chown(textfiles, 0, 0)
    textfiles.chmod(0o775)  # root's own group may write
    assert _health(tmp_path, textfiles).stderr == ""
    assert (textfiles / "gpupool_dcgm_health.prom").is_file()


def test_health_series_refused_in_a_linked_directory(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    link = tmp_path / "node-exporter"
    link.symlink_to(real)
    done = _health(tmp_path, link)
    assert "symbolic link" in done.stderr and list(real.iterdir()) == []


# --- what the FIXTURE exporter reports: the CPU activity of a GPU's job -------------------

def _proc(root: Path, pid: int, ppid: int, ticks: int, comm: str = "bash",
          title: str = "") -> None:
    """A process in a fake /proc: its stat (utime ticks, the rest 0) and its cmdline."""
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    fields = ["S", str(ppid), *["0"] * 9, str(ticks), "0", "0", "0", *["0"] * 5]
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    (d / "cmdline").write_text((title or comm).replace(" ", "\0") + "\0")


def test_a_jobs_cpu_ticks_are_those_of_the_processes_below_its_slurmstepd(
        tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _proc(proc, 1, 0, 5000, "systemd")
    _proc(proc, 10, 1, 700, "slurmstepd", "slurmstepd: [77.batch]")  # not the job's work
    _proc(proc, 11, 10, 30)  # the batch script
    _proc(proc, 12, 11, 200, "python3")  # what it runs
    _proc(proc, 20, 1, 9, "slurmstepd", "slurmstepd: [78.extern]")
    _proc(proc, 21, 20, 4, "sleep")
    _proc(proc, 30, 1, 900, "slurmd")
    (proc / "40").mkdir()  # a process gone between listing and reading: no stat
    (proc / "self").mkdir()
    assert fixture_dcgm_exporter.job_cpu_ticks(str(proc), {"77", "78", "79"}) == {
        "77": 230, "78": 4}
    assert fixture_dcgm_exporter.job_cpu_ticks(str(proc), {"78"}) == {"78": 4}
    assert fixture_dcgm_exporter.job_cpu_ticks(str(proc), set()) == {}
    assert fixture_dcgm_exporter.job_cpu_ticks(str(tmp_path / "none"), {"77"}) == {}


def test_activity_is_cpu_percent_between_scrapes_per_gpu_clamped(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    hz = fixture_dcgm_exporter.CLOCK_TICKS
    _proc(proc, 10, 1, 0, "slurmstepd", "slurmstepd: [77.batch]")
    _proc(proc, 11, 10, 0)
    _proc(proc, 20, 1, 0, "slurmstepd", "slurmstepd: [78.batch]")
    _proc(proc, 21, 20, 0, "sleep")
    now = [100.0]
    activity = fixture_dcgm_exporter.Activity(str(proc), clock=lambda: now[0])
    # First sight: no previous scrape, 0.
    assert activity.update({"77": 2, "78": 1}) == {"77": 0.0, "78": 0.0}
    now[0] += 10
    _proc(proc, 11, 10, 10 * hz)  # one CPU busy for the 10 s, over 2 GPUs: 50 % each
    assert activity.update({"77": 2, "78": 1}) == {"77": 50.0, "78": 0.0}
    # Sooner than MIN_INTERVAL_S: the same values, /proc not read again.
    _proc(proc, 11, 10, 1000 * hz)
    assert activity.update({"77": 2, "78": 1}) == {"77": 50.0, "78": 0.0}
    now[0] += 10
    # Four CPUs' worth on 2 GPUs is 200 %: clamped to 100. Its process then vanishes:
    # the job's ticks fall, which is no negative activity.
    assert activity.update({"77": 2, "78": 1})["77"] == 100.0
    for name in ("stat", "cmdline"):
        (proc / "11" / name).unlink()
    now[0] += 10
    assert activity.update({"77": 2, "78": 1})["77"] == 0.0
    # An ended job is forgotten: back, it starts afresh.
    assert activity.update({"78": 1}) == {"78": 0.0}
    assert "77" not in activity.last


def test_utilisation_like_counters_follow_the_activity_the_rest_stay_0() -> None:
    value = fixture_dcgm_exporter.value
    assert value("DCGM_FI_DEV_GPU_UTIL", 40.0) == 40.0
    assert value("DCGM_FI_DEV_MEM_COPY_UTIL", 40.0) == 40.0
    assert value("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 40.0) == 0.4
    assert value("DCGM_FI_PROF_DRAM_ACTIVE", 40.0) == 0.4
    for field in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS"):
        assert value(field, 40.0) == 0.0


def test_fixture_exporter_reports_a_busy_jobs_gpu_as_used(exporter: tuple[str, Path, Path],
                                                          tmp_path: Path) -> None:
    """Through HTTP, as Prometheus reads it: the job's GPU follows its processes' CPU
    time, the other GPU stays 0, the help text says FIXTURE."""
    url, _, job_map = exporter
    proc = tmp_path / "proc"  # the exporter fixture's GPUPOOL_FIXTURE_PROC_DIR
    (job_map / "1").write_text("77\n")
    _proc(proc, 10, 1, 0, "slurmstepd", "slurmstepd: [77.batch]")
    _proc(proc, 11, 10, 0)
    _, help_, labels, values = _scrape(url)["DCGM_FI_DEV_GPU_UTIL"]  # first sight: 0
    assert values == [0.0, 0.0]
    assert help_.startswith("FIXTURE, not GPU data")
    # Far more CPU time than the wall time between the scrapes can hold: clamped to 100
    # however long they are apart (a scrape sooner than MIN_INTERVAL_S would reuse 0).
    _proc(proc, 11, 10, 10**9)
    time.sleep(fixture_dcgm_exporter.MIN_INTERVAL_S + 0.2)
    got = _scrape(url)
    _, _, labels, values = got["DCGM_FI_DEV_GPU_UTIL"]
    assert [(x["gpu"], x.get("hpc_job"), v) for x, v in zip(labels, values, strict=True)] == [
        ("0", None, 0.0), ("1", "77", 100.0)]
    assert got["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"][3] == [0.0, 1.0]
    assert got["DCGM_FI_DEV_FB_USED"][3] == [0.0, 0.0]


@pytest.mark.skipif(not shutil.which("dpkg-deb"), reason="dpkg-deb is not installed")
def test_a_fixture_package_is_rebuilt_when_its_program_changes(tmp_path: Path) -> None:
    """The lab's fixture packages are cached by name and version: an edited fixture
    program (this exporter) must still reach the next lab, not the cached build."""
    first = mirror._deb(tmp_path, "fx", "1-1", {"usr/bin/fx": "#!/bin/sh\necho 1\n"}, "F")
    built = first.read_bytes()
    again = mirror._deb(tmp_path, "fx", "1-1", {"usr/bin/fx": "#!/bin/sh\necho 1\n"}, "F")
    assert again == first and again.read_bytes() == built  # unchanged: kept
    changed = mirror._deb(tmp_path, "fx", "1-1", {"usr/bin/fx": "#!/bin/sh\necho 2\n"}, "F")
    assert changed == first and changed.read_bytes() != built
