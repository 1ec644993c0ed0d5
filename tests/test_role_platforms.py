"""Every role claims exactly the releases it is proven on, and so does the gate, so a claim
cannot creep back. PROVEN is the one place that says what is proven, and why."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpupool.gate.suites import test_system as system_suite
from gpupool.lab import hosts
from gpupool.spec import os_release

ROOT = Path(__file__).resolve().parents[1]
ROLES = sorted(p.parent.parent for p in (ROOT / "roles").glob("*/meta/main.yml"))

# What is proven, as a role's meta platforms names it. The lab builds its hosts from a
# Debian 12 (bookworm) or a Debian 13 (trixie) image, per its node classes' `os`
# (gpupool/lab/hosts.py, base_recipe): `make lab` converges every role and gates every node
# on Debian 12, and the suite's Debian 13 lab converges, re-runs and gates a controller and
# a GPU node (tests/integration/test_debian13_lab.py). The lab builds and boots the burst
# image from the controllers' release (the cloud build names that release's AMI but has
# never run on AWS). No Ubuntu, RHEL or other host is reachable from this machine, so
# nothing else is claimed.
PROVEN = [{"name": "Debian", "versions": ["bookworm", "trixie"]}]
# The same releases as the gate names them: os-release's ID and VERSION_ID's major.
PROVEN_OS_RELEASE = {("debian", "12"), ("debian", "13")}


def test_the_lab_is_the_proven_release() -> None:
    assert [{"name": "Debian", "versions": [
        hosts.base_recipe(r).suite for r in os_release.PROVEN]}] == PROVEN


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_role_platforms_are_the_proven_releases(role: Path) -> None:
    meta = yaml.safe_load((role / "meta" / "main.yml").read_text())
    assert meta["galaxy_info"]["platforms"] == PROVEN


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_no_per_os_vars_beyond_the_proven_family(role: Path) -> None:
    """Roles load vars/<os_family>.yml: one for Debian, none for a family nothing proves."""
    per_os = {p.stem for p in (role / "vars").glob("*.yml")} - {"main"}
    assert per_os <= {"Debian"}, sorted(per_os)


def test_the_gate_admits_the_proven_releases_only() -> None:
    assert set(system_suite.SUPPORTED_OS) == PROVEN_OS_RELEASE


def test_validate_names_the_proven_releases() -> None:
    """validate's notice of unproven releases (gpupool/spec/os_release.py) names the same
    releases the gate admits."""
    assert {tuple(r.value.split("-")) for r in os_release.PROVEN} == PROVEN_OS_RELEASE
