#!/usr/bin/env python3
"""Pack the acceptance gate for the nodes: gpupool's package and what `gpupool[gate]`
installs (its base dependencies and the `gate` extra) at uv.lock's versions, installed
for the nodes' Python (Debian 12's CPython 3.11 on x86_64), as one archive that
roles/acceptance_gate unpacks on GPU nodes and on the burst image. The node then needs
no package index: its gate runs as

    PYTHONPATH=<dir>/lib python3 -m gpupool.gate.boot ...

The archive is deterministic (sorted members, fixed times, owners and modes), so the
same checkout packs the same bytes and the role's unpacking stays idempotent.

Usage: scripts/gate_bundle.py OUT.tar.gz   (run by the role on the Ansible controller)
Needs uv on PATH (scripts/bootstrap.sh installs it); the package index only where uv's
cache lacks a wheel.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTRA = "gate"
PYTHON_VERSION, PLATFORM = "3.11", "x86_64-manylinux_2_28"
SKIP = ("__pycache__", ".pyc", ".lock")
INSTALL_TIMEOUT_S = 600


def requirements() -> list[str]:
    """name==version for what `gpupool[gate]` installs (the base dependencies and the
    extra's packages) and everything they require on Linux."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    packages = {p["name"]: p for p in lock["package"]}
    own = next(p for p in lock["package"] if p.get("source", {}).get("editable") == "."
               or p["name"] == "gpupool")
    direct = [*own.get("dependencies", []), *own["optional-dependencies"][EXTRA]]
    wanted, todo = set(), [d["name"] for d in direct]
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.add(name)
        todo += [d["name"] for d in packages[name].get("dependencies", [])
                 if "win32" not in d.get("marker", "")]
    return sorted(f"{n}=={packages[n]['version']}" for n in wanted)


def _members(top: Path) -> list[tuple[Path, str]]:
    return sorted((p, str(p.relative_to(top.parent))) for p in top.rglob("*")
                  if p.is_file() and not any(s in p.name or s in p.parts for s in SKIP))


def _inputs_digest(wanted: list[str]) -> str:
    """The requirements, the target Python and platform, and gpupool's source files."""
    h = hashlib.sha256("\n".join([*wanted, PYTHON_VERSION, PLATFORM, ""]).encode())
    for path, name in _members(ROOT / "gpupool"):
        data = path.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def pack(lib: Path, out: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, name in _members(lib):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.uid, info.gid = path.stat().st_size, 0, 0, 0
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            with path.open("rb") as f:
                tar.addfile(info, f)
    # A temporary name of this run's own: two plays packing at once (a site run beside an
    # onboarding) must not write into one file; each renames whole bytes into place.
    fd, name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            gz.write(buf.getvalue())
        tmp.chmod(0o644)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.split("\n\n")[-2], file=sys.stderr)
        return 2
    out = Path(argv[0]).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    wanted = requirements()
    # What the archive is made of, and the archive itself, recorded beside it: the same
    # inputs pack the same bytes, so every play after the first (a re-run, each onboarding)
    # skips the install and the packing (about 4 s) while the archive is still that one.
    stamp = out.with_name(out.name + ".stamp")
    inputs = _inputs_digest(wanted)
    if out.is_file() and stamp.is_file() and stamp.read_text().split() == [
            inputs, hashlib.sha256(out.read_bytes()).hexdigest()]:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp) / "lib"
        req = Path(tmp) / "requirements.txt"
        req.write_text("\n".join(wanted) + "\n")
        argv = ["uv", "pip", "install", "--quiet", "--no-deps", "--only-binary", ":all:",
                "--target", str(lib), "--python-version", PYTHON_VERSION,
                "--python-platform", PLATFORM, "--no-compile", "-r", str(req)]
        # uv's cache already holds these wheels wherever scripts/bootstrap.sh synced the
        # venv from the same uv.lock: no network then. The index only when it does not.
        if subprocess.run([*argv, "--offline"], timeout=INSTALL_TIMEOUT_S, check=False,
                          capture_output=True).returncode != 0:
            subprocess.run(argv, check=True, timeout=INSTALL_TIMEOUT_S)
        # gpupool itself as source: the gate is the checkout's, at its commit.
        for path, name in _members(ROOT / "gpupool"):
            dest = lib / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(path.read_bytes())
        pack(lib, out)
    stamp.write_text(f"{inputs} {hashlib.sha256(out.read_bytes()).hexdigest()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
