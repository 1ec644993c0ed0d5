"""The gate admits only the releases the roles and the gate are proven on (Debian 12 and 13),
and of those the one the node's class declares (a burst node: the one its image was built
on, as its facts name it); it refuses any other with a message naming
it and the supported releases. The check runs as the gate runs it: testinfra's own
SystemInfo reads each os-release file in tests/gate/fixtures (README there: the Debian 12
and 13 ones recorded, the Ubuntu 22.04 and Rocky Linux 9 ones copied from those releases'
published files, since no such host is reachable here)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from testinfra.modules.systeminfo import SystemInfo

from gpupool.gate.actions import Action
from gpupool.gate.expect import NodeExpect, burst_expect
from gpupool.gate.suites import test_system as system_suite
from gpupool.render.cloud import launch
from gpupool.spec import loader
from tests.conftest import ROOT

FIXTURES = Path(__file__).parent / "fixtures"


class OsReleaseHost:
    """A Linux host that answers the commands SystemInfo runs from one os-release file."""

    def __init__(self, os_release: str) -> None:
        self.answers = {"uname -s": "Linux\n", "uname -m": "x86_64\n",
                        "cat /etc/os-release": os_release}
        self.system_info = SystemInfo.get_module(self)

    def run(self, command: str) -> SimpleNamespace:
        out = self.answers.get(command)
        return SimpleNamespace(rc=0 if out is not None else 1, stdout=out or "")

    def run_expect(self, _codes: list[int], command: str) -> SimpleNamespace:
        return self.run(command)

    def check_output(self, command: str) -> str:
        return self.run(command).stdout.strip()


def check(fixture: str, declared: str = "", expect: NodeExpect | None = None) -> dict[str, Any]:
    """The suite's OS check on a host with that os-release, whose class declares `declared`
    (none: ""), or with that whole expectation: what it measured."""
    seen: dict[str, Any] = {}

    def measure(value: Any, expected: Any, ok: bool, message: str = "",
                action: str | None = None) -> None:
        seen.update(value=value, expected=expected, ok=ok, message=message)

    system_suite.test_os_supported(OsReleaseHost((FIXTURES / fixture).read_text()),
                                   expect or SimpleNamespace(os=declared), measure)
    return seen


def burst_node(release: str | None) -> NodeExpect:
    """A lab burst node's expectation from the facts its user-data writes, naming the image's
    release `release` (None: facts of an older user-data, without the key)."""
    desc = loader.load_stack("lab", ROOT)
    name, group = next(iter(desc.burst_groups.items()))
    facts = json.loads(json.dumps(launch.burst_facts(desc, name, group)))
    if release is None:
        del facts["os"]
    else:
        facts["os"] = release
    return burst_expect(facts, "l4-burst-1")


SUPPORTED = ["Debian 12 (bookworm)", "Debian 13 (trixie)"]


@pytest.mark.parametrize(("fixture", "version", "codename", "declared"), [
    ("os-release-debian12.recorded", "12", "bookworm", "debian-12"),
    ("os-release-debian13.recorded", "13", "trixie", "debian-13"),
    ("os-release-debian13.recorded", "13", "trixie", ""),  # a burst node: none declared
])
def test_the_proven_releases_are_admitted(fixture: str, version: str, codename: str,
                                          declared: str) -> None:
    seen = check(fixture, declared)
    assert seen["ok"], seen["message"]
    assert seen["value"] == {"id": "debian", "version_id": version, "codename": codename}
    assert seen["expected"] == SUPPORTED


@pytest.mark.parametrize(("fixture", "declared", "named"), [
    ("os-release-debian12.recorded", "debian-13", "debian 12 (bookworm)"),
    ("os-release-debian13.recorded", "debian-12", "debian 13 (trixie)"),
])
def test_a_node_on_another_release_than_its_class_declares_is_refused(
        fixture: str, declared: str, named: str) -> None:
    """Its packages are locked for the declared release: a Debian 12 node in a Debian 13
    class would install 13's lock, or fail to; its Slurm may not talk to the controllers."""
    seen = check(fixture, declared)
    assert not seen["ok"]
    assert seen["message"] == (f"{named} is not the release its class declares ({declared}); "
                               f"reinstall the node with {declared}, or declare the class's os")


@pytest.mark.parametrize(("fixture", "image", "named"), [
    ("os-release-debian12.recorded", "debian-13", "debian 12 (bookworm)"),
    ("os-release-debian13.recorded", "debian-12", "debian 13 (trixie)"),
])
def test_a_burst_node_booted_from_another_release_than_its_facts_name_is_refused(
        fixture: str, image: str, named: str) -> None:
    """The facts name the release the burst image was built on (the controllers'); an
    instance that boots another (an image pinned from before the controllers moved) carries
    another release's Slurm and is kept out, as an on-prem node of the wrong release is."""
    seen = check(fixture, expect=burst_node(image))
    assert not seen["ok"]
    assert seen["message"] == (f"{named} is not the release its class declares ({image}); "
                               f"reinstall the node with {image}, or declare the class's os")


@pytest.mark.parametrize(("fixture", "image"), [
    ("os-release-debian12.recorded", "debian-12"),
    ("os-release-debian13.recorded", "debian-13"),
    # Facts of an older user-data name no release: the supported list alone, as before.
    ("os-release-debian12.recorded", None),
    ("os-release-debian13.recorded", None),
])
def test_a_burst_node_on_its_images_release_is_admitted(fixture: str,
                                                        image: str | None) -> None:
    seen = check(fixture, expect=burst_node(image))
    assert seen["ok"], seen["message"]


def test_a_burst_node_without_a_release_still_refuses_an_unsupported_one() -> None:
    seen = check("os-release-ubuntu2204", expect=burst_node(None))
    assert not seen["ok"] and "is not a supported release" in seen["message"]


@pytest.mark.parametrize(("fixture", "named"), [
    ("os-release-ubuntu2204", "ubuntu 22.04 (jammy)"),
    ("os-release-rocky9", "rocky 9.3"),
])
def test_other_releases_are_refused_naming_the_supported_ones(fixture: str, named: str) -> None:
    seen = check(fixture, "debian-12")
    assert not seen["ok"]
    assert seen["message"] == (
        f"{named} is not a supported release: the roles and the gate are proven on "
        "Debian 12 (bookworm), Debian 13 (trixie) only; reinstall the node with it")


@pytest.mark.parametrize(("distribution", "release"), [
    ("debian", "11"), ("debian", "14"), ("debian", None), (None, None), ("rhel", "9.4"),
    ("almalinux", "9.4"), ("ubuntu", "24.04"), ("Ubuntu", "12"), ("debian", "12abc"),
])
def test_nothing_else_is_admitted(distribution: str | None, release: str | None) -> None:
    ok, message = system_suite.os_verdict(distribution, release)
    assert not ok and "proven on Debian 12 (bookworm), Debian 13 (trixie) only" in message


def test_an_unsupported_os_keeps_the_node_out() -> None:
    """Re-running the roles cannot change the OS, so the advice is not `reconfigure`."""
    mark = system_suite.test_os_supported.pytestmark  # type: ignore[attr-defined]
    assert [m.args[0] for m in mark if m.name == "action"] == [Action.ISOLATE]
