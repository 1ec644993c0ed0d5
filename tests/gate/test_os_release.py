"""The gate admits only the release the roles and the gate are proven on (Debian 12) and
refuses any other with a message naming it and the supported release. The check runs as the
gate runs it: testinfra's own SystemInfo reads each os-release file in tests/gate/fixtures
(README there: the Debian 12 one recorded, the Ubuntu 22.04 and Rocky Linux 9 ones copied
from those releases' published files, since no such host is reachable here)."""

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


def check(fixture: str) -> dict[str, Any]:
    """The suite's OS check on a host with that os-release: what it measured."""
    seen: dict[str, Any] = {}

    def measure(value: Any, expected: Any, ok: bool, message: str = "",
                action: str | None = None) -> None:
        seen.update(value=value, expected=expected, ok=ok, message=message)

    system_suite.test_os_supported(OsReleaseHost((FIXTURES / fixture).read_text()), measure)
    return seen


def test_debian_12_is_admitted() -> None:
    seen = check("os-release-debian12.recorded")
    assert seen["ok"], seen["message"]
    assert seen["value"] == {"id": "debian", "version_id": "12", "codename": "bookworm"}
    assert seen["expected"] == ["Debian 12 (bookworm)"]


@pytest.mark.parametrize(("fixture", "named"), [
    ("os-release-ubuntu2204", "ubuntu 22.04 (jammy)"),
    ("os-release-rocky9", "rocky 9.3"),
])
def test_other_releases_are_refused_naming_the_supported_one(fixture: str, named: str) -> None:
    seen = check(fixture)
    assert not seen["ok"]
    assert seen["message"] == (
        f"{named} is not a supported release: the roles and the gate are proven on "
        "Debian 12 (bookworm) only; reinstall the node with it")


@pytest.mark.parametrize(("distribution", "release"), [
    ("debian", "13"), ("debian", None), (None, None), ("rhel", "9.4"), ("almalinux", "9.4"),
    ("ubuntu", "24.04"),
])
def test_nothing_else_is_admitted(distribution: str | None, release: str | None) -> None:
    ok, message = system_suite.os_verdict(distribution, release)
    assert not ok and "proven on Debian 12 (bookworm) only" in message


def test_an_unsupported_os_keeps_the_node_out() -> None:
    """Re-running the roles cannot change the OS, so the advice is not `reconfigure`."""
    mark = system_suite.test_os_supported.pytestmark  # type: ignore[attr-defined]
    assert [m.args[0] for m in mark if m.name == "action"] == [Action.ISOLATE]
