"""Node classes name their Debian release; each release gets its own lock where its
archive differs, and validate refuses a pool whose Slurm releases cannot talk (issue 53):
Debian 12 carries Slurm 22.05, Debian 13 24.11, four majors apart.

Before this, every node was implicitly Debian 12 while the example locked Slurm 24.11.5,
which only Debian 13 carries (apt on its nodes would have found no such version); the
tests below fail on that code (no `os`, no rule)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpupool import cli
from gpupool.gate.expect import node_expect
from gpupool.render import ansible_yaml, inventory
from gpupool.spec import loader, os_release
from gpupool.spec.errors import DescriptionError
from gpupool.spec.model import OsRelease
from policies.cluster import software_pinned
from tests.conftest import ROOT, raw_stack
from tests.test_inventory import _resolved

BOOKWORM_SLURM = "22.05.8-4+deb12u3"
TRIXIE_SLURM = "24.11.5-4+deb13u1"


def _problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(DescriptionError) as info:
        loader.parse(raw)
    return [(p.path, p.rule) for p in info.value.problems]


def _mixed_lab(controller_os: str, compute_os: str) -> dict[str, Any]:
    """The lab with its controllers' class on one release and its GPU class on another,
    each release's Slurm locked as its archive carries it."""
    raw = raw_stack("lab")
    raw["node_classes"]["ctl"]["os"] = controller_os
    raw["node_classes"]["lab-l4"]["os"] = compute_os
    raw["software"]["slurm"] = BOOKWORM_SLURM
    raw["software"]["per_release"] = {"debian-13": {"slurm": TRIXIE_SLURM}}
    return raw


@pytest.mark.parametrize(("controller", "node", "ok"), [
    ("24.11", "24.11", True), ("24.11", "23.02", True),  # 24.11 accepts three before it
    ("24.11", "22.05", False), ("24.05", "23.02", True), ("24.05", "22.05", False),
    ("22.05", "20.11", True), ("22.05", "20.02", False), ("22.05", "24.11", False),
    ("25.11", "24.05", True), ("25.11", "23.11", False)])
def test_slurm_s_compatibility_window(controller: str, node: str, ok: bool) -> None:
    verdict = os_release.window(controller, node)
    assert verdict is not None and verdict.ok is ok, verdict


def test_a_major_outside_the_table_is_not_guessed_at() -> None:
    assert os_release.window("24.11", "19.05") is None
    assert os_release.window("99.05", "24.11") is None


def test_the_vendored_majors_are_in_order_and_carry_debian_s_slurm() -> None:
    majors = os_release.majors()
    assert list(majors) == sorted(majors, key=lambda m: tuple(map(int, m.split("."))))
    assert {os_release.major(BOOKWORM_SLURM), os_release.major(TRIXIE_SLURM)} <= set(majors)


def test_a_pool_of_debian_12_and_13_is_refused_either_way_round() -> None:
    """Controllers on 13 (24.11) cannot take 12's slurmd (22.05, four majors back);
    controllers on 12 cannot take 13's (newer)."""
    assert _problems(_mixed_lab("debian-13", "debian-12")) == [
        ("node_classes.lab-l4.os", "slurm-release-window")]
    assert _problems(_mixed_lab("debian-12", "debian-13")) == [
        ("node_classes.lab-l4.os", "slurm-release-window")]
    with pytest.raises(DescriptionError) as info:
        loader.parse(_mixed_lab("debian-13", "debian-12"))
    message = info.value.problems[0].message
    assert "24.11 accepts daemons of its own major and the 3 before it" in message
    assert "23.02, 23.11, 24.05" in message


def test_one_release_everywhere_is_valid_with_its_own_slurm() -> None:
    desc = loader.parse(_mixed_lab("debian-13", "debian-13"))
    assert os_release.releases_in_use(desc) == [OsRelease.DEBIAN_13]
    assert os_release.lock(desc, OsRelease.DEBIAN_13)["slurm"] == TRIXIE_SLURM
    assert os_release.lock(desc)["slurm"] == BOOKWORM_SLURM  # the pool's, untouched


def test_controllers_on_two_releases_are_refused() -> None:
    raw = _mixed_lab("debian-12", "debian-12")
    raw["node_classes"]["ctl13"] = {**raw["node_classes"]["ctl"], "os": "debian-13"}
    raw["nodes"]["lab-ctl2"]["class"] = "ctl13"
    assert ("nodes", "slurm-controllers-agree") in _problems(raw)


def test_a_slurm_lock_of_another_release_s_archive_is_refused() -> None:
    """Slurm 24.11.5 on Debian 12 nodes: bookworm carries 22.05.8, apt finds no 24.11."""
    raw = raw_stack("lab")
    raw["software"]["slurm"] = "24.11.5"
    assert _problems(raw) == [("software.slurm", "release-slurm-suite")]
    raw["software"]["per_release"] = {"debian-12": {"slurm": "24.11.5"}}
    assert _problems(raw) == [("software.per_release.debian-12.slurm",
                               "release-slurm-suite")]
    # A Slurm no known suite carries (a site's own repository) is not judged.
    raw["software"]["per_release"] = {"debian-12": {"slurm": "23.11.10"}}
    raw["software"]["slurm"] = "23.11.10"
    assert ("software.slurm", "release-slurm-suite") not in _problems_or_none(raw)


def _problems_or_none(raw: dict[str, Any]) -> list[tuple[str, str]]:
    try:
        loader.parse(raw)
    except DescriptionError as exc:
        return [(p.path, p.rule) for p in exc.problems]
    return []


def test_a_release_s_own_versions_meet_the_floors_and_the_blocklist() -> None:
    raw = raw_stack("example")
    raw["software"]["per_release"] = {"debian-13": {"slurm": "24.11.4"}}
    assert ("software.per_release.debian-13.slurm", "version-floor") in _problems(raw)
    raw["software"]["per_release"] = {"debian-13": {"nvidia_driver": "580.178.04"}}
    raw["software"]["blocklist"] = {"nvidia_driver": ["580.178.04"]}
    assert ("software.nvidia_driver", "version-not-blocklisted") in _problems(raw)
    desc = loader.parse({**raw, "software": {**raw["software"], "blocklist": {}}})
    # The policy pack reads every version the lock names, the release's own included.
    assert software_pinned.stack is not None
    assert list(software_pinned.stack(None, desc)) == []  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["debian-14", "bookworm", "ubuntu-24.04", 13, None])
def test_an_unknown_release_is_refused(value: object) -> None:
    raw = raw_stack("lab")
    raw["node_classes"]["ctl"]["os"] = value
    (problem,) = _problems(raw)
    assert problem[0] == "node_classes.ctl.os"


def test_a_release_lock_names_only_lock_components() -> None:
    raw = raw_stack("lab")
    raw["software"]["per_release"] = {"debian-12": {"gpu_operator": "v26.7.0"}}
    assert _problems(raw)[0][0] == "software.per_release.debian-12.gpu_operator"
    raw["software"]["per_release"] = {"debian-11": {"slurm": BOOKWORM_SLURM}}
    assert _problems(raw)[0][0].startswith("software.per_release")


def test_the_example_pool_runs_debian_13_a_proven_release(
        capsys: pytest.CaptureFixture[str]) -> None:
    desc = loader.load_stack("example", ROOT)
    assert os_release.releases_in_use(desc) == [OsRelease.DEBIAN_13]
    assert os_release.burst_release(desc) is OsRelease.DEBIAN_13
    assert os_release.notice(desc) is None
    assert cli.main(["validate", "--stack", "example"]) == cli.EXIT_OK
    assert "nodes on debian-13" not in capsys.readouterr().out


def test_validate_says_which_releases_are_unproven(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A release the enum knows before the lab proves it (as Debian 13 was) is valid, with
    a notice that the gate will not admit its nodes yet."""
    monkeypatch.setattr(os_release, "PROVEN", (OsRelease.DEBIAN_12,))
    assert os_release.notice(loader.load_stack("lab", ROOT)) is None
    assert cli.main(["validate", "--stack", "example"]) == cli.EXIT_OK
    assert "nodes on debian-13: gpupool's roles and acceptance gate are proven on " \
           "debian-12 only" in " ".join(capsys.readouterr().out.split())


def test_hosts_get_their_release_s_lock_through_ansible(tmp_path: Path) -> None:
    """The inventory puts each host in os_<release> with its release; a release with its
    own versions gives its group that lock, which Ansible resolves on its hosts."""
    raw = _mixed_lab("debian-13", "debian-13")
    raw["software"]["per_release"]["debian-13"]["nvidia_driver"] = "550.163.01"
    desc = loader.parse(raw)
    inv = tmp_path / "inventory.yml"
    inv.write_text(ansible_yaml.dump(inventory.build(desc)))
    host = next(n for n, node in desc.nodes.items() if node.class_ == "lab-l4")
    assert _resolved(inv, host, "gpupool_node.os") == "debian-13"
    software = _resolved(inv, host, "gpupool_software")
    assert software == os_release.lock(desc, OsRelease.DEBIAN_13)
    assert software["slurm"] == TRIXIE_SLURM and software["nvidia_driver"] == "550.163.01"
    assert "per_release" not in software
    assert _resolved(inv, host, "groups['os_debian_13'] | length") == len(desc.nodes)
    # The gate expects the same versions on the node.
    assert node_expect(desc, host).software == os_release.versions(desc, OsRelease.DEBIAN_13)


def test_a_pool_without_release_locks_keeps_the_pool_lock_everywhere(tmp_path: Path) -> None:
    desc = loader.load_stack("lab", ROOT)
    inv = tmp_path / "inventory.yml"
    inv.write_text(ansible_yaml.dump(inventory.build(desc)))
    host = next(iter(desc.nodes))
    assert _resolved(inv, host, "gpupool_software") == os_release.lock(desc)
    assert _resolved(inv, host, "gpupool_node.os") == "debian-12"
