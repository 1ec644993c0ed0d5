"""Every Pulumi project file gpupool ships or writes is one Pulumi loads (issue 51): the
checkout's Pulumi.yaml and stack files, and those of `gpupool init DIR` whatever DIR is
called, against Pulumi's own project schema and config-key rules (tests/_pulumi_project.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpupool import cli
from gpupool.cli.commands import init
from gpupool.paths import PROJECT_FILE
from gpupool.spec import connection, loader
from tests._pulumi_project import (
    namespaced_by_project,
    project_name_problems,
    project_problems,
    stack_problems,
)
from tests.conftest import ROOT

ODD_NAMES = ["mypool", "my pool", "ünï", "-x", "x" * 200, "My_Pool.v2", "日本", "a--b-",
             "gpupool", "--", "é" * 60]


def _problems(root: Path) -> dict[str, list[str]]:
    """Pulumi's objections to the project at root and each of its stack files."""
    project = yaml.safe_load((root / PROJECT_FILE).read_text())
    found = {PROJECT_FILE: project_problems(project)}
    stacks = sorted(root.glob("Pulumi.*.yaml"))
    assert stacks, f"no stack files in {root}"
    for path in stacks:
        found[path.name] = stack_problems(yaml.safe_load(path.read_text()), project)
    return found


def test_the_checkout_s_project_and_stacks_load() -> None:
    found = _problems(ROOT)
    assert found == {path: [] for path in found}
    assert set(found) >= {"Pulumi.yaml", "Pulumi.example.yaml", "Pulumi.lab.yaml"}
    # No other Pulumi project or stack file hides in the checkout (the policy pack's is
    # PulumiPolicy.yaml, another schema).
    others = [p for pattern in ("Pulumi.yaml", "Pulumi.*.yaml") for p in ROOT.rglob(pattern)
              if p.parent != ROOT and not {".venv", ".cache", ".git"} & set(p.parts)]
    assert others == []


@pytest.mark.parametrize("folder", ODD_NAMES)
@pytest.mark.parametrize("starter", init.STARTERS)
def test_init_writes_a_project_pulumi_loads_whatever_the_folder(
        tmp_path: Path, folder: str, starter: str, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / folder
    assert cli.main(["init", str(target), "--from", starter, "--stack", "dev"]) == 0
    found = _problems(target)
    assert found == {path: [] for path in found}
    name = yaml.safe_load((target / PROJECT_FILE).read_text())["name"]
    assert name == init.project_name(folder)
    assert project_name_problems(name) == []
    # Said when the folder's name is not the project's, never silently.
    assert ("note: the Pulumi project is named" in capsys.readouterr().err) == (name != folder)
    # The keys gpupool reads stay in its namespace, which the stack file sets.
    stack = yaml.safe_load((target / "Pulumi.dev.yaml").read_text())
    assert stack["config"][loader.CONFIG_KEY] == "pools/dev.yaml"
    assert loader.CONFIG_KEY.startswith(init.CONFIG_NAMESPACE + ":")
    assert connection.CONFIG_KEY.startswith(init.CONFIG_NAMESPACE + ":")
    # And the project validates with gpupool too.
    assert cli.main(["validate", "--stack", "dev", "--project", str(target)]) == 0


def test_project_names_from_folders() -> None:
    assert init.project_name("my pool") == "my-pool"
    assert init.project_name("ünï") == "uni"
    assert init.project_name("-x") == "x"
    assert init.project_name("日本") == "pool"
    assert init.project_name("x" * 200) == "x" * 100
    assert init.project_name("a" * 99 + "-b") == "a" * 99  # no trailing hyphen
    assert init.project_name("gpupool") == "gpupool"


def test_the_old_project_is_what_pulumi_refused() -> None:
    """The checker sees issue 51: the checkout's config declaration under another name."""
    project = yaml.safe_load((ROOT / PROJECT_FILE).read_text()) | {"name": "mypool"}
    assert project_problems(project) == [
        "Configuration key 'gpupool:description' is not namespaced by the project and "
        "should not define a type"]
    assert project_name_problems("x" * 101) == ["project names are limited to 100 characters"]
    assert project_name_problems("my pool") == [
        "project names may only contain alphanumerics, hyphens, underscores, and periods"]
    assert project_name_problems("ünï") != []


def test_the_checker_follows_pulumi_s_rules() -> None:
    """Cases from Pulumi's Project.Validate, ParseKey and mergeConfig."""
    assert namespaced_by_project("p", "k") and namespaced_by_project("p", "p:k")
    assert not namespaced_by_project("p", "aws:region")
    base = {"name": "p", "runtime": "python"}
    assert project_problems(base) == []
    assert project_problems(base | {"config": {"aws:region": "us-east-1"}}) == []
    assert project_problems(base | {"config": {"aws:region": {"default": "x"}}}) != []
    assert project_problems(base | {"config": {"aws:region": {}}}) == [
        "Configuration key 'aws:region' is namespaced and must provide an attribute 'value'"]
    assert project_problems(base | {"config": {"k": {"type": "array"}}}) != []
    assert project_problems(base | {"config": {"k": {"type": "integer", "default": 1,
                                                     "value": 2}}}) != []
    # The schema's own checks.
    assert project_problems(base | {"runtime": ""}) != []
    assert project_problems(base | {"main": 3}) != []
    assert project_problems(base | {"runtime": {"name": "python", "options": []}}) != []
    declared = base | {"config": {"k": {"type": "string"}}}
    assert stack_problems({"config": {"p:k": "v"}}, declared) == []
    assert stack_problems({"config": {"aws:region": "x"}}, declared) == [
        "Stack is missing configuration value 'p:k'"]
    assert stack_problems({"config": {"k": "v", "p:k": "v"}}, declared) == [
        "could not parse k as a configuration key (configuration keys should be of the form "
        "`<namespace>:<name>`)"]
    assert stack_problems(None, base) == []
