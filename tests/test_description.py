"""The pool description: shipped stacks validate, malformed ones fail with exact errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool import cli
from gpupool.spec import loader
from gpupool.spec.errors import DescriptionError
from gpupool.spec.facts import gpu_capacity
from tests.conftest import ROOT, mutate, raw_stack

CASES = yaml.safe_load((Path(__file__).parent / "corpus" / "malformed.yaml").read_text())


@pytest.mark.parametrize("stack", ["lab", "example"])
def test_shipped_stacks_are_valid(stack: str) -> None:
    desc = loader.load_stack(stack, ROOT)
    assert desc.pool.environment == ("lab" if stack == "lab" else "production")


def test_example_capacity_is_derived_from_nodes_and_burst_groups() -> None:
    desc = loader.load_stack("example", ROOT)
    # 16 HGX nodes x 8 on-prem; 6 p5 x 8 burst of which 1 node on-demand.
    assert gpu_capacity(desc)["h100"] == {"on-prem": 128, "on-demand": 8, "spot": 40}
    assert gpu_capacity(desc)["l40s"] == {"on-prem": 24, "on-demand": 0, "spot": 16}


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 120
    assert len({c["name"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_malformed_description_is_rejected_exactly(case: dict[str, Any]) -> None:
    data = mutate(raw_stack(case.get("base", "lab")), case["ops"])
    with pytest.raises(DescriptionError) as info:
        loader.parse(data, case["name"])
    got = sorted([p.path, p.rule, p.value] for p in info.value.problems)
    assert got == sorted(case["expect"]), "\n".join(str(p) for p in info.value.problems)
    for p in info.value.problems:
        assert p.message, p


def test_duplicate_yaml_key_is_an_error(tmp_path: Path) -> None:
    text = loader.description_path("lab", ROOT).read_text()
    text = text.replace("  lab-gpu2:\n", "  lab-gpu1:\n", 1)
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(DescriptionError) as info:
        loader.load_file(path)
    (problem,) = info.value.problems
    assert problem.rule == "yaml"
    assert "duplicate key 'lab-gpu1'" in problem.message


def test_unknown_stack_names_the_stack() -> None:
    with pytest.raises(DescriptionError) as info:
        loader.load_stack("nope", ROOT)
    assert [(p.path, p.rule, p.value) for p in info.value.problems] == [
        ("stack", "stack-exists", "nope")]


@pytest.mark.parametrize("named", ["/etc/passwd", "../outside.yaml", "pools/../../x.yaml",
                                   "escape.yaml", "pools/lab\x00.yaml", ""])
def test_a_stack_names_only_a_description_inside_its_project(tmp_path: Path,
                                                             named: str) -> None:
    """A cloned project's stack config cannot make gpupool read (and echo as problems) a
    file elsewhere on the machine, through a path or a link."""
    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "outside.yaml").write_text("secret: 1\n")
    (project / "escape.yaml").symlink_to(tmp_path / "outside.yaml")
    (project / "Pulumi.x.yaml").write_text(
        f"config:\n  gpupool:description: {json.dumps(named)}\n")  # YAML reads JSON's escapes
    with pytest.raises(DescriptionError) as info:
        loader.load_stack("x", project)
    assert [(p.path, p.rule, p.value) for p in info.value.problems] == [
        ("config.gpupool:description", "description-path", named)]


def test_cli_invalid_exits_nonzero_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = mutate(raw_stack("lab"), [{"set": "nodes.lab-gpu1.rack", "value": "r9"},
                                    {"set": "software.cuda", "value": "12.x"}])
    src = tmp_path / "bad.yaml"
    src.write_text(yaml.safe_dump(bad))
    target = tmp_path / "inventory.yml"
    assert cli.main(["inventory", "--file", str(src), "-o", str(target)]) == cli.EXIT_INVALID
    assert not target.exists()
    assert cli.main(["validate", "--file", str(src), "--json"]) == cli.EXIT_INVALID
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is False
    assert {(p["path"], p["rule"]) for p in report["problems"]} == {
        ("nodes.lab-gpu1.rack", "rack-exists"), ("software.cuda", "pinned-version")}


def test_cli_validate_accepts_shipped_stacks(capsys: pytest.CaptureFixture[str]) -> None:
    for stack in ("lab", "example"):
        assert cli.main(["validate", "--stack", stack, "--json"]) == cli.EXIT_OK
        assert json.loads(capsys.readouterr().out)["valid"] is True


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_no_verb_proceeds_on_a_malformed_description(case: dict[str, Any], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # validate refuses what any renderer would: none of them gets to run, none tracebacks.
    src = tmp_path / "bad.yaml"
    src.write_text(yaml.safe_dump(mutate(raw_stack(case.get("base", "lab")), case["ops"])))
    out = tmp_path / "out"
    for argv in (["validate"], ["inventory", "-o", str(out / "inv.yml")],
                 ["slurm", "render", "--out", str(out)], ["plan"], ["policy"]):
        assert cli.main([*argv, "--file", str(src)]) == cli.EXIT_INVALID, argv
    assert not out.exists()
    assert "Traceback" not in capsys.readouterr().err


VALID = yaml.safe_load((Path(__file__).parent / "corpus" / "valid.yaml").read_text())


def test_valid_corpus_is_large_enough() -> None:
    assert len(VALID) >= 10 and len({c["name"] for c in VALID}) == len(VALID)


@pytest.mark.parametrize("case", VALID, ids=[c["name"] for c in VALID])
def test_unusual_valid_description_is_accepted_and_renders(case: dict[str, Any]) -> None:
    from gpupool.render import inventory, k8s_objects, slurm  # noqa: PLC0415

    desc = loader.parse(mutate(raw_stack(case.get("base", "lab")), case["ops"]), case["name"])
    assert inventory.build(desc)["all"]["hosts"]
    assert "slurm.conf" in slurm.render_files(desc)
    assert k8s_objects.manifests(desc)


def test_a_package_version_loses_its_v_where_it_enters() -> None:
    """apt knows no "v22.05.8": the lock reaches the roles as Debian writes it; the GPU
    Operator's chart version keeps the tag NVIDIA gives it."""
    data = mutate(raw_stack("lab"), [{"set": "software.slurm", "value": "v22.05.8"}])
    sw = loader.parse(data).software
    assert (sw.slurm, sw.gpu_operator) == ("22.05.8", "v26.7.0")
