"""GPU detection in Slurm: whether the NVML plugin (gpu_nvml.so, what gres.conf's
`AutoDetect=nvml` loads) can be installed beside the locked Slurm.

Debian ships the plugin apart from Slurm's other plugins, in contrib's
slurm-wlm-nvml-plugin, whose Depends pins the Slurm builds it was made for. The facts (per
suite: the Slurm build main carries, the plugin's version and what its Depends admits) are
vendored data (gpupool/data/slurm-gpu-detection/nvml-plugin.yaml, its sources in
SOURCE.md), never typed here.

The lock and the plugin are resolved together: the suite is the one whose main carries
the locked upstream Slurm version; the Slurm build installed is the lock itself where it
names a Debian revision, else the build that suite carries (what the slurm role's apt pin
`<lock>*` takes); the plugin is installable when its Depends admits that build. Where it is
not, gres.conf names every GPU's device file instead (gpupool/render/slurm.py) and a MIG
layout cannot be described to Slurm at all (rule `mig-needs-nvml`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml

from gpupool.paths import DATA
from gpupool.spec import floors, os_release
from gpupool.spec.model import Description

DATA_FILE = DATA / "slurm-gpu-detection" / "nvml-plugin.yaml"

_OPERATORS: dict[str, Callable[[int, int], bool]] = {
    "=": operator.eq, ">=": operator.ge, "<=": operator.le, ">>": operator.gt, "<<": operator.lt}


@dataclass(frozen=True)
class Suite:
    codename: str
    debian: str
    slurm: str  # slurm-wlm-basic-plugins in the suite's main (and its security suite)
    plugin: str  # slurm-wlm-nvml-plugin in its contrib
    requires: tuple[tuple[str, str], ...]  # the plugin's Depends on depends_on
    links_nvml: bool

    def admits(self, slurm: str) -> bool:
        """Whether the plugin's Depends admits Slurm build `slurm` (dpkg's comparison)."""
        return all(_OPERATORS[op](floors.compare(slurm, v), 0) for op, v in self.requires)

    @property
    def depends(self) -> str:
        return ", ".join(f"{plugin_facts()['depends_on']} ({op} {v})" for op, v in self.requires)


@cache
def plugin_facts() -> dict[str, Any]:
    return yaml.safe_load(DATA_FILE.read_text())


@cache
def suites() -> tuple[Suite, ...]:
    return tuple(
        Suite(name, str(s["debian"]), str(s["slurm"]), str(s["plugin"]),
              tuple((str(op), str(v)) for op, v in s["requires"]), bool(s["links_nvml"]))
        for name, s in plugin_facts()["suites"].items())


@dataclass(frozen=True)
class Detection:
    """How slurmd finds a node's GPUs with this Slurm lock."""

    lock: str
    suite: Suite | None  # the Debian suite carrying the locked Slurm; None: none known
    installed: str | None  # the Slurm build apt installs for the lock
    available: bool  # the NVML plugin can be installed beside it
    reason: str  # in words, for validate, gres.conf's comment and the role

    @property
    def package(self) -> str:
        return str(plugin_facts()["package"])

    @property
    def plugin_version(self) -> str | None:
        return self.suite.plugin if self.available and self.suite else None

    def plan(self) -> dict[str, Any]:
        """What the slurm role needs: the plugin to install (None: none) and why."""
        return {"autodetect": "nvml" if self.available else "off",
                "plugin_package": self.package if self.available else None,
                "plugin_version": self.plugin_version,
                "suite": self.suite.codename if self.suite else None,
                "installed_slurm": self.installed,
                "reason": self.reason}


def _fixed_builds(suite: Suite) -> list[str]:
    """The plugin's own exact Slurm builds (its `=` dependencies) that are below the floor."""
    return [v for op, v in suite.requires
            if op == "=" and floors.check("slurm", v) is not None]


def resolve(lock: str) -> Detection:
    """The suite, installed Slurm build and NVML plugin for a Slurm lock. A lock that is
    no version raises floors.VersionError (rule version-comparable reports it)."""
    v = floors.parse(lock)
    facts = plugin_facts()
    where = f"{facts['package']} ({facts['component']})"
    for suite in suites():
        carried = floors.parse(suite.slurm)
        if (carried.epoch, carried.upstream) != (v.epoch, v.upstream):
            continue
        installed = lock if v.revision else suite.slurm
        name = f"Debian {suite.debian} ({suite.codename})"
        if suite.admits(installed):
            return Detection(lock, suite, installed, True,
                             f"{name}: {where} {suite.plugin} depends on {suite.depends}, "
                             f"which Slurm {installed} satisfies")
        below = _fixed_builds(suite)
        fixed = (f"; {', '.join(below)} is below Slurm's version floor "
                 "(gpupool/data/version-floors), so on "
                 f"{name} NVML autodetection cannot be installed with a fixed Slurm"
                 if below else "")
        return Detection(lock, suite, installed, False,
                         f"{name}: {where} {suite.plugin} depends on {suite.depends}, "
                         f"which the locked Slurm {installed} does not satisfy{fixed}")
    known = ", ".join(f"{s.codename} {s.slurm}" for s in suites())
    return Detection(lock, None, None, False,
                     f"no Debian suite gpupool knows carries Slurm {v.upstream} ({known}; "
                     "gpupool/data/slurm-gpu-detection): no build of the NVML plugin is "
                     "known to fit it")


def for_lock(lock: str) -> Detection | None:
    """resolve(), or None for a lock that is no version."""
    try:
        return resolve(lock)
    except floors.VersionError:
        return None


def notice(desc: Description) -> str | None:
    """What `gpupool validate` should say of a valid production description whose GPU
    nodes get no NVML autodetection (their gres.conf names each device file instead); None
    where NVML is installable, for a lab (fixture devices) or a pool without GPUs."""
    if desc.pool.environment != "production":
        return None
    gpus = any(c.gpu is not None for c in desc.node_classes.values()) or bool(
        desc.burst_groups)
    detection = for_lock(os_release.slurm_lock(desc))
    if not gpus or detection is None or detection.available:
        return None
    return (f"GPU detection: {detection.reason}. gres.conf names each GPU's device file "
            "(AutoDetect=off), so slurmd counts device files, not GPUs NVML has seen; "
            "the acceptance gate's slurm and gpu suites check what is there")
