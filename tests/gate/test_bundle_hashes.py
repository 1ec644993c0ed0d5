"""The gate bundle (gpupool/gate/bundle.py) installs from uv.lock only wheels whose bytes
are the lock's: each requirement carries its wheels' hashes and uv runs with
--require-hashes, so a tampered wheel (a poisoned cache, mirror or index) is refused
rather than packed into the gate every GPU node runs as root."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

from gpupool.gate import bundle

NEEDS_UV = pytest.mark.skipif(shutil.which("uv") is None, reason="the bundle installs with uv")


def _wheel(path: Path, body: bytes) -> str:
    """A minimal pure-Python wheel of `gpupoolprobe` 1.0 at path; its sha256."""
    files = {"gpupoolprobe.py": body,
             "gpupoolprobe-1.0.dist-info/METADATA":
                 b"Metadata-Version: 2.1\nName: gpupoolprobe\nVersion: 1.0\n",
             "gpupoolprobe-1.0.dist-info/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()}"
        f",{len(d)}\n" for n, d in files.items()) + "gpupoolprobe-1.0.dist-info/RECORD,,\n"
    files["gpupoolprobe-1.0.dist-info/RECORD"] = record.encode()
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """uv sees only a local folder of wheels: its own cache (empty), no index."""
    d = tmp_path / "links"
    d.mkdir()
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("UV_FIND_LINKS", str(d))
    monkeypatch.setenv("UV_DEFAULT_INDEX", (tmp_path / "no-index").as_uri())
    monkeypatch.delenv("UV_INDEX_URL", raising=False)
    monkeypatch.delenv("UV_INDEX", raising=False)
    return d


def test_every_locked_requirement_carries_the_locks_wheel_hashes() -> None:
    lock = {p["name"]: p for p in tomllib.loads(bundle.LOCK.read_text())["package"]}
    lines = bundle.hashed(bundle.requirements())
    assert [ln.split(" ")[0] for ln in lines] == bundle.requirements()
    for line in lines:
        pin, *hashes = line.split(" ")
        name, version = pin.split("==")
        assert lock[name]["version"] == version
        assert hashes and sorted(h.removeprefix("--hash=") for h in hashes) == sorted(
            {w["hash"] for w in lock[name]["wheels"]}), name


def test_a_locked_package_without_a_wheel_hash_is_refused() -> None:
    package: dict[str, Any] = {"name": "x", "version": "1", "wheels": [{"url": "u"}]}
    with pytest.raises(bundle.BundleError, match="no wheel hash for x"):
        bundle._with_hashes("x==1", package)


def test_hashed_requirements_install_with_require_hashes(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(bundle.subprocess, "run", run)
    monkeypatch.setattr(bundle.shutil, "which", lambda name: "/usr/bin/uv")
    bundle.install(["a==1 --hash=sha256:" + "0" * 64], [], tmp_path / "lib")
    assert "--require-hashes" in seen[0] and "--no-deps" in seen[0]
    seen.clear()
    bundle.install(["a==1"], ["a==1"], tmp_path / "lib")  # no lock: declared, not hashed
    assert "--require-hashes" not in seen[0]


@NEEDS_UV
def test_the_wheel_the_lock_names_installs(tmp_path: Path, links: Path) -> None:
    digest = _wheel(links / "gpupoolprobe-1.0-py3-none-any.whl", b"X = 1\n")
    lib = tmp_path / "work" / "lib"
    lib.parent.mkdir()
    bundle.install([f"gpupoolprobe==1.0 --hash=sha256:{digest}"], [], lib)
    assert (lib / "gpupoolprobe.py").read_bytes() == b"X = 1\n"


@NEEDS_UV
def test_a_tampered_wheel_is_refused(tmp_path: Path, links: Path) -> None:
    wheel = links / "gpupoolprobe-1.0-py3-none-any.whl"
    digest = _wheel(wheel, b"X = 1\n")
    _wheel(wheel, b"import os; os.system('id')\n")  # same name, other bytes
    lib = tmp_path / "work" / "lib"
    lib.parent.mkdir()
    with pytest.raises(bundle.BundleError, match=r"(?i)hash mismatch"):
        bundle.install([f"gpupoolprobe==1.0 --hash=sha256:{digest}"], [], lib)
    assert not (lib / "gpupoolprobe.py").exists()


@NEEDS_UV
def test_a_requirement_without_a_hash_is_refused_among_hashed_ones(tmp_path: Path,
                                                                  links: Path) -> None:
    digest = _wheel(links / "gpupoolprobe-1.0-py3-none-any.whl", b"X = 1\n")
    lib = tmp_path / "work" / "lib"
    lib.parent.mkdir()
    with pytest.raises(bundle.BundleError):
        bundle.install([f"gpupoolprobe==1.0 --hash=sha256:{digest}", "other==1.0"], [], lib)
