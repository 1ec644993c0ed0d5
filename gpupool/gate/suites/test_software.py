"""Software checks: every package of the software lock at its pinned version, and held;
the container runtime leaves the choice of GPUs to the scheduler; the declared environment
images come from the pool's registry into bundles a job can open."""

from __future__ import annotations

import json
import tomllib

import pytest

from gpupool.gate.actions import Action
from gpupool.gate.expect import NodeExpect
from gpupool.gate.plugin import Measure
from gpupool.spec.packages import COMPONENT_PACKAGES, GPU_ONLY

# COMPONENT_PACKAGES (how each locked component shows up among a Debian host's packages)
# and GPU_ONLY: their one owner is gpupool/spec/packages.py, against which the roles' and
# playbooks' YAML copies are checked (tests/test_component_packages.py).

# Role nvidia_container_toolkit's settings that keep GPU selection with Slurm and the
# kubelet: an unprivileged container may not pick GPUs through NVIDIA_VISIBLE_DEVICES
# (an environment variable any image or user sets), only through what the runtime's caller
# mounts. A node edited by hand, or converged by an older role, fails here.
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
TOOLKIT_SETTINGS = {"accept-nvidia-visible-devices-envvar-when-unprivileged": False,
                    "accept-nvidia-visible-devices-as-volume-mounts": True}


@pytest.fixture(scope="module")
def packages(host) -> dict[str, tuple[str, str]]:  # type: ignore[no-untyped-def]
    """name -> (version, source) of installed packages."""
    out = host.check_output(
        "dpkg-query -W -f='${db:Status-Abbrev}|${Package}|${Version}|${source:Package}\\n'")
    pkgs = {}
    for line in out.splitlines():
        status, name, version, source = line.split("|")
        if status[1:2] == "i":  # installed, whatever the selection (held shows "hi")
            pkgs[name] = (version, source or name)
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
    mine = {n: v for n, (v, src) in packages.items() if src == spec.source}
    primary = sorted(spec.primary & set(mine))
    locked = expect.software[component]
    wrong = {n: v for n, v in mine.items() if not _version_matches(v, locked)}
    unheld = [n for n in primary if n not in held]
    measure({"primary": primary, "wrong_version": wrong, "not_held": unheld},
            {"version": locked, "primary_held": True},
            bool(primary) and not wrong and not unheld,
            f"{component}: primary packages {primary or 'none installed'}, wrong versions "
            f"{wrong}, not held {unheld}")


@pytest.mark.action(Action.RECONFIGURE)
def test_containers_cannot_choose_their_gpus(host, expect: NodeExpect,  # type: ignore[no-untyped-def]
                                            measure: Measure) -> None:
    if expect.gpu is None:
        pytest.skip("not a GPU node")
    config = host.file(TOOLKIT_CONFIG)
    try:
        settings = tomllib.loads(config.content_string) if config.exists else {}
        problem = "" if config.exists else f"{TOOLKIT_CONFIG} is missing"
    except tomllib.TOMLDecodeError as exc:
        settings, problem = {}, f"{TOOLKIT_CONFIG} is not TOML: {exc}"
    got = {key: settings.get(key) for key in TOOLKIT_SETTINGS}
    measure(got, TOOLKIT_SETTINGS, got == TOOLKIT_SETTINGS,
            problem or f"{TOOLKIT_CONFIG}: {got}, expected {TOOLKIT_SETTINGS}")



# Role image_registry's pull program on a compute node (gpupool/onhost/image_pull.py).
IMAGE_PULL = "gpupool-image-pull"


@pytest.mark.action(Action.RECONFIGURE)
def test_declared_images_pull(host, expect: NodeExpect,  # type: ignore[no-untyped-def]
                              measure: Measure) -> None:
    """Every declared image comes from the pool's registry into a bundle with its
    config.json and rootfs (a version already there is kept, so a re-gate costs nothing).
    An image the registry answers it does not have is declared but not pushed yet: no
    node could run it, and holding every node out until the first push would keep a new
    pool from starting, so that alone skips. A registry the node cannot reach, trust or
    log in to fails."""
    if not expect.images:
        pytest.skip("no image registry declared, or not a compute node")
    run = host.run(f"{IMAGE_PULL} --json --all")
    states = {}
    for line in run.stdout.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("image"), str):
            states[item["image"]] = item
    got = {i: states.get(i, {}).get("state", "missing") for i in expect.images}
    if set(got.values()) == {"absent"}:
        pytest.skip(f"declared, not in the registry yet: {', '.join(expect.images)}")
    broken = {i: states.get(i, {}).get("detail") or run.stderr.strip()[-200:]
              for i, state in got.items() if state not in ("pulled", "cached", "absent")}
    unpacked = {i: host.file(f"{states[i]['detail']}/config.json").exists
                and host.file(f"{states[i]['detail']}/rootfs").is_directory
                for i, state in got.items() if state in ("pulled", "cached")}
    measure(got, {i: "pulled or cached" for i in expect.images},
            not broken and all(unpacked.values()),
            f"images not pulled: {broken}" if broken
            else f"bundles without config.json or rootfs: "
                 f"{[i for i, ok in unpacked.items() if not ok]}")
