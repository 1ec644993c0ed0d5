"""The command line's entry point loads only the verb it runs."""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli_startup import VERBS, heavy_modules
from gpupool import cli
from gpupool.cli import registry
from gpupool.paths import DATA, PROJECT_ROOT


@pytest.mark.parametrize("verb", VERBS)
def test_light_verbs_load_no_heavy_library(verb: str) -> None:
    # Pulumi and matplotlib cost about a second; these verbs need neither.
    assert heavy_modules(verb) == []


# What neither --help, --version nor any verb's --help may import (the base install has none
# of them, and each costs start-up time: bench/cli_startup.py measures it).
HEAVY = {"pulumi", "pulumi_aws", "pulumi_kubernetes", "pulumi_policy", "boto3", "ansible",
         "testinfra", "matplotlib", "jsonschema", "kubernetes_validate"}


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["valdiate"],
                                  *([verb, "--help"] for verb in registry.VERBS)],
                         ids=" ".join)
def test_help_and_version_import_no_heavy_module(argv: list[str]) -> None:
    code = ("import sys\nfrom gpupool.cli import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit:\n    pass\nprint('LOADED=' + ' '.join(sorted({m.split('.')[0] "
            "for m in sys.modules})))")
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, timeout=60, check=False)
    loaded = set(proc.stdout.rpartition("LOADED=")[2].split())
    assert "gpupool" in loaded, proc.stdout + proc.stderr
    assert loaded & HEAVY == set()


def test_help_version_and_a_typo_import_no_verb_module() -> None:
    code = ("import sys\nfrom gpupool.cli import main\nfor argv in (['--help'], ['--version'], "
            "['valdiate']):\n    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print('VERBS=' + ' '.join(m for m in sys.modules "
            "if m.startswith('gpupool.cli.commands.')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, timeout=60, check=False)
    assert "VERBS=" in proc.stdout, proc.stderr
    assert proc.stdout.rpartition("VERBS=")[2].split() == []


def test_a_verb_whose_extra_is_missing_says_which_in_its_help_and_exits_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """What the base install's `gpupool gate` does (tests/test_wheel.py runs the real one)."""
    monkeypatch.setattr(registry, "COMMANDS", {})
    monkeypatch.setattr(registry, "MISSING", {})
    real = importlib.import_module

    def no_pytest(name: str, *a: object) -> object:
        if name == "gpupool.cli.commands.gate":
            raise ModuleNotFoundError("No module named 'pytest'", name="pytest")
        return real(name, *a)

    monkeypatch.setattr(registry.importlib, "import_module", no_pytest)
    with pytest.raises(SystemExit) as done:
        cli.main(["gate", "--help"])
    assert done.value.code == 0
    assert "pip install 'gpupool[gate]'" in capsys.readouterr().out.replace("\n", " ")
    assert cli.main(["gate", "--tier", "quick", "lab-gpu1"]) == cli.EXIT_USAGE
    assert "pip install 'gpupool[gate]'" in capsys.readouterr().err


def test_every_verb_module_registers_its_verb() -> None:
    registry.load(None)
    assert set(registry.COMMANDS) | set(registry.PLAIN) == set(registry.VERBS)
    assert not set(registry.COMMANDS) & set(registry.PLAIN)


@pytest.mark.parametrize("fails", [False, True])
def test_batch_verbs_run_without_the_cyclic_collector_and_give_it_back(
        fails: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(registry.VERBS) >= registry.BATCH
    seen: list[bool] = []

    def handler(_args: argparse.Namespace, _desc: object) -> int:
        seen.append(gc.isenabled())
        if fails:
            raise RuntimeError("a bug")
        return cli.EXIT_OK

    registry.load("validate")
    help_, _, setup = registry.COMMANDS["validate"]
    monkeypatch.setitem(registry.COMMANDS, "validate", (help_, handler, setup))
    assert gc.isenabled()
    code = cli.main(["validate", "--file", str(PROJECT_ROOT / "pools" / "lab.yaml")])
    assert seen == [False] and gc.isenabled()
    assert code == (cli.EXIT_INTERNAL if fails else cli.EXIT_OK)


def test_a_verb_missing_from_the_map_is_refused() -> None:
    with pytest.raises(ValueError, match="VERBS"):
        registry.command("frobnicate")


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
    # The project's only stack is the default: a new project's verbs need no --stack.
    assert cli.main(["validate", "--json"]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out)["valid"]
    # The checkout's own stacks are not this project's.
    assert cli.main(["validate", "--stack", "example"]) == cli.EXIT_INVALID
    assert "stacks: dev" in capsys.readouterr().err.replace("\n", "")
    for verb in (["plan"], ["policy"], ["slurm", "render"], ["inventory"]):
        assert cli.main([*verb, "--stack", "dev"]) == cli.EXIT_OK, verb
    # Reports by default go to the project's .cache, not the working folder's.
    trace = DATA / "traces" / "alibaba-gpu-2023" / "openb_pod_list_default.csv"
    assert cli.main(["audit", "--stack", "dev", "--alibaba", str(trace), "--json"]) == 0
    assert (project / ".cache" / "audit").is_dir()
    assert not (project / "deep" / "er" / ".cache").exists()
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


def test_tables_say_yes_or_no_and_keep_brackets_at_80_columns() -> None:
    from rich.console import Console  # noqa: PLC0415

    from gpupool.cli.commands.gate import _summary  # noqa: PLC0415
    from gpupool.cli.output import cell, table  # noqa: PLC0415

    assert [cell(True), cell(False), cell(None), cell("mount_present[scratch]")] == [
        "yes", "no", "-", "mount_present\\[scratch]"]
    console = Console(width=80, record=True)
    console.print(table("t", ["class", "preemptible"], [["interactive", False]], None))
    console.print(_summary([{
        "node": "lab-gpu1", "tier": "standard", "verdict": "fail", "duration_s": 5.7,
        "counts": {"pass": 23, "fail": 1, "skip": 16, "error": 0}, "action": "reconfigure",
        "failed": ["storage.mount_present[scratch]"]}]))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "interactive" in text and "no" in text and "False" not in text
    # The failed check's id wraps but is whole: nothing read as markup, nothing cut.
    assert "[scratch]" in "".join(line.split("│")[4].strip() for line in text.splitlines()
                                  if line.count("│") == 7)


def test_policy_list_names_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    from policies.catalog import POLICIES  # noqa: PLC0415

    assert cli.main(["policy", "--list", "--json"]) == cli.EXIT_OK
    listed = json.loads(capsys.readouterr().out)["policies"]
    assert sorted(p["name"] for p in listed) == sorted(POLICIES)
    assert all(p["level"] in ("mandatory", "advisory") and p["description"] for p in listed)
    # Read by a person at 80 columns: every name whole on its own line.
    assert cli.main(["policy", "--list"]) == cli.EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert all(any(line.split()[-1:] == [name] for line in lines) for name in POLICIES)
    assert max(len(line.rstrip()) for line in lines) <= 80


def test_every_verbs_help_is_printed() -> None:
    # argparse formats help with %: a literal % in a help text is a TypeError at --help.
    parser = importlib.import_module("gpupool.cli.main").build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert len(verbs.choices) >= 12
    for verb, sub in verbs.choices.items():
        assert sub.format_help().startswith(f"usage: gpupool {verb}"), verb


def test_every_option_is_documented_with_its_default() -> None:
    parser = importlib.import_module("gpupool.cli.main").build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    undocumented = []
    for verb, sub in verbs.choices.items():
        for action in sub._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            # An empty list (a repeatable option given no times) is no default to show.
            has_default = (action.default not in (None, False) and action.default != []
                           and action.nargs != 0)
            if (not action.help or action.help.startswith("(default")
                    or (has_default and "default" not in action.help)):
                undocumented.append(f"{verb} {action.option_strings[0]}")
    assert not undocumented, undocumented
