"""Which block devices are this node's scratch devices, and whether gpupool may build
scratch on them. roles/storage runs it on the node before it creates the RAID0 array or the
file system, and builds nothing when it refuses.

The description names the devices (gpupool/spec/model.py, `Nvme`): every disk of one model,
or exactly these stable paths (/dev/disk/by-path/..., the same slots on every server of a
class, or /dev/disk/by-id/...). Never kernel names guessed from a count: /dev/nvme0n1 is the
boot disk on one server and scratch on the next, and the names can change between boots.

It refuses (exit 1, one line on stderr):
- a number of devices other than the declared count (too few: a failed disk or the wrong
  model; too many: the model matches other disks too, name them by path instead);
- a device that holds anything: partitions, a file system, or the RAID signature of another
  array. Wiping a disk is an operator's decision (`wipefs -a DEVICE`), never the role's.

It prints JSON on stdout: {"devices": [kernel paths, in the declared order], "state": S},
S one of:
- blank: every device is empty; the role may build;
- array: every device is a member of the md array named `scratch` (built before);
- formatted: the one device holds the declared file system (formatted before).

    python3 scratch_devices.py --count 8 --fstype xfs --model 'SAMSUNG MZQL23T8HCLS-00A07'
    python3 scratch_devices.py --count 2 --fstype xfs \\
        --device /dev/disk/by-path/pci-0000:c1:00.0-nvme-1 \\
        --device /dev/disk/by-path/pci-0000:c2:00.0-nvme-1

Standard library only, sent to the node as is (ansible.builtin.script). It reads lsblk's JSON
(util-linux); the unit tests feed it recorded lsblk output, since the lab's hosts have no
NVMe devices.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

ARRAY = "scratch"  # the md array's name: /dev/md/scratch (roles/storage)
RAID_MEMBER = "linux_raid_member"
LSBLK = ["lsblk", "--json", "--paths", "--output", "NAME,TYPE,MODEL,FSTYPE,LABEL"]
LSBLK_TIMEOUT_S = 30


class Refused(Exception):
    """The devices cannot be scratch as declared; the message says why and what to do."""


def _natural(name: str) -> list[Any]:
    # nvme2n1 before nvme10n1
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _disks(tree: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in tree.get("blockdevices") or [] if d.get("type") == "disk"}


def _chosen(disks: dict[str, dict[str, Any]], model: str | None, paths: list[str],
            resolve: Callable[[str], str]) -> list[dict[str, Any]]:
    if paths:
        out = []
        for path in paths:
            real = resolve(path)
            if real not in disks:
                raise Refused(f"{path} is not a disk here (it resolves to {real})")
            out.append(disks[real])
        return out
    return sorted((d for d in disks.values() if (d.get("model") or "").strip() == model),
                  key=lambda d: _natural(d["name"]))


def _state(disk: dict[str, Any], fstype: str, alone: bool) -> str:
    name, fs = disk["name"], disk.get("fstype")
    children = disk.get("children") or []
    if not fs and not children:
        return "blank"
    if fs == RAID_MEMBER and (disk.get("label") or "").rsplit(":", 1)[-1] == ARRAY:
        return "array"
    if alone and fs == fstype and not children:
        return "formatted"
    what = (f"the RAID signature of array {disk.get('label') or '(unnamed)'}"
            if fs == RAID_MEMBER else f"a file system ({fs})" if fs
            else f"{len(children)} partition(s) or device(s) on it")
    raise Refused(f"{name} holds {what}: gpupool builds scratch only on empty devices; if "
                  f"it really is scratch, wipe it first (wipefs -a {name})")


def find(tree: dict[str, Any], count: int, fstype: str, *, model: str | None = None,
         paths: list[str] | None = None,
         resolve: Callable[[str], str] = os.path.realpath) -> dict[str, Any]:
    """The scratch devices named by model or paths in lsblk's tree, and their state."""
    paths = paths or []
    if (model is None) == (not paths):
        raise Refused("name the scratch devices by a model or by paths, exactly one of them")
    chosen = _chosen(_disks(tree), model, paths, resolve)
    names = [d["name"] for d in chosen]
    if len(set(names)) != len(names):
        raise Refused(f"two declared paths are the same disk: {', '.join(names)}")
    if len(chosen) != count:
        how = f"of model {model!r}" if model is not None else "at the declared paths"
        raise Refused(f"found {len(chosen)} disk(s) {how} ({', '.join(names) or 'none'}), "
                      f"the description declares {count}")
    states = {_state(d, fstype, count == 1) for d in chosen}
    if len(states) != 1:
        raise Refused(f"{', '.join(names)} are partly {' and partly '.join(sorted(states))}: "
                      "a RAID0 array missing a member is lost; wipe them all to rebuild "
                      "(wipefs -a DEVICE)")
    return {"devices": names, "state": states.pop()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--fstype", required=True)
    ap.add_argument("--model")
    ap.add_argument("--device", action="append", default=[], dest="paths")
    args = ap.parse_args(argv)
    try:
        out = subprocess.run(LSBLK, capture_output=True, text=True, check=True,
                             timeout=LSBLK_TIMEOUT_S).stdout
        print(json.dumps(find(json.loads(out), args.count, args.fstype, model=args.model,
                              paths=args.paths)))
    except Refused as e:
        print(f"scratch devices: {e}", file=sys.stderr)
        return 1
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        print(f"scratch devices: cannot list the block devices: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
