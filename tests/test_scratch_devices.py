"""gpupool/onhost/scratch_devices.py: the storage role's scratch devices are the ones the
description names (by model or by stable path), and nothing is built on a disk that holds
anything. The trees are FIXTURES in lsblk's JSON form (util-linux 2.38, Debian 12: the
shape `lsblk --json --paths --output NAME,TYPE,MODEL,FSTYPE,LABEL` prints, checked against
this machine's own lsblk below): the lab's hosts have no NVMe devices."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest

from gpupool.onhost import scratch_devices as sd

MODEL = "SAMSUNG MZQL23T8HCLS-00A07"
BOOT = "SAMSUNG MZVL2512HCJQ-00B00"


def disk(name: str, model: str = MODEL, fstype: str | None = None, label: str | None = None,
         children: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"name": f"/dev/{name}", "type": "disk", "model": model,
                         "fstype": fstype, "label": label}
    if children:
        d["children"] = children
    return d


def tree(*disks: dict[str, Any]) -> dict[str, Any]:
    boot = disk("nvme0n1", BOOT, children=[
        {"name": "/dev/nvme0n1p1", "type": "part", "model": None, "fstype": "vfat",
         "label": None},
        {"name": "/dev/nvme0n1p2", "type": "part", "model": None, "fstype": "ext4",
         "label": None}])
    return {"blockdevices": [boot, *disks]}


def member(name: str, array: str = "gpu7:scratch") -> dict[str, Any]:
    return disk(name, fstype=sd.RAID_MEMBER, label=array, children=[
        {"name": "/dev/md127", "type": "raid0", "model": None, "fstype": "xfs",
         "label": None}])


def test_by_model_takes_every_disk_of_it_and_leaves_the_boot_disk() -> None:
    got = sd.find(tree(disk("nvme10n1"), disk("nvme2n1")), 2, "xfs", model=MODEL)
    assert got == {"devices": ["/dev/nvme2n1", "/dev/nvme10n1"], "state": "blank"}


def test_by_path_in_the_declared_order() -> None:
    links = {"/dev/disk/by-path/pci-0000:c2:00.0-nvme-1": "/dev/nvme1n1",
             "/dev/disk/by-path/pci-0000:c1:00.0-nvme-1": "/dev/nvme2n1"}
    got = sd.find(tree(disk("nvme1n1"), disk("nvme2n1")), 2, "xfs", paths=list(links),
                  resolve=links.__getitem__)
    assert got == {"devices": ["/dev/nvme1n1", "/dev/nvme2n1"], "state": "blank"}


def test_the_array_built_before_is_found_again() -> None:
    got = sd.find(tree(member("nvme1n1"), member("nvme2n1")), 2, "xfs", model=MODEL)
    assert got["state"] == "array"
    assert sd.find(tree(member("nvme1n1", "scratch"), member("nvme2n1", "scratch")), 2,
                   "xfs", model=MODEL)["state"] == "array"


def test_one_device_formatted_before_is_found_again() -> None:
    got = sd.find(tree(disk("nvme1n1", fstype="xfs")), 1, "xfs", model=MODEL)
    assert got == {"devices": ["/dev/nvme1n1"], "state": "formatted"}


@pytest.mark.parametrize(("disks", "count", "message"), [
    ((disk("nvme1n1"),), 2, "found 1 disk(s) of model"),
    ((disk("nvme1n1"), disk("nvme2n1"), disk("nvme3n1")), 2, "found 3 disk(s)"),
    ((disk("nvme1n1"), disk("nvme2n1", fstype="ext4")), 2, "nvme2n1 holds a file system (ext4)"),
    ((disk("nvme1n1"), disk("nvme2n1", children=[
        {"name": "/dev/nvme2n1p1", "type": "part", "model": None, "fstype": None,
         "label": None}])), 2, "nvme2n1 holds 1 partition(s)"),
    ((member("nvme1n1", "db1:data"), disk("nvme2n1")), 2, "RAID signature of array db1:data"),
    ((member("nvme1n1"), disk("nvme2n1")), 2, "partly array and partly blank"),
    ((disk("nvme1n1", fstype="ext4"),), 1, "holds a file system (ext4)"),
    ((disk("nvme1n1", fstype="xfs"), disk("nvme2n1", fstype="xfs")), 2,
     "holds a file system (xfs)"),
])
def test_refuses_what_is_not_declared_or_not_empty(disks: tuple[dict[str, Any], ...],
                                                   count: int, message: str) -> None:
    with pytest.raises(sd.Refused, match=message.replace("(", r"\(").replace(")", r"\)")):
        sd.find(tree(*disks), count, "xfs", model=MODEL)


def test_refuses_paths_that_are_no_disk_or_the_same_disk() -> None:
    t = tree(disk("nvme1n1"))
    with pytest.raises(sd.Refused, match="is not a disk here"):
        sd.find(t, 1, "xfs", paths=["/dev/disk/by-id/x"], resolve=lambda p: "/dev/sdz")
    with pytest.raises(sd.Refused, match="is not a disk here"):  # a partition is no disk
        sd.find(t, 1, "xfs", paths=["/dev/disk/by-id/x"], resolve=lambda p: "/dev/nvme0n1p2")
    with pytest.raises(sd.Refused, match="the same disk"):
        sd.find(t, 2, "xfs", paths=["/dev/disk/by-id/a", "/dev/disk/by-id/b"],
                resolve=lambda p: "/dev/nvme1n1")
    with pytest.raises(sd.Refused, match="exactly one of them"):
        sd.find(t, 1, "xfs")


def test_main_prints_json_or_one_line_and_exit_1(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    listing = json.dumps(tree(disk("nvme1n1"), disk("nvme2n1")))
    monkeypatch.setattr(sd.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 0, stdout=listing, stderr=""))
    assert sd.main(["--count", "2", "--fstype", "xfs", "--model", MODEL]) == 0
    assert json.loads(capsys.readouterr().out)["devices"] == ["/dev/nvme1n1", "/dev/nvme2n1"]
    assert sd.main(["--count", "3", "--fstype", "xfs", "--model", MODEL]) == 1
    err = capsys.readouterr().err
    assert err.startswith("scratch devices: found 2 disk(s)") and err.count("\n") == 1

    def broken(*a: Any, **k: Any) -> subprocess.CompletedProcess[str]:
        raise subprocess.CalledProcessError(1, a[0])

    monkeypatch.setattr(sd.subprocess, "run", broken)
    assert sd.main(["--count", "1", "--fstype", "xfs", "--model", MODEL]) == 1
    assert "cannot list the block devices" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("lsblk") is None, reason="lsblk (util-linux) is not installed")
def test_this_machines_lsblk_has_the_shape_the_program_reads() -> None:
    out = json.loads(subprocess.run(sd.LSBLK, capture_output=True, text=True, check=True,
                                    timeout=sd.LSBLK_TIMEOUT_S).stdout)
    assert set(out) == {"blockdevices"}
    for d in out["blockdevices"]:
        assert {"name", "type", "model", "fstype", "label"} <= set(d)
        assert d["name"].startswith("/dev/")
    # No disk of a made-up model here: refused with the count, not a crash.
    with pytest.raises(sd.Refused, match="found 0 disk"):
        sd.find(out, 1, "xfs", model="NO SUCH MODEL 0000")
