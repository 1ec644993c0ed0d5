"""--json is one contract (issue 52, cli.main's docstring): every verb prints one JSON object
on stdout, for success and for every failure. A success has no "error" key; a failure is
{"command", "exit_code", "error": {"kind", "message", ...}} with the kind of what stopped
it, and an invalid description adds "valid", "stack", "description", "source" and
"problems", which `validate --json` also gives when the description is valid.

Nothing here reaches the lab's hosts: every verb that would stops before it does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool import cli
from gpupool.cli import registry
from gpupool.cli.output import FAILURE_KINDS
from gpupool.paths import DATA

TRACE = DATA / "traces" / "alibaba-gpu-2023" / "openb_pod_list_default.csv"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lab project (stack dev) as the working folder, a foreign file and a broken
    description beside it."""
    root = tmp_path / "pool"
    assert cli.main(["init", str(root), "--from", "lab", "--stack", "dev"]) == cli.EXIT_OK
    (tmp_path / "foreign.txt").write_text("root:x:0:0:root:/root:/bin/bash\n")
    broken = yaml.safe_load((root / "pools" / "dev.yaml").read_text())
    broken["nodes"]["lab-gpu1"]["rack"] = "r9"
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(broken))
    (tmp_path / "latin1.yaml").write_bytes(b"pool: caf\xe9\n")
    monkeypatch.chdir(root)
    return root


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own exit (usage), after printing
        code = exc.code if isinstance(exc.code, int) else 1
    printed = capsys.readouterr().out
    data = json.loads(printed)  # one JSON document, nothing else on stdout
    assert isinstance(data, dict), printed
    return code, data


SUCCEEDS = [
    ["validate"], ["show"], ["inventory"], ["slurm", "render"], ["policy", "--list"],
    ["playbook"], ["audit", "--alibaba", str(TRACE), "--out", "{tmp}/audit"],
    ["init", "{tmp}/second"], ["gate", "lab-gpu1", "--print-expect"],
    ["schema"], ["schema", "--reference"], ["schema", "-o", "{tmp}/description.schema.json"],
]


@pytest.mark.parametrize("argv", SUCCEEDS, ids=" ".join)
def test_a_success_is_an_object_without_error(argv: list[str], project: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.replace("{tmp}", str(project.parent)) for a in argv]
    code, data = _json([*argv, "--json"], capsys)
    assert code == cli.EXIT_OK and "error" not in data, data


# (argv, kind): every verb's usage error, and each other kind where a verb has one.
FAILS = [
    *(([verb, "--no-such-option"], "usage") for verb in registry.VERBS),
    (["slurm", "frobnicate"], "usage"),
    (["lab", "sideways"], "usage"),
    (["gate", "no-such-node"], "usage"),
    (["gate", "--lock", "nonsense"], "usage"),
    (["audit"], "usage"),
    (["audit", "--alibaba", str(TRACE), "--class-map", "LS=nope"], "usage"),
    (["init", "{tmp}/new", "--stack", "../x"], "usage"),
    (["playbook", "no_such_playbook"], "usage"),
    (["images", "--containerfile", "nope"], "usage"),
    (["images", "--registry", "not a host"], "usage"),
    (["replay", "--trace", "{tmp}/missing.csv"], "file"),
    (["audit", "--sacct", "{tmp}/missing.txt"], "file"),
    (["inventory", "-o", "{tmp}/foreign.txt"], "output"),
    (["slurm", "render", "--vars", "{tmp}/foreign.txt"], "output"),
    (["drill", "preemption", "--report", "{tmp}/foreign.txt"], "output"),
    (["init", "{tmp}/pool"], "output"),
    (["schema", "-o", "{tmp}/foreign.txt"], "output"),
    *(([*verb, "--file", "{tmp}/broken.yaml"], "invalid")
      for verb in (["validate"], ["show"], ["images"], ["inventory"], ["plan"], ["policy"],
                   ["slurm", "render"], ["audit"], ["lab", "status"], ["gate"],
                   ["drill", "preemption"], ["replay"])),
    (["validate", "--file", "{tmp}/missing.yaml"], "invalid"),
    (["validate", "--file", "{tmp}/latin1.yaml"], "invalid"),
    (["validate", "--stack", "nope"], "invalid"),
    (["show", "--project", "{tmp}"], "invalid"),
]


@pytest.mark.parametrize(("argv", "kind"), FAILS, ids=lambda v: " ".join(v) if isinstance(
    v, list) else v)
def test_a_failure_is_an_object_with_its_kind(argv: list[str], kind: str, project: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.replace("{tmp}", str(project.parent)) for a in argv]
    code, data = _json([*argv, "--json"], capsys)
    _is_failure(data, code, argv[0], kind)


def _is_failure(data: dict[str, Any], code: int, verb: str, kind: str) -> None:
    assert data["error"]["kind"] == kind, data
    assert data["exit_code"] == code == FAILURE_KINDS[kind], data
    assert data["command"] == verb
    assert isinstance(data["error"]["message"], str) and data["error"]["message"]
    if kind == "invalid":
        assert data["valid"] is False and data["problems"], data
        assert {"stack", "description", "source"} <= set(data)


def test_a_missing_extra_a_bug_and_gpupool_s_own_errors_are_objects_too(
        project: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from gpupool.lab import hosts  # noqa: PLC0415
    from gpupool.preview import plan  # noqa: PLC0415

    def no_pulumi(*_a: object, **_k: object) -> object:
        raise ModuleNotFoundError("No module named 'pulumi'", name="pulumi")

    def a_bug(*_a: object, **_k: object) -> object:
        raise KeyError("a bug")

    def lab_fails(*_a: object, **_k: object) -> object:
        raise hosts.LabError("podman is not installed")

    monkeypatch.setattr(plan, "declare", no_pulumi)
    code, data = _json(["plan", "--json"], capsys)
    _is_failure(data, code, "plan", "extra")
    assert data["error"]["install"] == "pip install 'gpupool[cloud]'"
    monkeypatch.setattr(plan, "declare", a_bug)
    code, data = _json(["policy", "--json"], capsys)
    _is_failure(data, code, "policy", "internal")
    monkeypatch.setattr(hosts, "status", lab_fails)
    code, data = _json(["lab", "status", "--json"], capsys)
    _is_failure(data, code, "lab", "failed")
    assert "podman is not installed" in data["error"]["message"]
    # A verb whose whole module needs an extra that is missing (the base install's gate).
    monkeypatch.setitem(registry.MISSING, "gate", ("gate", "pytest"))
    monkeypatch.delitem(registry.COMMANDS, "gate", raising=False)
    code, data = _json(["gate", "--tier", "quick", "--json"], capsys)
    _is_failure(data, code, "gate", "extra")


def test_a_mistyped_verb_is_a_usage_object(capsys: pytest.CaptureFixture[str]) -> None:
    code, data = _json(["valdiate", "--json"], capsys)
    _is_failure(data, code, None, "usage")  # type: ignore[arg-type]
    assert "valdiate" in data["error"]["message"]


@pytest.mark.parametrize("how", ["file", "stack"])
def test_validate_names_the_description_the_same_way_valid_or_not(
        how: str, project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool = project / "pools" / "dev.yaml"
    source = ["--file", "pools/dev.yaml"] if how == "file" else ["--stack", "dev"]
    code, valid = _json(["validate", *source, "--json"], capsys)
    assert code == cli.EXIT_OK and valid["valid"] is True
    pool.write_text((project.parent / "broken.yaml").read_text())
    code, invalid = _json(["validate", *source, "--json"], capsys)
    assert code == cli.EXIT_INVALID and invalid["valid"] is False
    names = ("stack", "description", "source")
    assert {k: valid[k] for k in names} == {k: invalid[k] for k in names} == {
        "stack": None if how == "file" else "dev", "description": str(pool.resolve()),
        "source": str(pool.resolve())}
    # Every verb but init, playbook and schema reads a description: each is listed above.
    assert {v[0][0] for v in FAILS if v[1] == "invalid"} == set(registry.VERBS) - {
        "init", "playbook", "schema"}
