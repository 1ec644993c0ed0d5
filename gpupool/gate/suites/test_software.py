"""Software checks: every package of the software lock at its pinned version, and held."""

from __future__ import annotations

import pytest

from gpupool.gate.actions import Action
from gpupool.gate.expect import NodeExpect
from gpupool.gate.plugin import Measure

# How each locked component shows up among a Debian host's packages: which installed
# packages belong to it (by source or name) and how their version carries the lock.
# cuda, nccl and the GPU operator live in containers and the cluster, not on the host.
COMPONENT_PACKAGES = {
    "nvidia_driver": {"sources": {"nvidia-graphics-drivers"}, "names": set()},
    "container_toolkit": {"sources": set(), "names": {"nvidia-container-toolkit"}},
    "dcgm": {"sources": set(), "names": {"datacenter-gpu-manager"}},
    "slurm": {"sources": {"slurm-wlm"}, "names": set()},
}
GPU_ONLY = {"nvidia_driver", "container_toolkit", "dcgm"}


@pytest.fixture(scope="module")
def packages(host) -> dict[str, tuple[str, str]]:  # type: ignore[no-untyped-def]
    """name -> (version, source) of installed packages."""
    out = host.check_output(
        "dpkg-query -W -f='${db:Status-Abbrev}|${Package}|${Version}|${source:Package}\\n'")
    pkgs = {}
    for line in out.splitlines():
        status, name, version, source = line.split("|")
        if status.startswith("ii"):
            pkgs[name] = (version, source)
    return pkgs


@pytest.fixture(scope="module")
def held(host) -> set[str]:  # type: ignore[no-untyped-def]
    return set(host.check_output("apt-mark showhold").split())


def _version_matches(version: str, locked: str) -> bool:
    upstream = version.split(":", 1)[-1]  # drop an epoch
    return upstream == locked or upstream.startswith((f"{locked}-", f"{locked}~", f"{locked}+"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "component" in metafunc.fixturenames:
        metafunc.parametrize("component", sorted(COMPONENT_PACKAGES))


@pytest.mark.action(Action.RECONFIGURE)
def test_locked_version_held(component: str, expect: NodeExpect,  # type: ignore[no-untyped-def]
                             packages: dict[str, tuple[str, str]], held: set[str],
                             measure: Measure) -> None:
    if component in GPU_ONLY and expect.gpu is None:
        pytest.skip("not a GPU node")
    spec = COMPONENT_PACKAGES[component]
    mine = {n: v for n, (v, src) in packages.items()
            if n in spec["names"] or src in spec["sources"]}
    locked = expect.software[component]
    wrong = {n: v for n, v in mine.items() if not _version_matches(v, locked)}
    unheld = sorted(n for n in mine if n not in held)
    measure({"installed": mine, "wrong_version": wrong, "not_held": unheld},
            {"version": locked, "held": True},
            bool(mine) and not wrong and not unheld,
            f"{component}: installed {mine or 'nothing'}, wrong {wrong}, not held {unheld}")
