"""The command line's entry point loads only the verb it runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli_startup import VERBS, heavy_modules
from gpupool import cli
from gpupool.cli import registry


@pytest.mark.parametrize("verb", VERBS)
def test_light_verbs_load_no_heavy_library(verb: str) -> None:
    # Pulumi and matplotlib cost about a second; these verbs need neither.
    assert heavy_modules(verb) == []


def test_every_verb_module_registers_its_verb() -> None:
    registry.load(None)
    assert set(registry.COMMANDS) | set(registry.PLAIN) == set(registry.VERBS)
    assert not set(registry.COMMANDS) & set(registry.PLAIN)


def test_a_verb_missing_from_the_map_is_refused() -> None:
    with pytest.raises(ValueError, match="VERBS"):
        registry.command("frobnicate", "not a verb")


def test_stacks_resolve_in_the_project_found_from_the_working_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    project = tmp_path / "mypool"
    assert cli.main(["init", str(project), "--from", "lab", "--stack", "dev"]) == cli.EXIT_OK
    (project / "deep" / "er").mkdir(parents=True)
    monkeypatch.chdir(project / "deep" / "er")
    capsys.readouterr()
    assert cli.main(["validate", "--stack", "dev", "--json"]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out)["valid"]
    # The checkout's own stacks are not this project's.
    assert cli.main(["validate", "--stack", "example"]) == cli.EXIT_INVALID
    assert "stacks: dev" in capsys.readouterr().err.replace("\n", "")
    for verb in (["plan"], ["policy"], ["slurm", "render"], ["inventory"]):
        assert cli.main([*verb, "--stack", "dev"]) == cli.EXIT_OK, verb
    monkeypatch.chdir(tmp_path)  # no Pulumi.yaml here or above
    assert cli.main(["validate", "--stack", "dev"]) == cli.EXIT_INVALID
    assert cli.main(["validate", "--stack", "dev", "--project", str(project)]) == cli.EXIT_OK
    assert cli.main(["validate", "--file", str(project / "pools" / "dev.yaml")]) == cli.EXIT_OK


def test_init_never_overwrites(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    assert cli.main(["init", str(tmp_path)]) == cli.EXIT_INVALID
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
    assert cli.main(["init", str(tmp_path / "new"), "--stack", "../x"]) == cli.EXIT_USAGE
    assert not (tmp_path / "new").exists()
