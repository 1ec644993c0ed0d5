"""Slurm's OCI containers (role slurm_containers): oci.conf as the role renders it, the
prolog part that makes crun's state directory, the switch that leaves Slurm 22.05 out, and
the runtime program's rewrite of a step's config.json (gpupool/onhost/oci_runtime.py). The
real srun --container, crun and umoci run in tests/integration/test_debian13_lab.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.onhost import oci_runtime as rt
from tests.conftest import render_role_template
from tests.test_pool_defaults import resolve

ROOT = Path(__file__).resolve().parents[1]
ROLE = ROOT / "roles" / "slurm_containers"


def _plain(path: Path) -> dict[str, Any]:
    return {k: v for k, v in (yaml.safe_load(path.read_text()) or {}).items()
            if "{{" not in str(v)}


VARIABLES = {**_plain(ROLE / "defaults" / "main.yml"), **_plain(ROLE / "vars" / "Debian.yml")}


def _conf(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            assert value.startswith('"') and value.endswith('"'), line
            out[key] = value[1:-1]
    return out


def test_oci_conf_names_the_runtime_program_for_every_operation() -> None:
    conf = _conf(render_role_template("slurm_containers", "oci.conf.j2", **VARIABLES))
    # Slurm accepts RunTimeRun with Query, Kill and Delete, and neither Create nor Start.
    assert sorted(conf) == ["EnvExclude", "RunTimeDelete", "RunTimeEnvExclude", "RunTimeKill",
                            "RunTimeQuery", "RunTimeRun"]
    runtime = ("/usr/local/libexec/gpupool-oci-runtime --crun /usr/bin/crun "
               "--root-base /run/gpupool-oci --uid %U")
    name = "%n.%u.%j.%s.%t"
    assert conf["RunTimeRun"] == f"{runtime} run %b {name}"
    assert conf["RunTimeQuery"] == f"{runtime} state {name}"
    assert conf["RunTimeKill"] == f"{runtime} kill {name}"
    assert conf["RunTimeDelete"] == f"{runtime} delete {name}"
    assert conf["EnvExclude"] == "^(SLURM_CONF|SLURM_CONF_SERVER)="
    assert "NOTIFY_SOCKET" in conf["RunTimeEnvExclude"]


@pytest.mark.parametrize(("slurm", "enabled"), [
    ("22.05.8", False), ("23.02.0", True), ("24.11.5", True)])
def test_the_role_is_on_from_slurm_23_02(slurm: str, enabled: bool) -> None:
    got = resolve("slurm_containers", "slurm_containers_enabled",
                  gpupool_software={"slurm": slurm})
    assert got is enabled or got == str(enabled)


def test_the_prolog_part_makes_the_users_state_directory(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("install -o needs root")
    base = tmp_path / "oci"
    part = tmp_path / "part.sh"
    part.write_text(render_role_template("slurm_containers", "gpupool-oci-root-prolog.sh.j2",
                                         slurm_containers_runtime_root=str(base)))
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_UID": "20001", "SLURM_JOB_GID": "20002"}
    subprocess.run(["sh", str(part)], env=env, check=True)
    info = (base / "20001").stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (20001, 20002, 0o700)
    assert base.stat().st_uid == 0 and base.stat().st_mode & 0o777 == 0o755
    # Not a uid: nothing is made, and the job is not failed for it.
    proc = subprocess.run(["sh", str(part)], env={**env, "SLURM_JOB_UID": "../x"},
                          capture_output=True, text=True, check=True)
    assert "is no uid" in proc.stderr and sorted(p.name for p in base.iterdir()) == ["20001"]


# --- the runtime program -------------------------------------------------------------------

# A bundle's configuration as `umoci unpack --rootless` writes it (trimmed).
BUNDLE: dict[str, Any] = {
    "ociVersion": "1.0.2", "hostname": "umoci-default",
    "root": {"path": "rootfs"},
    "process": {"user": {"uid": 0, "gid": 0}, "args": ["sh"], "cwd": "/",
                "env": ["PATH=/usr/bin", "SLURM_STEP_GPUS=2", "CUDA_VISIBLE_DEVICES=0"]},
    "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs"},
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup"},
        {"destination": "/dev/nvidia3", "type": "bind", "source": "/dev/nvidia3"},
        {"destination": "/etc/resolv.conf", "type": "bind", "source": "/etc/resolv.conf"}],
    "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "user",
                                                   "network")],
              "uidMappings": [{"containerID": 0, "hostID": 0, "size": 1}],
              "devices": [{"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1}],
              "resources": {"devices": [{"allow": False, "access": "rwm"}]},
              "cgroupsPath": "/x"}}


def test_adapt_runs_the_job_as_itself_with_only_its_gpus() -> None:
    out = rt.adapt(BUNDLE, 20001, 20002, ["/dev/nvidia2", "/dev/nvidiactl"])
    assert out["process"]["user"] == {"uid": 20001, "gid": 20002}
    assert out["linux"]["uidMappings"] == [{"containerID": 20001, "hostID": 20001, "size": 1}]
    assert out["linux"]["gidMappings"] == [{"containerID": 20002, "hostID": 20002, "size": 1}]
    assert sorted(n["type"] for n in out["linux"]["namespaces"]) == ["ipc", "mount", "user"]
    assert "hostname" not in out and "cgroupsPath" not in out["linux"]
    assert "resources" not in out["linux"]
    mounts = {m["destination"]: m for m in out["mounts"]}
    assert mounts["/proc"]["type"] == mounts["/sys"]["type"] == "bind"
    assert "ro" in mounts["/sys"]["options"] and "/sys/fs/cgroup" not in mounts
    # The bundle's own GPU device is dropped; the step's are bound.
    assert [d for d in mounts if d.startswith("/dev/nvidia")] == ["/dev/nvidia2", "/dev/nvidiactl"]
    assert out["linux"]["devices"] == []
    assert "/etc/resolv.conf" in mounts and mounts["/dev"]["type"] == "tmpfs"
    assert BUNDLE["process"]["user"] == {"uid": 0, "gid": 0}  # pure: the input is unchanged


def test_adapt_adds_the_user_and_mount_namespaces() -> None:
    out = rt.adapt({"process": {}, "linux": {"namespaces": [{"type": "pid"}]}}, 5, 5, [])
    assert sorted(n["type"] for n in out["linux"]["namespaces"]) == ["mount", "user"]


@pytest.mark.parametrize(("env", "gpus"), [
    ({"SLURM_STEP_GPUS": "2"}, [2]), ({"SLURM_STEP_GPUS": "3,1,3"}, [1, 3]),
    ({"SLURM_JOB_GPUS": "0"}, [0]), ({"SLURM_STEP_GPUS": "1", "SLURM_JOB_GPUS": "0,1"}, [1]),
    ({}, [])])
def test_step_gpus(env: dict[str, str], gpus: list[int]) -> None:
    assert rt.step_gpus(env) == gpus


@pytest.mark.parametrize("value", ["0,", "a", "1;reboot", "../0", "0 1"])
def test_step_gpus_refuses_what_is_no_list_of_indexes(value: str) -> None:
    with pytest.raises(rt.Refused):
        rt.step_gpus({"SLURM_STEP_GPUS": value})


def test_devices_are_the_held_gpus_and_the_control_devices_present() -> None:
    present = {"nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"}
    assert rt.devices([1], present) == ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    assert rt.devices([7], {"nvidia0"}) == []


def _state_dir(base: Path, uid: int, mode: int = 0o700) -> None:
    (base / str(uid)).mkdir(parents=True)
    os.chown(base / str(uid), uid, uid)
    (base / str(uid)).chmod(mode)


def test_run_rewrites_the_steps_config_and_execs_crun(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.getuid() != 0:
        pytest.skip("chown needs root")
    uid = 20001
    _state_dir(tmp_path / "oci", uid)
    monkeypatch.setattr(rt.os, "getuid", lambda: uid)
    bundle = tmp_path / "spool"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(BUNDLE))
    monkeypatch.setattr(rt, "_present", lambda: {"nvidia2", "nvidia3", "nvidiactl"})
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    calls: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr(rt.os, "execve", lambda p, a, e: calls.append((p, a, e)))
    rt.main(["--crun", "/usr/bin/crun", "--root-base", str(tmp_path / "oci"), "--uid", str(uid),
             "run", str(bundle), "n1.alice.5.0.0"])
    (path, argv, env), = calls
    assert path == "/usr/bin/crun" and argv == [
        "/usr/bin/crun", "--rootless=true", f"--root={tmp_path / 'oci' / str(uid)}",
        "--cgroup-manager=disabled", "run", "--bundle", str(bundle), "n1.alice.5.0.0"]
    assert "NOTIFY_SOCKET" not in env
    config = json.loads((bundle / "config.json").read_text())
    assert config["process"]["user"]["uid"] == uid
    assert [m["source"] for m in config["mounts"] if m["destination"].startswith("/dev/nv")] \
        == ["/dev/nvidia2", "/dev/nvidiactl"]


@pytest.mark.parametrize(("caller", "operation", "mode", "error"), [
    (0, "run", 0o700, "never as root"),
    (30000, "state", 0o700, "may not act"),
    (20001, "run", 0o755, "closed to others"),
])
def test_main_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str],
                      caller: int, operation: str, mode: int, error: str) -> None:
    if os.getuid() != 0:
        pytest.skip("chown needs root")
    _state_dir(tmp_path, 20001, mode)
    monkeypatch.setattr(rt.os, "getuid", lambda: caller)
    monkeypatch.setattr(rt.os, "execve", lambda *a: pytest.fail("crun ran"))
    args = [str(tmp_path / "b"), "x"] if operation == "run" else ["x"]
    assert rt.main(["--root-base", str(tmp_path), "--uid", "20001", operation, *args]) == 1
    assert error in capsys.readouterr().err


def test_root_may_query_kill_and_delete_a_users_container(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.getuid() != 0:
        pytest.skip("chown needs root")
    _state_dir(tmp_path, 20001)
    calls: list[list[str]] = []
    monkeypatch.setattr(rt.os, "execve", lambda p, a, e: calls.append(a))
    for operation in ("state", "kill", "delete"):
        rt.main(["--root-base", str(tmp_path), "--uid", "20001", operation, "n.u.1.0.-1"])
    root = f"--root={tmp_path / '20001'}"
    assert [c[1:] for c in calls] == [
        ["--rootless=true", root, "state", "n.u.1.0.-1"],
        ["--rootless=true", root, "kill", "-a", "n.u.1.0.-1"],
        ["--rootless=true", root, "delete", "--force", "n.u.1.0.-1"]]
