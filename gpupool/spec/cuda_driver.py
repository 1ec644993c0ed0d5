"""CUDA toolkit releases and the oldest NVIDIA driver each needs: whether an environment
image's CUDA user-space release runs on the pool's locked driver.

The table is vendored data (gpupool/data/cuda-driver/toolkit-drivers.yaml, its sources in
SOURCE.md): NVIDIA's release notes give, for each toolkit release, the Linux driver its
toolkit needs. The rule holds an image to that column rather than to the looser
minor-version compatibility floor (a 12.x application runs on any driver >= 525 "with
limited feature-set"): which features a job's code uses is not something the description
knows, and a job that JIT-compiles PTX for its release fails on the older driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import yaml

from gpupool.paths import DATA
from gpupool.spec import floors

TABLE_FILE = DATA / "cuda-driver" / "toolkit-drivers.yaml"


@dataclass(frozen=True)
class Release:
    toolkit: str  # X.Y.Z: "Update N" of X.Y is X.Y.N
    label: str  # as NVIDIA's table names it: "CUDA 12.4 Update 1"
    driver: str  # the oldest Linux x86_64 driver it needs


@cache
def releases() -> dict[str, Release]:
    data = yaml.safe_load(TABLE_FILE.read_text())
    return {str(r["toolkit"]): Release(str(r["toolkit"]), r["label"], str(r["driver"]))
            for r in data["releases"]}


def release(cuda: str) -> Release | None:
    """The table's row for a declared CUDA release ("12.4" is 12.4 GA, 12.4.0), or None."""
    parts = cuda.split(".")
    return releases().get(".".join(parts + ["0"] * (3 - len(parts))))


def runs_on(row: Release, driver: str) -> bool:
    """Whether the locked driver is at least the release's; a driver lock Debian's
    comparison cannot read counts as too old (rule version-comparable names it)."""
    try:
        return floors.compare(driver, row.driver) >= 0
    except floors.VersionError:
        return False
