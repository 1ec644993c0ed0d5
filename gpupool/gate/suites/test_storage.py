"""Storage checks: the declared mounts are there with their options, writable where they
must be, and move data at all (a small throughput smoke test)."""

from __future__ import annotations

import json

import pytest

from gpupool.gate.actions import Action
from gpupool.gate.expect import MountExpect, NodeExpect
from gpupool.gate.plugin import Measure, node_expectation

SMOKE_MIB = 64
# What findmnt reports for each declared file system type.
KERNEL_FSTYPE = {"nfs": {"nfs", "nfs4"}, "lustre": {"lustre"}}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "mount" in metafunc.fixturenames:
        mounts = node_expectation(metafunc.config).mounts
        metafunc.parametrize("mount", mounts, ids=[m.tier for m in mounts])


def _require_present(host, mount: MountExpect) -> None:  # type: ignore[no-untyped-def]
    """Checks on a mount's contents mean nothing where the mount is missing (and would
    write to the root file system): they skip, and storage.mount_present fails."""
    present = (host.file(mount.path).is_directory if mount.fstype == "local"
               else host.run(f"findmnt --mountpoint {mount.path}").rc == 0)
    if not present:
        pytest.skip(f"{mount.path} is missing (see storage.mount_present)")


@pytest.mark.action(Action.RECONFIGURE)
def test_mount_present(host, mount: MountExpect, expect: NodeExpect,  # type: ignore[no-untyped-def]
                       measure: Measure) -> None:
    if mount.fstype == "local":
        ok = host.file(mount.path).is_directory
        measure("directory" if ok else "missing", "directory", ok, f"{mount.path} missing")
        return
    out = host.run(f"findmnt -J --mountpoint {mount.path}")
    fs = json.loads(out.stdout)["filesystems"][0] if out.rc == 0 else None
    if fs is None:
        measure(None, {"fstype": mount.fstype, "options": list(mount.options)}, False,
                f"{mount.path} is not mounted")
    options = set(fs["options"].split(","))
    if expect.lab:
        # The lab shares one host directory between its hosts in place of the network file
        # system: it must be mounted, read-only where declared; NFS options do not apply.
        mode = "ro" if "ro" in mount.options else "rw"
        measure({"mounted": True, "mode": mode if mode in options else sorted(options)},
                {"mounted": True, "mode": mode}, mode in options)
        return
    missing = [o for o in mount.options if o not in options]
    ok = fs["fstype"] in KERNEL_FSTYPE.get(mount.fstype, {mount.fstype}) and not missing
    measure({"fstype": fs["fstype"], "missing_options": missing},
            {"fstype": mount.fstype, "missing_options": []}, ok)


@pytest.mark.action(Action.RECONFIGURE)
def test_mount_writable(host, mount: MountExpect, measure: Measure) -> None:  # type: ignore[no-untyped-def]
    _require_present(host, mount)
    probe = f"{mount.path}/.gpupool-gate-probe"
    writable = host.run(f"touch {probe} && rm -f {probe}").rc == 0
    measure(writable, mount.writable, writable == mount.writable,
            f"{mount.path} is {'' if writable else 'not '}writable")


@pytest.mark.tier("standard")
@pytest.mark.action(Action.MONITOR)
def test_mount_throughput(host, mount: MountExpect, measure: Measure) -> None:  # type: ignore[no-untyped-def]
    if not mount.writable:
        pytest.skip("read-only mount")
    _require_present(host, mount)
    probe = f"{mount.path}/.gpupool-gate-dd"
    out = host.run(f"dd if=/dev/zero of={probe} bs=1M count={SMOKE_MIB} conv=fsync 2>&1; "
                   f"rm -f {probe}")
    line = next((ln for ln in out.stdout.splitlines() if "copied" in ln), "")
    measure(line.rsplit(",", 1)[-1].strip() if line else out.stdout[-200:],
            f"{SMOKE_MIB} MiB written", out.rc == 0 and bool(line))
