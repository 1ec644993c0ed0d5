"""The gate admits only the releases the roles and the gate are proven on (Debian 12 and 13),
and of those the one the node's class declares; it refuses any other with a message naming
it and the supported releases. The check runs as the gate runs it: testinfra's own
SystemInfo reads each os-release file in tests/gate/fixtures (README there: the Debian 12
and 13 ones recorded, the Ubuntu 22.04 and Rocky Linux 9 ones copied from those releases'
published files, since no such host is reachable here)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from testinfra.modules.systeminfo import SystemInfo

from gpupool.gate.actions import Action
from gpupool.gate.suites import test_system as system_suite

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


def check(fixture: str, declared: str = "") -> dict[str, Any]:
    """The suite's OS check on a host with that os-release, whose class declares `declared`
    (none: ""): what it measured."""
    seen: dict[str, Any] = {}

    def measure(value: Any, expected: Any, ok: bool, message: str = "",
                action: str | None = None) -> None:
        seen.update(value=value, expected=expected, ok=ok, message=message)

    system_suite.test_os_supported(OsReleaseHost((FIXTURES / fixture).read_text()),
                                   SimpleNamespace(os=declared), measure)
    return seen


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
