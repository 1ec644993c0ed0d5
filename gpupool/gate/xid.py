"""XIDs since the node's last recorded GPU reset or admission: the XID check's window.

The kernel keeps an XID line for the whole boot, so a check that read the whole boot would
fail a node forever after one fault, and "reset, then gate again" could never return it.
So the node keeps a cursor, CURSOR, written by root when a GPU reset succeeded (the health
loop after `nvidia-smi -r`, or on-call with `python3 -m gpupool.gate.xid record reset`) and
when the gate admitted the node (gpupool/gate/onnode.py --admit, from roles/admission):

    {"boot_id": "<this boot's /proc/sys/kernel/random/boot_id>",
     "monotonic_s": <CLOCK_MONOTONIC at the record, seconds since boot>,
     "why": "reset" | "admitted", "recorded_at": <unix seconds, for people>}

Read against this boot's kernel log with monotonic stamps (`journalctl -k -b -o
short-monotonic`, else `dmesg`: both print `[seconds] ` first):

- an XID stamped at or before the cursor, in the cursor's boot, is history, not a failure;
- a cursor from another boot counts the whole current boot (reboot-then-pass: the old
  boot's XIDs are not in this boot's log at all);
- no cursor, or one that cannot be trusted (not a root-owned regular file in a directory
  only root may write, a link, too large, not this format) counts the whole boot, and the
  check says why: never a traceback, and never fewer XIDs than the kernel logged for a file
  someone else could have written. An XID line without a stamp always counts.

Written only through gpupool/onhost/prom_textfile.py, as a program (the gate's layer may
not import onhost): a fresh temporary name, never a link followed, in a directory it
refuses when others may write there.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gpupool.gate.health import write_textfile
from gpupool.gate.nvidia import XID_LINE

CURSOR_DIR = "/var/lib/gpupool/health"  # roles/acceptance_gate's health state directory
CURSOR_NAME = "xid-cursor"
CURSOR = f"{CURSOR_DIR}/{CURSOR_NAME}"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
MAX_CURSOR = 4096  # bytes: a cursor is about 150
WHY = ("reset", "admitted")
# This boot's kernel log, each line stamped with seconds since boot.
KERNEL_LOG = "journalctl -q -k -b --no-pager -o short-monotonic 2>/dev/null || dmesg"
# The lab's hosts are containers: they share the lab machine's kernel ring (writing a
# fixture XID there would put it in every host's log, and the machine's), and their journald
# reads no kernel messages. So in the lab only, the check also reads this boot's journal
# entries that root sent under the identifier `kernel` (`logger -t kernel`): _UID is a field
# journald sets itself, so no other user's entry is read.
LAB_KERNEL_LOG = (f"{KERNEL_LOG}; journalctl -q -b --no-pager -o short-monotonic "
                  "SYSLOG_IDENTIFIER=kernel _UID=0 2>/dev/null")
# One line per path: owner uid, mode (octal), size, type; a missing path prints nothing.
STAT = f"stat -c '%u %a %s %F' -- {CURSOR_DIR} {CURSOR} 2>/dev/null"
READ = f"head -c {MAX_CURSOR + 1} -- {CURSOR} 2>/dev/null"

_STAMP = re.compile(r"^\s*\[\s*(\d{1,10}(?:\.\d{1,9})?)\]")
_BOOT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True)
class XidEvent:
    pci: str
    code: int
    t: float | None  # seconds since boot, from the line's stamp; None: the line had none


@dataclass(frozen=True)
class Cursor:
    boot_id: str
    monotonic_s: float
    why: str
    recorded_at: int


@dataclass(frozen=True)
class Reading:
    counted: list[XidEvent]  # the check's failures
    history: list[XidEvent]  # before the cursor, in its boot
    basis: str  # what was counted, in words

    @property
    def summary(self) -> str:
        past = f"; {len(self.history)} XID line(s) before it are history" if self.history else ""
        return f"{len(self.counted)} XID line(s) {self.basis}{past}"


def xid_events(kernel_log: str) -> list[XidEvent]:
    """Each XID line of a kernel log, with its stamp when it has one."""
    events = []
    for line in kernel_log.splitlines():
        if m := XID_LINE.search(line):
            stamp = _STAMP.match(line)
            events.append(XidEvent(m.group(1), int(m.group(2)),
                                   float(stamp.group(1)) if stamp else None))
    return events


def cursor_text(boot_id: str, monotonic_s: float, why: str, recorded_at: int) -> str:
    return json.dumps({"boot_id": boot_id, "monotonic_s": round(monotonic_s, 6),
                       "why": why, "recorded_at": recorded_at}, sort_keys=True) + "\n"


def parse_cursor(text: str) -> Cursor:
    """The cursor, or ValueError saying why it is not one."""
    if len(text) > MAX_CURSOR:
        raise ValueError(f"larger than {MAX_CURSOR} bytes")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError("not JSON") from None
    if not isinstance(raw, dict) or set(raw) != {"boot_id", "monotonic_s", "why",
                                                 "recorded_at"}:
        raise ValueError("not an object of boot_id, monotonic_s, why and recorded_at")
    boot, mono, why, at = raw["boot_id"], raw["monotonic_s"], raw["why"], raw["recorded_at"]
    if not isinstance(boot, str) or not _BOOT.fullmatch(boot):
        raise ValueError("boot_id is not a boot id")
    if (isinstance(mono, bool) or not isinstance(mono, int | float) or not math.isfinite(mono)
            or not 0 <= mono < 1e10):
        raise ValueError("monotonic_s is not seconds since boot")
    if why not in WHY:
        raise ValueError(f"why is not one of {', '.join(WHY)}")
    if isinstance(at, bool) or not isinstance(at, int) or at < 0:
        raise ValueError("recorded_at is not unix seconds")
    return Cursor(boot, float(mono), why, at)


def _untrusted(line: str | None, what: str, regular: bool) -> str | None:
    """Why a `stat -c '%u %a %s %F'` line does not describe a path only root may write."""
    if line is None:
        return f"{what} is missing"
    fields = line.split(" ", 3)
    if len(fields) != 4 or not fields[0].isdigit() or not re.fullmatch(r"[0-7]{1,4}",
                                                                         fields[1]):
        return f"{what}: unreadable stat {line[:80]!r}"
    uid, mode, kind = int(fields[0]), int(fields[1], 8), fields[3]
    if kind != ("regular file" if regular else "directory") and not (
            regular and kind == "regular empty file"):
        return f"{what} is a {kind[:40]}"
    if uid != 0:
        return f"{what} is owned by uid {uid}, not root"
    if mode & 0o022:
        return f"{what} is writable by others (mode {mode:o})"
    return None


def load_cursor(stat_out: str, content: str) -> Cursor | str:
    """The cursor from STAT's and READ's output on the node, or why it cannot be used."""
    lines = stat_out.splitlines()
    if not lines:
        return f"no reset or admission recorded ({CURSOR_DIR} is missing)"
    if len(lines) == 1:
        return f"no reset or admission recorded ({CURSOR} is missing)"
    why = (_untrusted(lines[0], CURSOR_DIR, regular=False)
           or _untrusted(lines[1], CURSOR, regular=True))
    if why:
        return f"{CURSOR} not trusted: {why}"
    try:
        return parse_cursor(content)
    except ValueError as exc:
        return f"{CURSOR} unreadable: {exc}"


def reading(kernel_log: str, boot_id: str, cursor: Cursor | str) -> Reading:
    """Which of this boot's XID lines count: those after the cursor when it is of this
    boot, every one otherwise (and why)."""
    events = xid_events(kernel_log)
    boot_id = boot_id.strip()
    if isinstance(cursor, str):
        return Reading(events, [], f"in this boot ({cursor})")
    if not _BOOT.fullmatch(boot_id):
        return Reading(events, [], f"in this boot (its boot id is unreadable: {boot_id[:40]!r})")
    if cursor.boot_id != boot_id:
        return Reading(events, [], f"in this boot (the last {cursor.why} was recorded in "
                                   "another boot)")
    after = [e for e in events if e.t is None or e.t > cursor.monotonic_s]
    before = [e for e in events if e.t is not None and e.t <= cursor.monotonic_s]
    return Reading(after, before, f"since the {cursor.why} recorded at "
                                  f"{cursor.monotonic_s:.3f} s into this boot")


def record(why: str, directory: Path = Path(CURSOR_DIR)) -> Path:
    """Write this boot's cursor at the present moment (root only): XIDs logged so far in
    this boot become history. OSError when it could not be written."""
    if why not in WHY:
        raise ValueError(f"why must be one of {', '.join(WHY)}")
    boot_id = Path(BOOT_ID).read_text().strip()
    if not _BOOT.fullmatch(boot_id):
        raise OSError(f"{BOOT_ID}: not a boot id")
    text = cursor_text(boot_id, time.clock_gettime(time.CLOCK_MONOTONIC), why, int(time.time()))
    directory.mkdir(mode=0o750, parents=True, exist_ok=True)
    write_textfile(directory, CURSOR_NAME, text)
    return directory / CURSOR_NAME


USAGE = f"usage: python -m gpupool.gate.xid record {{{','.join(WHY)}}}"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "record" or argv[1] not in WHY:
        print(USAGE, file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        # The check trusts only a cursor root wrote: one written by anyone else is ignored.
        print("gpupool-xid: the cursor is root's to record (run it as root)", file=sys.stderr)
        return 1
    try:
        path = record(argv[1])
    except OSError as exc:
        print(f"gpupool-xid: cursor not recorded: {exc}", file=sys.stderr)
        return 1
    print(f"{path}: {argv[1]} recorded; XIDs logged before now in this boot are history")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
