"""Write a file for node_exporter's textfile collector as root without following links.

The writers (the checkpoint-age collector, the idle reclaim, the controller backup, the
health loop) run as root and write into node_exporter's textfile directory. A writer that
opened a predictable name there (`x.prom.tmp`, prometheus_client's `x.prom.<pid>.<tid>`)
would follow a link planted at that name and write, as root, wherever it points (a
`/etc/passwd`). So, here:

- the directory is opened once, without following a link (O_NOFOLLOW on its last part),
  and refused unless it is a directory owned by root (or by the writer itself, for an
  unprivileged run such as a unit test) that neither its group (unless root's) nor others
  may write: a directory someone else can write is one they can plant names in;
- the bytes go to a fresh temporary name made in that very directory (relative to the
  opened directory, so a directory swapped after the check is not written into) with
  O_CREAT|O_EXCL|O_NOFOLLOW: a name that already exists, link or not, is never opened;
- the file is fsynced, then renamed over the final name (rename replaces a link at the
  final name, it never writes through it).

Stdlib only: this file is copied to hosts beside the programs that import it (gpupool's
onhost programs import nothing else of gpupool). Also a program, for writers that may not
import it (the health loop, in gpupool.gate):

    python3 prom_textfile.py DIRECTORY NAME < content
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import sys
from pathlib import Path

MODE = 0o644  # node_exporter (its own user) reads it
TRIES = 8  # fresh names tried before giving up; a clash means someone plants names


class Refused(OSError):
    """The directory is not one root may write into safely; nothing was written."""


def _check_directory(fd: int, directory: Path) -> None:
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(f"{directory}: not a directory")
    if st.st_uid not in (0, os.geteuid()):
        raise Refused(f"{directory}: owned by uid {st.st_uid}, not root")
    if st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid != 0):
        raise Refused(f"{directory}: writable by others (mode {stat.S_IMODE(st.st_mode):o})")


def _name(name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise Refused(f"{name!r}: not a file name")
    return name


def _temporary_name(name: str) -> str:
    # A dot first: node_exporter reads only *.prom, so a half-written file is never read.
    return f".{name}.{secrets.token_hex(8)}"


def write(directory: Path, name: str, data: bytes) -> Path:
    """Put data at directory/name, as described above; Refused or OSError otherwise (the
    final name is then untouched and no temporary file is left)."""
    _name(name)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        dfd = os.open(directory, flags)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a link, or a file
            raise Refused(f"{directory}: a symbolic link or a file, not a directory") from exc
        raise
    try:
        _check_directory(dfd, directory)
        create = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        for _ in range(TRIES):
            tmp = _temporary_name(name)
            try:
                fd = os.open(tmp, create, MODE, dir_fd=dfd)
                break
            except FileExistsError:
                continue
        else:
            raise Refused(f"{directory}: {TRIES} fresh temporary names all existed")
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), MODE)  # whatever the umask took away
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        os.fsync(dfd)  # the rename itself survives a crash
    finally:
        os.close(dfd)
    return directory / name


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    try:
        write(Path(argv[0]), argv[1], sys.stdin.buffer.read())
    except OSError as exc:
        print(f"prom_textfile: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
