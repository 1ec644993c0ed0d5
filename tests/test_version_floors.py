"""Version floors: Debian's version comparison, the vendored advisory table and the rule
that refuses a production lock below its release line's floor."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gpupool.spec import floors, loader, rules
from gpupool.spec.floors import VersionError, compare, parse, release_line
from tests.conftest import ROOT

# (a, b, sign of a - b) as dpkg orders them.
ORDERED = [
    ("22.05.8", "22.05.11", -1),
    ("22.05.10", "22.05.9", 1),
    ("1.0", "1.0", 0),
    ("1.0", "1.00", 0),
    ("1.0~rc1", "1.0", -1),
    ("1.0~rc1", "1.0~rc2", -1),
    ("1.0~~", "1.0~", -1),
    ("1.0", "1.0+b1", -1),
    ("1.0", "1.0.1", -1),
    ("1.0a", "1.0", 1),
    ("1.0a", "1.0+", -1),  # letters sort before other characters
    ("22.05.8-4", "22.05.8-4+deb12u3", -1),
    ("22.05.8-4+deb12u3", "22.05.8-4+deb12u10", -1),
    ("22.05.8-4+deb12u3", "22.05.9-1", -1),
    ("22.05.8-4+deb12u3", "22.05.8", 1),
    ("1:1.0", "2.0", 1),
    ("0:2.0", "2.0", 0),
    ("535.309.01-0+deb12u1", "535.309.01", 1),
    ("535.261.03-1", "535.309.01", -1),
    ("580.178.04", "580.95.05", 1),
    ("2.0-1~bpo12+1", "2.0-1", -1),
]


@pytest.mark.parametrize(("a", "b", "sign"), ORDERED)
def test_versions_compare_as_dpkg_orders_them(a: str, b: str, sign: int) -> None:
    assert compare(a, b) == sign
    assert compare(b, a) == -sign


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="no dpkg on this host")
@pytest.mark.parametrize(("a", "b", "sign"), ORDERED)
def test_the_comparison_agrees_with_dpkg_itself(a: str, b: str, sign: int) -> None:
    op = {-1: "lt", 0: "eq", 1: "gt"}[sign]
    assert subprocess.run(["dpkg", "--compare-versions", a, op, b], check=False).returncode == 0


GARBAGE = ["", " ", "latest", "v", "x1.0", "1.0 ", " 1.0", "1.0\n", "a:1.0", ":1.0",
           "1.0-", "1.0-a b", "1.0-ü", "\u0661.\u0660", "1.0\x00", "1" * 200, "--", "1:", "1.0-4:5",
           None, 22.05, ["22.05.8"], {"v": 1}]


@pytest.mark.parametrize("garbage", GARBAGE, ids=repr)
def test_garbage_is_a_version_error_never_a_traceback(garbage: object) -> None:
    with pytest.raises(VersionError) as info:
        floors.check("slurm", garbage)
    assert str(info.value)
    with pytest.raises(VersionError):
        compare("1.0", garbage)  # type: ignore[arg-type]


@pytest.mark.parametrize("garbage", ["1", "1a", "1.x", "1~rc"])
def test_a_version_without_a_line_is_a_version_error(garbage: str) -> None:
    with pytest.raises(VersionError, match="release line"):
        release_line(garbage, "major.minor")


def test_release_lines() -> None:
    assert release_line("22.05.8-4+deb12u3", "major.minor") == "22.05"
    assert release_line("1:24.11.5", "major.minor") == "24.11"
    assert release_line("580.178.04", "major") == "580"
    assert release_line("535.309.01-0+deb12u1", "major") == "535"


def test_the_table_is_consistent_and_every_fact_has_its_source() -> None:
    source = (ROOT / "gpupool" / "data" / "version-floors" / "SOURCE.md").read_text()
    assert floors.components() == ["nvidia_driver", "slurm"]
    for adv in floors.advisories():
        assert adv.line in floors.LINES and adv.cves and adv.summary and adv.sources
        assert f"| {adv.id} |" in source, adv.id
        for cve in adv.cves:
            assert cve.removeprefix("CVE-").split("-")[-1] in source, cve
        for line, fixed in adv.fixed.items():
            assert fixed is None or release_line(fixed, adv.line) == line, (adv.id, fixed)
            assert fixed is None or fixed in source, (adv.id, fixed)
        for line, backport in adv.debian.items():
            assert parse(backport).revision and release_line(backport, adv.line) == line
            assert backport in source, (adv.id, backport)
            # A backport's own fix: the version it names passes the advisory.
            assert adv.fixes(parse(backport), line)


def test_a_verdict_names_the_cves_the_floor_and_the_fix() -> None:
    verdict = floors.check("slurm", "24.11.4")
    assert verdict is not None
    assert verdict.cves == ["CVE-2025-43904"] and verdict.pin == "24.11.5"
    assert "fixed in 24.11: 24.11.5" in verdict.message
    assert verdict.message.endswith("pin 24.11.5 or later")


def test_debian_backports_count_only_with_their_revision() -> None:
    plain = floors.check("slurm", "22.05.8")
    assert plain is not None and plain.pin == "22.05.8-4+deb12u3"
    assert {"CVE-2023-41914", "CVE-2023-49933", "CVE-2025-43904"} <= set(plain.cves)
    older = floors.check("slurm", "22.05.8-4+deb12u2")
    assert older is not None and older.cves == ["CVE-2025-43904"]
    assert floors.check("slurm", "22.05.8-4+deb12u3") is None
    assert floors.check("slurm", "22.05.8-4+deb12u4") is None
    # A Debian build of another upstream version is not the backport.
    assert floors.check("slurm", "22.05.9-1") is not None


def test_a_line_with_no_fixed_release_points_to_fixed_lines() -> None:
    # 22.05.11 is upstream's last 22.05; CVE-2025-43904 was fixed there by Debian alone.
    verdict = floors.check("slurm", "22.05.11")
    assert verdict is not None and verdict.cves == ["CVE-2025-43904"]
    assert verdict.pin == "22.05.8-4+deb12u3"
    driver = floors.check("nvidia_driver", "570.195.03")
    assert driver is not None and driver.pin == "570.211.01"
    assert "580.178.04" not in driver.fix  # its own line has a fix


def test_drivers_and_lines_the_table_does_not_name() -> None:
    assert floors.check("nvidia_driver", "580.178.04") is None
    assert floors.check("nvidia_driver", "580.178.04-1") is None
    assert floors.check("nvidia_driver", "535.309.01-0+deb12u1") is None
    verdict = floors.check("nvidia_driver", "580.159.04")
    assert verdict is not None and verdict.cves == ["CVE-2026-47501"]
    # A line no advisory lists: the table claims nothing about it.
    assert floors.check("nvidia_driver", "999.1.1") is None
    assert floors.check("dcgm", "1.0") is None


def _with(stack: str, **software: str):  # type: ignore[no-untyped-def]
    desc = loader.load_stack(stack, ROOT)
    return desc.model_copy(update={"software": desc.software.model_copy(update=software)})


def test_the_rule_refuses_production_only() -> None:
    assert not list(rules.version_floors(loader.load_stack("example", ROOT)))
    lab = loader.load_stack("lab", ROOT)
    assert not list(rules.version_floors(lab))  # the lab lists it instead (spec/lab.py)
    assert [p.rule for p in rules.floor_problems(lab)] == ["version-floor"]
    (problem,) = rules.version_floors(_with("example", slurm="24.11.4"))
    assert (problem.path, problem.rule, problem.value) == ("software.slurm", "version-floor",
                                                           "24.11.4")
    assert "CVE-2025-43904" in problem.message and "pin 24.11.5 or later" in problem.message


@pytest.mark.parametrize("garbage", ["latest", "", "1" * 200, "\u0661.\u0660"])
def test_the_rule_turns_an_unreadable_lock_into_a_problem(garbage: str) -> None:
    (problem,) = rules.version_floors(_with("example", slurm=garbage))
    assert (problem.rule, problem.value) == ("version-comparable", garbage)
    assert "cannot be compared" in problem.message
