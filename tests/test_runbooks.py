"""Every runbook names only commands, playbooks and variables that exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gpupool import cli
from tests.conftest import ROOT

RUNBOOKS = sorted((ROOT / "runbooks").glob("*.md"))
EVENT_RUNBOOKS = [p for p in RUNBOOKS if p.name not in ("README.md", "job-convention.md")]
SECTIONS = ("## Symptoms", "## Checks", "## Actions", "## Expected time to recover",
            "## Escalation")
# Tools of the pool itself (Slurm, NVIDIA, the OS, the clouds' CLIs) a runbook may name.
EXTERNAL = {"sinfo", "scontrol", "sacct", "squeue", "sprio", "sshare", "sacctmgr", "sbatch",
            "scancel", "nvidia-smi", "dcgmi", "journalctl", "ip", "nft", "df", "du", "ls",
            "grep", "cat", "aws", "pulumi", "systemctl", "skopeo", "docker-registry",
            # gpupool's own programs on the nodes and the registry's host (role
            # image_registry installs them).
            "gpupool-image-pull", "gpupool-registry-prune"}
ROLE_VARS = {m for p in (ROOT / "roles").glob("*/defaults/main.yml")
             for m in re.findall(r"^([a-z_]+):", p.read_text(), re.M)}


def commands(path: Path) -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", path.read_text(), re.S)
    return [ln.strip() for b in blocks for ln in b.splitlines() if ln.strip()]


def check_gpupool(argv: list[str]) -> None:
    try:
        cli.build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        pytest.fail(f"gpupool does not accept: {shlex.join(argv)} ({exc})")


def check_playbook(argv: list[str]) -> None:
    books = [a for a in argv if a.startswith("playbooks/")]
    assert len(books) == 1, argv
    book = ROOT / books[0]
    assert book.is_file(), f"{books[0]} does not exist"
    text = book.read_text()
    for i, arg in enumerate(argv):
        if arg == "-e":
            name = argv[i + 1].split("=", 1)[0]
            assert re.search(rf"\b{name}\b", text) or name in ROLE_VARS, (
                f"{books[0]} does not use -e {name}")


@pytest.mark.parametrize("path", RUNBOOKS, ids=[p.name for p in RUNBOOKS])
def test_runbook_commands_exist(path: Path) -> None:
    cmds = commands(path)
    for line in cmds:
        argv = shlex.split(line)
        if argv[0] == "gpupool":
            check_gpupool(argv)
        elif argv[0] == "ansible-playbook":
            check_playbook(argv)
        else:
            assert argv[0] in EXTERNAL, f"{path.name}: unknown command {argv[0]!r}"


@pytest.mark.parametrize("path", EVENT_RUNBOOKS, ids=[p.name for p in EVENT_RUNBOOKS])
def test_runbook_has_every_section(path: Path) -> None:
    text = path.read_text()
    positions = [text.find(s) for s in SECTIONS]
    assert -1 not in positions, f"{path.name} lacks {SECTIONS[positions.index(-1)]}"
    assert positions == sorted(positions)
    assert commands(path), f"{path.name} has no commands"
    assert "DRILL[" not in text, "expected time to recover not filled in from the drills"


def test_every_runbook_is_indexed_and_every_alert_has_one() -> None:
    index = (ROOT / "runbooks" / "README.md").read_text()
    for path in RUNBOOKS:
        if path.name != "README.md":
            assert f"({path.name})" in index, path.name
    rules = (ROOT / "monitoring" / "rules" / "gpupool.rules.yml").read_text()
    for ref in set(re.findall(r"runbook: (runbooks/[\w.-]+)", rules)):
        assert (ROOT / ref).is_file(), ref
