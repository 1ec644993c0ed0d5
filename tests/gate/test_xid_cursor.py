"""The XID check's window (gpupool/gate/xid.py): XIDs since the node's last recorded reset or
admission count, earlier ones in the same boot are history, another boot's cursor counts the
whole boot, and a cursor that cannot be trusted counts everything and says why. Against the
hand-written kernel logs in tests/gate/fixtures (README there)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpupool.gate import onnode, xid
from gpupool.gate.suites import test_gpu as gpu_suite

FIXTURES = Path(__file__).parent / "fixtures"
BOOT1 = "2c7e4f4a-6a3d-4b59-9f0e-5d1c2b3a4f50"
BOOT2 = "8b1d0e9c-1f2a-4c3b-8d4e-7a6b5c4d3e21"
DIR_OK = "0 750 4096 directory"
FILE_OK = "0 644 120 regular file"


def log(name: str) -> str:
    return (FIXTURES / name).read_text()


def cursor(boot: str = BOOT1, mono: float = 3120.5, why: str = "reset") -> xid.Cursor:
    return xid.parse_cursor(xid.cursor_text(boot, mono, why, 1_790_000_000))


def codes(reading: xid.Reading) -> list[int]:
    return [e.code for e in reading.counted]


def test_an_xid_before_the_cursor_is_history_and_one_after_fails() -> None:
    # dmesg's format ([seconds] message): XID 13 at 1021.115, XID 79 at 2040.900.
    seen = xid.reading(log("kernel-xid.log"), BOOT1, cursor(mono=1500.0, why="admitted"))
    assert codes(seen) == [79] and [e.code for e in seen.history] == [13]
    assert "since the admitted recorded at 1500.000 s" in seen.summary


def test_reset_then_pass() -> None:
    """XIDs 94, 48 and 13 before a reset recorded in the same boot: nothing counts."""
    before = xid.reading(log("kernel-boot1.journal.log"), BOOT1, "no reset recorded")
    assert codes(before) == [94, 48, 13]
    after = xid.reading(log("kernel-boot1.journal.log"), BOOT1, cursor(mono=3120.5))
    assert codes(after) == [] and [e.code for e in after.history] == [94, 48, 13]


def test_a_new_xid_after_the_reset_fails_again() -> None:
    seen = xid.reading(log("kernel-boot1-later.journal.log"), BOOT1, cursor(mono=3120.5))
    assert seen.counted == [xid.XidEvent("0000:3b:00", 94, 5400.118236)]


def test_reboot_then_pass() -> None:
    """The next boot's log has none of the old boot's XIDs; the old cursor is ignored."""
    seen = xid.reading(log("kernel-boot2.journal.log"), BOOT2, cursor(BOOT1, 3120.5))
    assert codes(seen) == [] and "another boot" in seen.basis


def test_a_cursor_from_another_boot_counts_the_whole_boot() -> None:
    # An XID early in the new boot, before the old cursor's monotonic time: it counts.
    early = log("kernel-boot2.journal.log") + (
        "[   40.000001] gpu-01 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', "
        "name=<unknown>, GPU has fallen off the bus.\n")
    assert codes(xid.reading(early, BOOT2, cursor(BOOT1, 3120.5))) == [79]
    assert codes(xid.reading(early, BOOT1, cursor(BOOT1, 3120.5))) == []


def test_an_xid_line_without_a_stamp_always_counts() -> None:
    text = "NVRM: Xid (PCI:0000:3b:00): 94, pid=1, name=x, Contained\n"
    assert codes(xid.reading(text, BOOT1, cursor(mono=3120.5))) == [94]


def test_older_drivers_lines_without_pci_are_read() -> None:
    text = "[ 4909.922970] NVRM: Xid (0000:01:00): 13, 0005 00000000 0000502d 00000104\n"
    assert xid.xid_events(text) == [xid.XidEvent("0000:01:00", 13, 4909.92297)]


def test_an_unreadable_boot_id_counts_the_whole_boot() -> None:
    seen = xid.reading(log("kernel-boot1.journal.log"), "", cursor(mono=3120.5))
    assert codes(seen) == [94, 48, 13] and "boot id is unreadable" in seen.basis


MALFORMED = {
    "empty": "",
    "not json": "{",
    "a list": "[]",
    "a key missing": json.dumps({"boot_id": BOOT1, "monotonic_s": 1.0, "why": "reset"}),
    "an extra key": json.dumps({"boot_id": BOOT1, "monotonic_s": 1.0, "why": "reset",
                                "recorded_at": 1, "count": "all"}),
    "boolean seconds": json.dumps({"boot_id": BOOT1, "monotonic_s": True, "why": "reset",
                                   "recorded_at": 1}),
    "NaN seconds": f'{{"boot_id": "{BOOT1}", "monotonic_s": NaN, "why": "reset", '
                   '"recorded_at": 1}',
    "infinite seconds": f'{{"boot_id": "{BOOT1}", "monotonic_s": 1e999, "why": "reset", '
                        '"recorded_at": 1}',
    "negative seconds": json.dumps({"boot_id": BOOT1, "monotonic_s": -5, "why": "reset",
                                    "recorded_at": 1}),
    "seconds as text": json.dumps({"boot_id": BOOT1, "monotonic_s": "9e9", "why": "reset",
                                   "recorded_at": 1}),
    "a boot id that is a pattern": json.dumps({"boot_id": ".*", "monotonic_s": 1.0,
                                               "why": "reset", "recorded_at": 1}),
    "an unknown why": json.dumps({"boot_id": BOOT1, "monotonic_s": 1.0, "why": "forgive",
                                  "recorded_at": 1}),
    "huge": json.dumps({"boot_id": BOOT1, "monotonic_s": 1.0, "why": "reset",
                        "recorded_at": 1, "pad": "x" * 5000}),
    "deeply nested": "[" * 2000 + "]" * 2000,
}


@pytest.mark.parametrize("text", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_cursor_counts_every_xid_and_says_why(text: str) -> None:
    found = xid.load_cursor(f"{DIR_OK}\n{FILE_OK}\n", text)
    assert isinstance(found, str) and found.startswith(f"{xid.CURSOR} unreadable: ")
    seen = xid.reading(log("kernel-boot1.journal.log"), BOOT1, found)
    assert codes(seen) == [94, 48, 13] and "unreadable" in seen.basis


UNTRUSTED = {
    "no directory": ("", "is missing"),
    "no cursor": (DIR_OK, "no reset or admission recorded"),
    "a cursor someone else owns": (f"{DIR_OK}\n1000 644 120 regular file", "uid 1000"),
    "a cursor others may write": (f"{DIR_OK}\n0 666 120 regular file", "writable by others"),
    "a cursor that is a link": (f"{DIR_OK}\n0 777 9 symbolic link", "symbolic link"),
    "a cursor that is a fifo": (f"{DIR_OK}\n0 600 0 fifo", "fifo"),
    "a directory others may write": ("0 1777 4096 directory\n" + FILE_OK, "writable by others"),
    "a directory someone else owns": ("1000 750 4096 directory\n" + FILE_OK, "uid 1000"),
    "a directory that is a link": ("0 777 9 symbolic link\n" + FILE_OK, "symbolic link"),
    "garbage from stat": ("what\never", "unreadable stat"),
}


@pytest.mark.parametrize(("stat", "why"), UNTRUSTED.values(), ids=UNTRUSTED.keys())
def test_a_cursor_only_root_could_have_written_is_trusted(stat: str, why: str) -> None:
    good = xid.cursor_text(BOOT1, 3120.5, "reset", 1)
    found = xid.load_cursor(stat, good)
    assert isinstance(found, str) and why in found, found
    assert isinstance(xid.load_cursor(f"{DIR_OK}\n{FILE_OK}\n", good), xid.Cursor)


def test_record_writes_this_boots_cursor_at_the_present_moment(tmp_path: Path) -> None:
    directory = tmp_path / "health"
    path = xid.record("reset", directory)
    written = xid.parse_cursor(path.read_text())
    assert written.boot_id == Path(xid.BOOT_ID).read_text().strip() and written.why == "reset"
    assert (directory.stat().st_mode & 0o777) == 0o750
    assert not [p for p in directory.iterdir() if p.name != xid.CURSOR_NAME]  # no temporary
    now = written.monotonic_s
    text = (f"[{now - 1:12.6f}] n kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE\n"
            f"[{now + 1:12.6f}] n kernel: NVRM: Xid (PCI:0000:3b:00): 94, pid=1, name=x, SM\n")
    assert codes(xid.reading(text, written.boot_id, written)) == [94]


def test_record_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    target = tmp_path / "passwd"
    target.write_text("root:x:0:0\n")
    directory = tmp_path / "health"
    directory.mkdir(mode=0o750)
    (directory / xid.CURSOR_NAME).symlink_to(target)
    xid.record("admitted", directory)  # the link is replaced, never followed
    assert target.read_text() == "root:x:0:0\n"
    assert not (directory / xid.CURSOR_NAME).is_symlink()
    linked = tmp_path / "linked"
    linked.symlink_to(directory)
    with pytest.raises(OSError, match="symbolic link"):
        xid.record("admitted", linked)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(OSError, match="writable by others"):
        xid.record("reset", open_dir)


def test_record_refuses_an_unknown_why_and_main_its_usage(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    with pytest.raises(ValueError, match="why must be"):
        xid.record("forgive")
    for argv in ([], ["record"], ["record", "forgive"], ["erase", "reset"]):
        assert xid.main(argv) == 2
    assert "usage" in capsys.readouterr().err


def test_main_leaves_the_cursor_to_root(monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert xid.main(["record", "reset"]) == 1
    assert "root's to record" in capsys.readouterr().err


class FixtureHost:
    """What the XID check runs on a node, answered from a kernel log and a cursor."""

    def __init__(self, kernel_log: str, boot: str, stat: str, content: str,
                 driver: bool = True) -> None:
        self.answers = {xid.KERNEL_LOG: kernel_log, xid.STAT: stat, xid.READ: content,
                        f"cat {xid.BOOT_ID}": boot + "\n"}
        self.driver = driver
        self.ran: list[str] = []

    def run(self, command: str) -> SimpleNamespace:
        self.ran.append(command)
        if command == "nvidia-smi -L":
            return SimpleNamespace(rc=0 if self.driver else 127, stdout="")
        return SimpleNamespace(rc=0, stdout=self.answers[command])

    def file(self, path: str) -> SimpleNamespace:
        return SimpleNamespace(exists=self.driver)


def check(host: FixtureHost) -> dict[str, Any]:
    """The suite's XID check on host: what it measured (a failure is recorded, not raised)."""
    seen: dict[str, Any] = {}

    def measure(value: Any, expected: Any, ok: bool, message: str = "",
                action: str | None = None) -> None:
        seen.update(value=value, ok=ok, message=message, action=action)

    expect = SimpleNamespace(lab=False)
    gpu_suite.test_no_xid_errors(host, None, expect, measure)
    return seen


def test_the_gate_check_fails_before_the_reset_and_passes_after() -> None:
    boot1 = log("kernel-boot1.journal.log")
    none = check(FixtureHost(boot1, BOOT1, DIR_OK, ""))
    assert not none["ok"] and none["value"] == [13, 48, 94] and none["action"] == "reset"
    assert "no reset or admission recorded" in none["message"]
    reset = xid.cursor_text(BOOT1, 3120.5, "reset", 1)
    assert check(FixtureHost(boot1, BOOT1, f"{DIR_OK}\n{FILE_OK}", reset))["ok"]
    later = check(FixtureHost(log("kernel-boot1-later.journal.log"), BOOT1,
                              f"{DIR_OK}\n{FILE_OK}", reset))
    assert not later["ok"] and later["value"] == [94] and "since the reset" in later["message"]
    hostile = check(FixtureHost(boot1, BOOT1, f"{DIR_OK}\n1000 644 120 regular file", reset))
    assert not hostile["ok"] and "uid 1000" in hostile["message"]
    rebooted = check(FixtureHost(log("kernel-boot2.journal.log"), BOOT2,
                                 f"{DIR_OK}\n{FILE_OK}", reset))
    assert rebooted["ok"] and rebooted["value"] == []


def test_without_a_driver_the_check_skips_unless_an_xid_counts() -> None:
    reset = xid.cursor_text(BOOT1, 3120.5, "reset", 1)
    host = FixtureHost(log("kernel-boot1.journal.log"), BOOT1, f"{DIR_OK}\n{FILE_OK}", reset,
                       driver=False)
    with pytest.raises(pytest.skip.Exception, match=r"^no NVIDIA GPU .*3 XID line"):
        check(host)
    fallen = check(FixtureHost(log("kernel-boot1.journal.log"), BOOT1, DIR_OK, "",
                               driver=False))
    assert not fallen["ok"] and fallen["value"] == [13, 48, 94]


def test_admission_records_the_cursor_only_for_a_pass(tmp_path: Path) -> None:
    recorded: list[str] = []

    def record(why: str) -> Path:
        recorded.append(why)
        return tmp_path / xid.CURSOR_NAME

    failed: dict[str, Any] = {"verdict": "fail"}
    onnode.admit(failed, record)
    assert recorded == [] and "xid_cursor" not in failed
    passed: dict[str, Any] = {"verdict": "pass"}
    onnode.admit(passed, record)
    assert recorded == ["admitted"] and passed["xid_cursor"].endswith("admission recorded")

    def broken(why: str) -> Path:
        raise OSError("/var/lib/gpupool/health: writable by others (mode 777)")

    kept: dict[str, Any] = {"verdict": "pass"}
    onnode.admit(kept, broken)
    assert kept == {"verdict": "pass",
                    "xid_cursor": "not recorded: /var/lib/gpupool/health: writable by others "
                                  "(mode 777)"}


def test_onnode_takes_only_admit_as_a_fourth_argument(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    assert onnode.main(["n1", "quick", "/tmp/r", "--record-everything"]) == 2
    assert "--admit" in capsys.readouterr().err
