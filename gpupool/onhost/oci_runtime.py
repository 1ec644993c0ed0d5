#!/usr/bin/python3
"""The OCI runtime Slurm's oci.conf names on a compute node (role slurm_containers): crun,
run rootless as the job's user, with the container's configuration adapted to a job.

`srun --container=BUNDLE` makes slurmstepd write the bundle's config.json, with the step's
command and environment, into the step's spool directory and call RunTimeRun with that
directory (%b) as the job's user. This program then rewrites that config.json and execs
crun on it:

* the job runs as itself: its uid and gid inside are its own (one-to-one mappings), not
  root, so what it writes to shared storage is its own;
* the host's PID, network and UTS namespaces are kept (Slurm's containers use the host's
  network; MPI and the GPU stack see the host), /proc and /sys are the host's bound
  read-only where a new mount would need namespaces of its own; the container has its own
  mount and user namespaces only, as enroot's do;
* of the host's numbered GPU devices (/dev/nvidiaN) only the step's own (SLURM_STEP_GPUS,
  else SLURM_JOB_GPUS: the indexes of gres.conf's files) are bound into the container,
  beside NVIDIA's control devices; a numbered device the bundle names itself is dropped.
  Which devices a job may open is still the cgroup's to enforce (cgroup.conf's
  ConstrainDevices) where the node constrains them.

crun's state lives in ROOT_BASE/<uid>, which the role's prolog part creates for the job's
user (root owns ROOT_BASE). Standard library only: it runs under the node's python3.

  gpupool-oci-runtime [--crun PATH] [--root-base DIR] --uid UID run BUNDLE NAME
  gpupool-oci-runtime [--crun PATH] [--root-base DIR] --uid UID state|kill|delete NAME
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CRUN = "/usr/bin/crun"
ROOT_BASE = "/run/gpupool-oci"
DEV = "/dev"
# Namespaces the container shares with the host (dropped from config.json).
HOST_NAMESPACES = frozenset({"pid", "network", "uts", "cgroup"})
# NVIDIA's unnumbered devices a CUDA program opens beside its GPU's.
CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
GPU_DEVICE_RE = re.compile(r"^/dev/nvidia[0-9]+$")
GPU_LIST_RE = re.compile(r"^[0-9]+(,[0-9]+)*$")
RO_BIND = ["rbind", "nosuid", "noexec", "nodev", "ro"]


class Refused(Exception):
    """A step this program refuses to start (said on stderr, exit 1)."""


def step_gpus(environ: Mapping[str, str]) -> list[int]:
    """The GPU indexes the step holds on this node: SLURM_STEP_GPUS, else SLURM_JOB_GPUS;
    none when neither is set. A value that is not a list of indexes is refused."""
    value = environ.get("SLURM_STEP_GPUS") or environ.get("SLURM_JOB_GPUS") or ""
    if not value:
        return []
    if not GPU_LIST_RE.match(value):
        raise Refused(f"SLURM_STEP_GPUS/SLURM_JOB_GPUS {value!r} is not a list of GPU indexes")
    return sorted({int(i) for i in value.split(",")})


def devices(gpus: Sequence[int], present: set[str]) -> list[str]:
    """Device files to bind: each held GPU's /dev/nvidiaN, then the control devices, each
    only where the host has it (`present`: names under /dev)."""
    wanted = [f"nvidia{i}" for i in gpus] + list(CONTROL_DEVICES)
    return [f"{DEV}/{name}" for name in wanted if name in present]


def _is_sys_or_proc(destination: str) -> bool:
    path = "/" + destination.strip("/")
    return any(path == top or path.startswith(top + "/") for top in ("/proc", "/sys"))


def adapt(config: dict[str, Any], uid: int, gid: int, bind: Sequence[str]) -> dict[str, Any]:
    """The bundle's configuration as the job runs it (see the module's docstring); pure."""
    out = json.loads(json.dumps(config))
    linux = out.setdefault("linux", {})
    linux["namespaces"] = [ns for ns in linux.get("namespaces", [])
                           if ns.get("type") not in HOST_NAMESPACES]
    if not any(ns.get("type") == "user" for ns in linux["namespaces"]):
        linux["namespaces"].append({"type": "user"})
    if not any(ns.get("type") == "mount" for ns in linux["namespaces"]):
        linux["namespaces"].append({"type": "mount"})
    linux["uidMappings"] = [{"containerID": uid, "hostID": uid, "size": 1}]
    linux["gidMappings"] = [{"containerID": gid, "hostID": gid, "size": 1}]
    linux.pop("cgroupsPath", None)
    linux.pop("resources", None)
    out.pop("hostname", None)
    out.pop("domainname", None)
    process = out.setdefault("process", {})
    process["user"] = {"uid": uid, "gid": gid}
    mounts = [m for m in out.get("mounts", [])
              if not _is_sys_or_proc(m.get("destination", ""))
              and not GPU_DEVICE_RE.match("/" + m.get("destination", "").strip("/"))]
    mounts[:0] = [{"destination": "/proc", "type": "bind", "source": "/proc",
                   "options": ["rbind", "nosuid", "noexec", "nodev"]},
                  {"destination": "/sys", "type": "bind", "source": "/sys",
                   "options": list(RO_BIND)}]
    mounts += [{"destination": path, "type": "bind", "source": path,
                "options": ["bind", "nosuid", "noexec"]} for path in bind]
    out["mounts"] = mounts
    linux["devices"] = [d for d in linux.get("devices", [])
                        if not GPU_DEVICE_RE.match(d.get("path", ""))]
    return out


def _present() -> set[str]:
    found = set()
    for name in os.listdir(DEV):
        if name.startswith("nvidia"):
            try:
                if stat.S_ISCHR(os.stat(f"{DEV}/{name}").st_mode):
                    found.add(name)
            except OSError:
                continue
    return found


def _root(base: str, uid: int) -> str:
    root = Path(base) / str(uid)
    try:
        info = root.lstat()
    except FileNotFoundError:
        raise Refused(f"{root} is missing: the slurm_containers prolog part makes it") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or info.st_mode & 0o077:
        raise Refused(f"{root} is not a directory of uid {uid} closed to others")
    return str(root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpupool-oci-runtime", description=__doc__.split("\n")[0])
    parser.add_argument("--crun", default=CRUN)
    parser.add_argument("--root-base", default=ROOT_BASE)
    # The job's user (oci.conf's %U): slurmstepd runs run as that user, and may run the
    # other operations as root, on that user's containers.
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("operation", choices=["run", "state", "kill", "delete"])
    parser.add_argument("args", nargs="+")
    opts = parser.parse_args(argv)
    uid, gid = opts.uid, os.getgid()
    try:
        if os.getuid() not in (0, uid) or uid == 0:
            raise Refused(f"uid {os.getuid()} may not act on uid {uid}'s containers")
        if opts.operation == "run" and os.getuid() != uid:
            raise Refused("a container runs as the job's user, never as root")
        root = _root(opts.root_base, uid)
        crun = [opts.crun, "--rootless=true", f"--root={root}"]
        if opts.operation == "run":
            if len(opts.args) != 2:
                raise Refused("run takes BUNDLE NAME")
            bundle, name = opts.args
            path = Path(bundle) / "config.json"
            config = json.loads(path.read_text())
            step_env = dict(e.split("=", 1) for e in config.get("process", {}).get("env", [])
                            if "=" in e)
            adapted = adapt(config, uid, gid, devices(step_gpus(step_env), _present()))
            tmp = path.with_name("config.json.gpupool")
            tmp.write_text(json.dumps(adapted))
            tmp.replace(path)
            command = [*crun, "--cgroup-manager=disabled", "run", "--bundle", bundle, name]
        else:
            if len(opts.args) != 1:
                raise Refused(f"{opts.operation} takes NAME")
            extra = {"kill": ["kill", "-a"], "delete": ["delete", "--force"], "state": ["state"]}
            command = [*crun, *extra[opts.operation], *opts.args]
    except (Refused, OSError, ValueError) as exc:
        print(f"gpupool-oci-runtime: {exc}", file=sys.stderr)
        return 1
    # systemd's notify socket (slurmd's, inherited) would be bound into the container.
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    os.execve(command[0], command, env)  # noqa: S606 - crun, by its absolute path
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
