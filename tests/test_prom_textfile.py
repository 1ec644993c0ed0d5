"""gpupool/onhost/prom_textfile.py: root's writes into node_exporter's textfile directory
never go through a link planted there, and a directory others may write is refused."""

from __future__ import annotations

import itertools
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.onhost import prom_textfile as pt

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
ROOTS_FILE = "root:x:0:0:root:/root:/bin/bash\n"


@pytest.fixture
def textfile_dir(tmp_path: Path) -> Path:
    d = tmp_path / "node-exporter"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    return d


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """An /etc/passwd stand-in a planted link points at."""
    v = tmp_path / "passwd"
    v.write_text(ROOTS_FILE)
    return v


def test_writes_the_bytes_readable_by_node_exporter(textfile_dir: Path) -> None:
    out = pt.write(textfile_dir, "x.prom", b"x 1\n")
    assert out.read_bytes() == b"x 1\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert sorted(p.name for p in textfile_dir.iterdir()) == ["x.prom"]


def test_a_link_at_the_final_name_is_replaced_not_written_through(
        textfile_dir: Path, victim: Path) -> None:
    (textfile_dir / "x.prom").symlink_to(victim)
    pt.write(textfile_dir, "x.prom", b"x 1\n")
    assert victim.read_text() == ROOTS_FILE
    assert not (textfile_dir / "x.prom").is_symlink()
    assert (textfile_dir / "x.prom").read_bytes() == b"x 1\n"


def test_a_link_at_the_temporary_name_is_never_opened(
        textfile_dir: Path, victim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The attacker guessed the first name; the writer takes another fresh one.
    names = iter([".x.prom.guessed", ".x.prom.fresh"])
    monkeypatch.setattr(pt, "_temporary_name", lambda name: next(names))
    (textfile_dir / ".x.prom.guessed").symlink_to(victim)
    pt.write(textfile_dir, "x.prom", b"x 1\n")
    assert victim.read_text() == ROOTS_FILE
    assert (textfile_dir / "x.prom").read_bytes() == b"x 1\n"
    assert (textfile_dir / ".x.prom.guessed").is_symlink()  # left as it was


def test_every_temporary_name_planted_is_a_refusal(
        textfile_dir: Path, victim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pt, "_temporary_name", lambda name: ".x.prom.guessed")
    (textfile_dir / ".x.prom.guessed").symlink_to(victim)
    with pytest.raises(pt.Refused, match="temporary names"):
        pt.write(textfile_dir, "x.prom", b"x 1\n")
    assert victim.read_text() == ROOTS_FILE
    assert not (textfile_dir / "x.prom").exists()


def test_a_linked_directory_is_refused(tmp_path: Path, textfile_dir: Path) -> None:
    link = tmp_path / "linked"
    link.symlink_to(textfile_dir)
    with pytest.raises(pt.Refused, match="symbolic link"):
        pt.write(link, "x.prom", b"x 1\n")
    assert list(textfile_dir.iterdir()) == []


@pytest.mark.parametrize("mode", [0o777, 0o757, 0o1777])
def test_a_directory_others_may_write_is_refused(textfile_dir: Path, mode: int) -> None:
    textfile_dir.chmod(mode)
    with pytest.raises(pt.Refused, match="writable by others"):
        pt.write(textfile_dir, "x.prom", b"x 1\n")
    assert list(textfile_dir.iterdir()) == []


@ROOT_ONLY
def test_a_group_writable_directory_is_refused_unless_roots_group(textfile_dir: Path) -> None:
    textfile_dir.chmod(0o775)
    os.chown(textfile_dir, 0, 65534)  # root:prometheus, as role node_exporter once made it
    with pytest.raises(pt.Refused, match="writable by others"):
        pt.write(textfile_dir, "x.prom", b"x 1\n")
    os.chown(textfile_dir, 0, 0)
    assert pt.write(textfile_dir, "x.prom", b"x 1\n").read_bytes() == b"x 1\n"


@ROOT_ONLY
def test_a_directory_owned_by_another_user_is_refused(textfile_dir: Path) -> None:
    os.chown(textfile_dir, 65534, 0)
    with pytest.raises(pt.Refused, match="owned by uid 65534"):
        pt.write(textfile_dir, "x.prom", b"x 1\n")


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x.prom"])
def test_only_a_plain_name_is_written(textfile_dir: Path, name: str) -> None:
    with pytest.raises(pt.Refused, match="not a file name"):
        pt.write(textfile_dir, name, b"x 1\n")


def test_a_missing_directory_is_an_error_and_nothing_is_left(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        pt.write(tmp_path / "absent", "x.prom", b"x 1\n")


def test_a_failed_write_leaves_no_temporary_file(
        textfile_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_: object, **__: object) -> None:
        raise OSError("disk full")
    monkeypatch.setattr(pt.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        pt.write(textfile_dir, "x.prom", b"x 1\n")
    assert list(textfile_dir.iterdir()) == []


def test_the_program_writes_stdin_and_says_why_it_refuses(
        tmp_path: Path, textfile_dir: Path) -> None:
    argv = [sys.executable, "-m", "gpupool.onhost.prom_textfile"]
    ok = subprocess.run([*argv, str(textfile_dir), "x.prom"], input=b"x 1\n",
                        capture_output=True, check=False)
    assert ok.returncode == 0 and (textfile_dir / "x.prom").read_bytes() == b"x 1\n"
    link = tmp_path / "linked"
    link.symlink_to(textfile_dir)
    refused = subprocess.run([*argv, str(link), "x.prom"], input=b"x 2\n",
                             capture_output=True, check=False)
    assert refused.returncode == 1 and b"symbolic link" in refused.stderr
    assert subprocess.run(argv, capture_output=True, check=False).returncode == 2


def test_fresh_names_differ_and_start_with_a_dot() -> None:
    # node_exporter reads only *.prom: a half-written file is never scraped.
    names = {pt._temporary_name("x.prom") for _ in itertools.repeat(None, 50)}
    assert len(names) == 50 and all(n.startswith(".x.prom.") for n in names)
