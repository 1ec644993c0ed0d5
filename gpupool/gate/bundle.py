"""Pack the acceptance gate for the nodes: gpupool's package and what `gpupool[gate]`
installs (its base dependencies and the `gate` extra), installed for the nodes' Python
(their Debian release's CPython on x86_64: 3.11 on Debian 12, 3.13 on 13), as one archive
that roles/acceptance_gate unpacks on GPU nodes and on the burst image. The node then
needs no package index: its gate runs as

    PYTHONPATH=<dir>/lib python3 -m gpupool.gate.boot ...

The versions: uv.lock's in a checkout, every wheel checked against the lock's hashes
(uv's --require-hashes: a wheel whose bytes differ is refused); from an installed gpupool
(a pool project made by `gpupool init`), gpupool's declared requirements resolved under
the versions this environment runs, so the nodes' gate has the control host's pydantic,
pytest and testinfra (no lock there, so no hashes to check).
The archive is deterministic (sorted members, fixed times, owners and modes), so the same
inputs pack the same bytes and the role's unpacking stays idempotent.

Usage: python -m gpupool.gate.bundle OUT.tar.gz [--python X.Y]   (run by the role on the
Ansible controller, with Ansible's own Python; X.Y: the nodes' CPython, default 3.11).
Needs uv on PATH (scripts/bootstrap.sh installs it; `pip install uv` elsewhere); the
package index only where uv's cache lacks a wheel.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement  # with Ansible on every controller

from gpupool.paths import CACHES, PROJECT_ROOT, files_under
from gpupool.spec.model import OsRelease

PACKAGE = Path(__file__).resolve().parent.parent  # gpupool itself, checkout or installed
LOCK = PROJECT_ROOT / "uv.lock"  # a checkout's; an installed gpupool has none beside it
EXTRA = "gate"
PLATFORM = "x86_64-manylinux_2_28"
# The nodes' Pythons: one per Debian release a node may run.
PYTHONS = tuple(sorted({r.python for r in OsRelease}))
DEFAULT_PYTHON = OsRelease.DEBIAN_12.python


def node_markers(python: str) -> dict[str, str]:
    """The markers of the nodes' Python (requirements' environment markers are read for it)."""
    return {"python_version": python, "python_full_version": f"{python}.0",
            "sys_platform": "linux", "platform_system": "Linux",
            "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython"}
# Not packed: caches, lock files, and an installed gpupool's share/ (roles, playbooks: the
# controller's).
SKIP = (*CACHES, ".lock")
SKIP_TOP = ("share",)
INSTALL_TIMEOUT_S = 600


class BundleError(RuntimeError):
    """The gate could not be packed; the message says why."""


def requirements(python: str = DEFAULT_PYTHON) -> list[str]:
    """What the archive installs: name==version for `gpupool[gate]` and everything it
    requires on Linux, from uv.lock in a checkout (installed with its hashes: hashed());
    else gpupool's declared requirements (resolved by uv under constraints(), with no
    hashes to check: an installed gpupool has no lock)."""
    return _locked() if LOCK.is_file() else _declared(python)


def _locked() -> list[str]:
    lock = tomllib.loads(LOCK.read_text())
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


def hashed(wanted: list[str]) -> list[str]:
    """wanted as install() takes it: from uv.lock, each `name==version` followed by every
    wheel hash the lock records for it (`--hash=sha256:...`). The install then runs with
    --require-hashes, so a wheel whose bytes differ from the lock's (a poisoned cache,
    mirror or index) is refused, not packed into a gate that runs as root on every GPU
    node. Without a lock (an installed gpupool), wanted as it is: nothing to check against."""
    if not LOCK.is_file():
        return wanted
    packages = {p["name"]: p for p in tomllib.loads(LOCK.read_text())["package"]}
    return [_with_hashes(r, packages[r.split("==")[0]]) for r in wanted]


def _with_hashes(requirement: str, package: dict[str, Any]) -> str:
    hashes = sorted({w["hash"] for w in package.get("wheels", []) if w.get("hash")})
    if not hashes:
        raise BundleError(f"uv.lock records no wheel hash for {package['name']}: "
                          "the gate installs only wheels it can verify")
    return " ".join([requirement, *(f"--hash={h}" for h in hashes)])


def _declared(python: str) -> list[str]:
    declared = [Requirement(r) for r in metadata.requires("gpupool") or []]
    markers = node_markers(python)
    return sorted(str(r).split(";")[0].strip() for r in declared if r.marker is None
                  or any(r.marker.evaluate({**markers, "extra": e}) for e in ("", EXTRA)))


def constraints() -> list[str]:
    """Without a lock: the versions this environment runs, which the resolution keeps."""
    if LOCK.is_file():
        return []
    return sorted({f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions()
                   if d.metadata["Name"] and d.metadata["Name"] != "gpupool"})


def _members(top: Path) -> list[tuple[Path, str]]:
    return [(p, str(p.relative_to(top.parent))) for p in files_under(top, SKIP)]


def _source() -> list[tuple[Path, str]]:
    """gpupool's own files, as the archive names them (gpupool/...)."""
    return [(p, n) for p, n in _members(PACKAGE) if n.split("/")[1] not in SKIP_TOP]


def _inputs_digest(wanted: list[str], python: str) -> str:
    """The requirements (and constraints), the target Python and platform, and gpupool's
    source files."""
    h = hashlib.sha256("\n".join([*wanted, python, PLATFORM, ""]).encode())
    for path, name in _source():
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


def install(wanted: list[str], pinned: list[str], lib: Path, python: str = DEFAULT_PYTHON
            ) -> None:
    """uv installs wanted (under the constraints pinned) for the nodes' Python into lib."""
    uv = shutil.which("uv")
    if uv is None:
        raise BundleError("uv is not on PATH: the gate is packed with uv (pip install uv)")
    req, con = lib.parent / "requirements.txt", lib.parent / "constraints.txt"
    req.write_text("\n".join(wanted) + "\n")
    con.write_text("\n".join(pinned) + "\n")
    # From a lock every line carries its wheels' hashes (hashed()): uv checks
    # each wheel it installs, from its cache or the index, and refuses one that differs.
    verify = ["--require-hashes"] if any(" --hash=" in w for w in wanted) else []
    argv = [uv, "pip", "install", "--quiet", "--only-binary", ":all:", "--target", str(lib),
            "--python-version", python, "--python-platform", PLATFORM, "--no-compile",
            *verify, "-r", str(req), *(["-c", str(con)] if pinned else ["--no-deps"])]
    # uv's cache already holds these wheels wherever scripts/bootstrap.sh synced the venv
    # from the same uv.lock: no network then. The index only when it does not.
    if subprocess.run([*argv, "--offline"], timeout=INSTALL_TIMEOUT_S, check=False,
                      capture_output=True).returncode == 0:
        return
    done = subprocess.run(argv, timeout=INSTALL_TIMEOUT_S, check=False, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise BundleError(f"uv could not install the gate's packages: {done.stderr.strip()}")


def main(argv: list[str]) -> int:
    python = DEFAULT_PYTHON
    if len(argv) == 3 and argv[1] == "--python":
        python, argv = argv[2], argv[:1]
    if len(argv) != 1 or python not in PYTHONS:
        print(__doc__.split("\n\n")[-2], file=sys.stderr)
        if python not in PYTHONS:
            print(f"gpupool.gate.bundle: --python must be one of {', '.join(PYTHONS)} (the "
                  f"nodes' Debian releases), got {python!r}", file=sys.stderr)
        return 2
    out = Path(argv[0]).resolve()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        wanted, pinned = hashed(requirements(python)), constraints()
        # What the archive is made of, and the archive itself, recorded beside it: the same
        # inputs pack the same bytes, so every play after the first (a re-run, each
        # onboarding) skips the install and the packing (about 4 s) while the archive is
        # still that one.
        stamp = out.with_name(out.name + ".stamp")
        inputs = _inputs_digest([*wanted, "--", *pinned], python)
        if out.is_file() and stamp.is_file() and stamp.read_text().split() == [
                inputs, hashlib.sha256(out.read_bytes()).hexdigest()]:
            return 0
        with tempfile.TemporaryDirectory() as tmp:
            lib = Path(tmp) / "lib"
            install(wanted, pinned, lib, python)
            # gpupool itself as source: the gate is this gpupool's, at its commit.
            for path, name in _source():
                dest = lib / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(path.read_bytes())
            pack(lib, out)
        stamp.write_text(f"{inputs} {hashlib.sha256(out.read_bytes()).hexdigest()}\n")
    except (BundleError, OSError, subprocess.TimeoutExpired) as err:
        print(f"gpupool.gate.bundle: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
