"""A fresh clone is all the project needs: nothing reads beside the repository, and the
vendored data each carry a note of their source and licence."""

from __future__ import annotations

import re
import subprocess

import pytest

from gpupool.paths import DATA
from tests.conftest import ROOT, BesideTheRepository, beside_repository


def test_opening_a_file_beside_the_repository_fails() -> None:
    target = ROOT.parent / "a-sibling-folder" / "anything.yaml"
    if not beside_repository(target):
        pytest.skip(f"the repository's parent {ROOT.parent} holds the interpreter, the temp "
                    "folder or the home folder, or is /: no sibling folder to guard")
    with pytest.raises(BesideTheRepository):
        target.open()
    assert not beside_repository(ROOT / "README.md")


def test_no_tracked_file_points_beside_the_repository() -> None:
    files = subprocess.run(["git", "ls-files", "--cached", "--others",
                            "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    pattern = re.compile(r"\.\./shared\b|parent\s*/\s*[\"']shared[\"']")
    found = [f for f in files if (ROOT / f).suffix in {".py", ".sh", ".yml", ".yaml", ".cfg",
                                                       ".toml", ""}
             and (ROOT / f).is_file() and pattern.search((ROOT / f).read_text(errors="replace"))]
    assert found == []


def test_vendored_data_name_source_and_licence() -> None:
    folders = sorted({p.parent for p in DATA.rglob("*") if p.is_file()})
    assert len(folders) >= 3  # Kueue CRDs, GPU Operator chart, Alibaba trace
    for folder in folders:
        note = (folder / "SOURCE.md").read_text()
        assert re.search(r"[Ll]icen[cs]", note), f"{folder}: SOURCE.md names no licence"
        assert "Vendored into gpupool" in note
