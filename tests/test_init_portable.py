"""A project `gpupool init` makes is the team's, not one person's (issue 52): copied to
another folder (a teammate's clone, CI), every path it names still resolves, and none of
its files names the folder it was made in, gpupool's checkout or installed package, or a
virtualenv outside it. gpupool's playbooks run in it through `gpupool playbook`.
(tests/test_wheel.py does the same from the installed wheel.)"""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpupool import cli
from gpupool.cli.commands import init
from gpupool.paths import PROJECT_ROOT, SHARE

BIN = Path(sys.executable).parent


@pytest.fixture
def moved(tmp_path: Path) -> Path:
    """A lab project made in one folder, then moved to another (the first one is gone)."""
    made = tmp_path / "made"
    assert cli.main(["init", str(made), "--from", "lab", "--stack", "prod"]) == cli.EXIT_OK
    there = tmp_path / "elsewhere" / "pool"
    shutil.copytree(made, there)
    shutil.rmtree(made)
    return there


def _gpupool(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "GPUPOOL_"))}
    return subprocess.run([str(BIN / "gpupool"), *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_no_generated_file_names_a_path_outside_the_project(moved: Path, tmp_path: Path) -> None:
    outside = [str(tmp_path), sys.prefix, str(PROJECT_ROOT), str(SHARE), "site-packages",
               ".venv"]
    files = [p for p in moved.rglob("*") if p.is_file()]
    assert {p.relative_to(moved).as_posix() for p in files} >= {
        "Pulumi.yaml", "Pulumi.prod.yaml", "ansible.cfg", "gpupool.yml", ".gitignore",
        "program/__main__.py", "policy-pack/__main__.py", "policy-pack/PulumiPolicy.yaml",
        "inventory_plugins/gpupool.py", "strategy_plugins/mitogen_linear.py", "README.md"}
    named = {p.relative_to(moved).as_posix(): [o for o in outside if o in p.read_text()]
             for p in files}
    assert named == {rel: [] for rel in named}
    assert set((moved / ".gitignore").read_text().split()) >= {".cache/", f"{init.VENV}/"}


def test_what_the_pulumi_files_name_resolves_in_the_copy(moved: Path) -> None:
    project = yaml.safe_load((moved / "Pulumi.yaml").read_text())
    main = Path(project["main"])
    assert not main.is_absolute() and (moved / main / "__main__.py").is_file()
    venv = Path(project["runtime"]["options"]["virtualenv"])
    pack = yaml.safe_load((moved / init.PACK / "PulumiPolicy.yaml").read_text())
    pack_venv = Path(pack["runtime"]["options"]["virtualenv"])
    assert not venv.is_absolute() and not pack_venv.is_absolute()
    # The program and the pack share the project's virtualenv, and run gpupool's from it.
    assert (moved / venv).resolve() == (moved / init.PACK / pack_venv).resolve()
    for stub, package in (("program", "infra"), (init.PACK, "policies")):
        assert f"run_module({package!r}" in (moved / stub / "__main__.py").read_text()
        assert importlib.util.find_spec(f"{package}.__main__") is not None


def test_what_ansible_cfg_names_resolves_in_the_copy(moved: Path) -> None:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(moved / "ansible.cfg")
    defaults = cfg["defaults"]
    assert "roles_path" not in defaults  # gpupool playbook names the roles at run time
    for key in ("inventory", "inventory_plugins", "strategy_plugins"):
        assert not Path(defaults[key]).is_absolute() and (moved / defaults[key]).exists(), key
    # The plugins are gpupool's, as shipped.
    for kind, name in init.PLUGINS:
        assert (moved / kind / name).read_text() == (SHARE / kind / name).read_text()


def test_the_copy_validates_and_runs_gpupool_s_playbooks_from_a_subfolder(moved: Path) -> None:
    (moved / "deep").mkdir()
    proc = _gpupool(["validate", "--json"], moved / "deep")
    assert proc.returncode == 0 and json.loads(proc.stdout)["valid"], proc.stderr
    listed = _gpupool(["playbook", "--json"], moved / "deep")
    assert listed.returncode == 0, listed.stderr
    playbooks = json.loads(listed.stdout)["playbooks"]
    assert {"site", "onboard"} <= set(playbooks)
    proc = _gpupool(["playbook", "site", "--syntax-check"], moved / "deep")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert playbooks["site"] in proc.stdout  # the installed playbook, roles found
    proc = _gpupool(["playbook", "no_such"], moved / "deep")
    assert proc.returncode == cli.EXIT_USAGE and "site" in proc.stderr
