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


def pack(lib: Path, out: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, name in _members(lib):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.uid, info.gid = path.stat().st_size, 0, 0, 0
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            with path.open("rb") as f:
                tar.addfile(info, f)
    tmp = out.with_suffix(".tmp")
    with tmp.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        gz.write(buf.getvalue())
    tmp.replace(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.split("\n\n")[-2], file=sys.stderr)
        return 2
    out = Path(argv[0]).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp) / "lib"
        req = Path(tmp) / "requirements.txt"
        req.write_text("\n".join(requirements()) + "\n")
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
