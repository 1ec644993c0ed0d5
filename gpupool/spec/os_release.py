"""Debian releases a pool's nodes run, the lock each release gets, and whether the Slurm
releases that follow can talk to each other.

A node class names its Debian release (`node_classes.<class>.os`); each release's archive
carries its own Slurm and drivers, so a node's lock is `software` with its release's entry
of `software.per_release` in place. Slurm's daemons talk across a bounded window of major
releases (vendored: gpupool/data/slurm-releases, from SchedMD's upgrade guide): a
slurmctld accepts slurmd and commands of its own major and a few before it, never a newer
one. Debian 12 carries Slurm 22.05 and Debian 13 24.11, four majors apart, so a pool of
both cannot share controllers; validate says so (rules `slurm-release-window`,
`slurm-controllers-agree`) rather than the first slurmd failing to register.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml

from gpupool.paths import DATA
from gpupool.spec import floors
from gpupool.spec.model import DEFAULT_RELEASE, Description, NodeRole, OsRelease

RELEASES_FILE = DATA / "slurm-releases" / "releases.yaml"


def lock(desc: Description, release: OsRelease | None = None) -> dict[str, Any]:
    """The software lock a node of `release` installs, as the roles read it
    (`gpupool_software`, blocklist included): the pool's, with the release's own versions
    in place; release None: the pool's alone."""
    locked = desc.software.model_dump(mode="json", exclude={"per_release"})
    own = desc.software.per_release.get(release) if release else None
    if own is not None:
        locked.update(own.model_dump(mode="json", exclude_none=True))
    return locked


def versions(desc: Description, release: OsRelease) -> dict[str, str]:
    """Component -> the version a node of `release` installs (what the gate expects)."""
    return {k: v for k, v in lock(desc, release).items() if k != "blocklist"}


def lock_path(desc: Description, release: OsRelease, component: str) -> str:
    """Where the description declares the version of `component` that nodes of `release`
    install: the release's own entry of software.per_release, else the pool's."""
    own = desc.software.per_release.get(release)
    if own is not None and getattr(own, component) is not None:
        return f"software.per_release.{release.value}.{component}"
    return f"software.{component}"


def locked_versions(desc: Description) -> Iterator[tuple[str, str, str]]:
    """(path, component, version) for each version the lock names, blocklist aside: the
    pool's, then each release's own (software.per_release)."""
    for component, version in desc.software.model_dump(
            mode="json", exclude={"blocklist", "per_release"}).items():
        yield f"software.{component}", component, version
    for release, own in desc.software.per_release.items():
        for component, version in own.model_dump(mode="json", exclude_none=True).items():
            yield f"software.per_release.{release.value}.{component}", component, version


def releases_in_use(desc: Description) -> list[OsRelease]:
    """The releases some declared node runs, in the enum's order."""
    used = {desc.node_classes[n.class_].os for n in desc.nodes.values()
            if n.class_ in desc.node_classes}
    return [r for r in OsRelease if r in used]


@cache
def _facts() -> dict[str, Any]:
    with RELEASES_FILE.open() as f:
        data: dict[str, Any] = yaml.safe_load(f)
    return data


def majors() -> tuple[str, ...]:
    return tuple(str(m) for m in _facts()["majors"])


def major(version: str) -> str:
    """Slurm's major release ("22.05") of a lock; floors.VersionError if it is no version."""
    upstream = floors.parse(version).upstream
    return ".".join(upstream.split(".")[:2])


def accepts(controller_major: str) -> int:
    """How many majors before its own a slurmctld of `controller_major` accepts."""
    known = majors()
    at = known.index(controller_major)
    listed = {str(k): int(v) for k, v in _facts()["accepts"].items()}
    return next(listed[m] for m in reversed(known[:at + 1]) if m in listed)


@dataclass(frozen=True)
class Window:
    """Whether a slurmd of `node` can register with a slurmctld of `controller`."""

    controller: str  # majors
    node: str
    ok: bool
    reason: str


def window(controller: str, node: str) -> Window | None:
    """The verdict for two Slurm majors; None where either is not a major gpupool knows
    (a lock outside the table is not guessed at)."""
    known = majors()
    if controller not in known or node not in known:
        return None
    gap = known.index(controller) - known.index(node)
    span = accepts(controller)
    if gap < 0:
        return Window(controller, node, False,
                      f"a slurmd of Slurm {node} is newer than the controllers' {controller}; "
                      "Slurm's daemons never accept a newer release")
    if gap > span:
        between = ", ".join(known[known.index(node) + 1:known.index(controller)])
        return Window(controller, node, False,
                      f"Slurm {controller} accepts daemons of its own major and the "
                      f"{span} before it; {node} is {gap} majors older (between them: "
                      f"{between}), so its slurmd cannot register; run one release on "
                      "every node, or upgrade through the majors between")
    return Window(controller, node, True, f"Slurm {controller} accepts {node}")


def controller_releases(desc: Description) -> list[OsRelease]:
    """The releases the controllers run (every Slurm daemon answers to theirs)."""
    used = {desc.node_classes[n.class_].os for n in desc.nodes.values()
            if NodeRole.CONTROLLER in n.roles and n.class_ in desc.node_classes}
    return [r for r in OsRelease if r in used]


# The releases gpupool's roles are converged, re-run and gated on in its lab; the gate's
# OS check admits these alone (tests/test_role_platforms.py ties the two together).
PROVEN = (OsRelease.DEBIAN_12, OsRelease.DEBIAN_13)


def notice(desc: Description) -> str | None:
    """What `gpupool validate` says of a valid description with nodes on a release the lab
    has not proven: the roles may work there, the gate will not admit them."""
    unproven = [r.value for r in releases_in_use(desc) if r not in PROVEN]
    if not unproven:
        return None
    return (f"nodes on {', '.join(unproven)}: gpupool's roles and acceptance gate are "
            f"proven on {', '.join(r.value for r in PROVEN)} only, and the gate refuses "
            "any other release until its lab proves it")


def slurm_lock(desc: Description) -> str:
    """The Slurm the pool's daemons run, for what is chosen once for the whole cluster
    (gres.conf's autodetection, the NVML plugin): the lock of the controllers' release,
    which every slurmd of the pool is one they accept. Not `software.slurm` alone: a
    release's own entry of `software.per_release` replaces it on that release's nodes."""
    return versions(desc, burst_release(desc))["slurm"]


def burst_release(desc: Description) -> OsRelease:
    """The release burst nodes run: the controllers' (a burst slurmd registers with them,
    and one release's Slurm is the one certain to be accepted); the default release where
    no controller is declared yet."""
    return next(iter(controller_releases(desc)), DEFAULT_RELEASE)
