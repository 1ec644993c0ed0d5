"""The monitoring web servers' password and its bcrypt hash, made on the controller.

Prometheus and Alertmanager admit clients with basic auth, whose users their web
configuration lists with a bcrypt hash. The password is made here, on the host, so that it
never travels through Ansible or lands in a log: once, with `secrets`, in PASSWORD_FILE;
the hash in HASH_FILE is kept while it still matches the password and made again when it
does not (an operator who deletes the password file to rotate it gets a new hash with the
new password on the next converge). Both files are written to a fresh name and renamed, mode
0640, owned by root and GROUP (the services' group: Prometheus reads the password to log in
to Alertmanager and to itself).

Prints `ok` when nothing had to change, `changed` otherwise; with --check it writes
nothing (Ansible's check mode). Exit 2 with a message when a file cannot be read or written.
Run by role monitoring with the system python3 and Debian's python3-bcrypt:

    python3 web_password.py /etc/prometheus/web/password \
        /etc/prometheus/web/password.bcrypt prometheus [--check]
"""

from __future__ import annotations

import argparse
import grp
import os
import secrets
import sys
from pathlib import Path

MODE = 0o640
PASSWORD_BYTES = 32  # 43 URL-safe characters: well under bcrypt's 72-byte limit


def _write(path: Path, data: bytes, gid: int) -> None:
    """data at path through a fresh name in its directory, renamed over it (a link at the
    final name is replaced, never written through)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), MODE)
            if os.geteuid() == 0:
                os.fchown(f.fileno(), 0, gid)
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        return None


def ensure(password_file: Path, hash_file: Path, gid: int, *, check: bool) -> bool:
    """Make the password if there is none and the hash if it does not match; True when
    something was (or, with check, would be) written."""
    # The host's python3-bcrypt (Debian's), which the project's venv need not carry.
    import bcrypt  # noqa: PLC0415

    password = _read(password_file)
    changed = not password
    if not password:
        password = secrets.token_urlsafe(PASSWORD_BYTES).encode()
        if not check:
            _write(password_file, password + b"\n", gid)
    old = _read(hash_file)
    try:
        matches = old is not None and bcrypt.checkpw(password, old)
    except ValueError:  # not a bcrypt hash at all
        matches = False
    if not matches:
        changed = True
        if not check:
            _write(hash_file, bcrypt.hashpw(password, bcrypt.gensalt()) + b"\n", gid)
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="web_password", description=__doc__.split("\n\n")[0])
    p.add_argument("password_file", type=Path)
    p.add_argument("hash_file", type=Path)
    p.add_argument("group", help="the services' group, which reads both files")
    p.add_argument("--check", action="store_true", help="write nothing (check mode)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        gid = grp.getgrnam(args.group).gr_gid
        changed = ensure(args.password_file, args.hash_file, gid, check=args.check)
    except (KeyError, OSError) as e:
        print(f"web_password: {e}", file=sys.stderr)
        return 2
    print("changed" if changed else "ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
