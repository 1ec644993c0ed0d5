"""gpupool installed from its wheel, used from a folder of one's own: the wheel carries the
roles, playbooks, inventory plugin, starter descriptions and on-host programs
(paths.SHARE), and a project `gpupool init` makes there validates, plans, passes the
policy pack, and gives Ansible an inventory and playbooks that parse.

The wheel is built by hatchling (the build backend pyproject.toml names) from the files git
tracks, and unpacked rather than installed: installing would need the package index for
its dependencies, and this venv already has them. The unpacked copy comes first on
sys.path, so nothing below can reach the checkout's own files.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from gpupool.cli import registry
from gpupool.gate import bundle
from tests.conftest import ROOT
from tests.test_extras import PROJECT, _closure

BIN = Path(sys.executable).parent
# A role's files outside itself, reached as "{{ role_path }}/../../<path>".
OUTSIDE = re.compile(r"\{\{ role_path \}\}/\.\./\.\./([\w./-]+)")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from the tracked files."""
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist = tmp / "src", tmp / "dist"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True, timeout=60).stdout.decode().split("\0")
    for rel in filter(None, tracked):
        dest = src / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / rel).is_symlink() or not (ROOT / rel).exists():
            continue
        dest.write_bytes((ROOT / rel).read_bytes())
    subprocess.run([sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d",
                    str(dist)], cwd=src, check=True, capture_output=True, timeout=120)
    (built,) = dist.glob("gpupool-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, unpacked: its site-packages."""
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as z:
        assert not [n for n in z.namelist() if "__pycache__" in n]
        z.extractall(site)  # noqa: S202 (the wheel this test just built, not a tar)
    return site


@pytest.fixture(scope="module")
def base_install(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip install gpupool` without an extra, in a fresh venv: pip installs the wheel (its
    `gpupool` script included) without the package index, and the base dependencies (and
    what they require) are this venv's, seen through a .pth file. Its bin folder."""
    venv = tmp_path_factory.mktemp("base") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120,
                   capture_output=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    "--no-index", "--no-deps", str(wheel)], check=True, timeout=120,
                   capture_output=True)
    deps = venv.parent / "deps"
    deps.mkdir()
    for dist in _closure(PROJECT["dependencies"]):
        base = Path(str(dist.locate_file("")))
        for top in {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] != ".."}:
            if top not in {"bin", "__pycache__"} and (base / top).exists() \
                    and not (deps / top).exists():
                (deps / top).symlink_to(base / top)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "base-dependencies.pth").write_text(f"{deps}\n")
    return venv / "bin"


def _run(argv: list[str], cwd: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "ANSIBLE_"))}
    env |= {"PYTHONPATH": str(site), "PATH": f"{BIN}:{env.get('PATH', '')}"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def test_the_wheel_carries_what_the_roles_reach_outside_themselves(installed: Path) -> None:
    share = installed / "gpupool" / "share"
    reached = {m.group(1) for p in (ROOT / "roles").rglob("*.yml")
               for m in OUTSIDE.finditer(p.read_text())}
    assert reached, "the roles reach no file outside themselves any more: drop this test"
    assert sorted(r for r in reached if not (share / r).exists()) == []
    assert (share / "inventory_plugins" / "gpupool.py").is_file()
    assert (installed / "policies" / "PulumiPolicy.yaml").is_file()


def test_a_project_outside_the_checkout_works_from_the_installed_wheel(
        installed: Path, tmp_path: Path) -> None:
    py = [sys.executable, "-m", "gpupool"]
    proc = _run([*py, "init", "mine", "--from", "lab", "--stack", "prod"], tmp_path, installed)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    project = tmp_path / "mine"
    share = installed / "gpupool" / "share"
    # The project names nothing of the installed package (tests/test_init_portable.py).
    assert not [p for p in project.rglob("*") if p.is_file() and str(installed) in p.read_text()]
    for verb in (["validate"], ["plan"], ["policy"]):
        proc = _run([*py, *verb], project, installed)
        assert proc.returncode == 0, f"{verb}: {proc.stdout}{proc.stderr}"
    # Ansible, in the project: the inventory plugin reads the description; the playbooks
    # and roles come from the wheel, through `gpupool playbook`.
    proc = _run([str(BIN / "ansible-inventory"), "--graph"], project, installed)
    assert proc.returncode == 0 and "lab-gpu1" in proc.stdout, proc.stdout + proc.stderr
    for playbook in ("site", "onboard"):
        proc = _run([*py, "playbook", playbook, "--syntax-check"], project, installed)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert str(share / "playbooks" / f"{playbook}.yml") in proc.stdout
    # A play runs under the wheel's strategy plugin (Mitogen's, with this venv's Mitogen),
    # and what the roles make on the control host goes to the project's .cache, not into
    # the installed package.
    play = tmp_path / "ping.yml"
    defaults = [str(share / "roles" / r / "defaults" / "main.yml")
                for r in ("acceptance_gate", "admission")]
    # The archive is named for the node's Python (the role's vars): here, this one's.
    defaults.append(str(share / "roles" / "acceptance_gate" / "vars" / "main.yml"))
    play.write_text(json.dumps([{
        "hosts": "localhost", "gather_facts": True, "vars_files": defaults, "tasks": [
            {"ansible.builtin.ping": None},
            {"ansible.builtin.debug": {"msg": "made: {{ acceptance_gate_bundle }}"}}]}]))
    proc = _run([str(BIN / "ansible-playbook"), str(play)], project, installed)
    assert proc.returncode == 0 and "ok=3" in proc.stdout, proc.stdout + proc.stderr
    assert "Mitogen is not installed" not in proc.stdout + proc.stderr
    made = re.search(r"made: (\S+?)['\"]", proc.stdout)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert made and made.group(1) == str(project / ".cache" / f"gate-bundle-py{python}.tar.gz"
                                         ), proc.stdout


def test_the_gate_bundle_packs_from_the_installed_wheel(installed: Path, tmp_path: Path) -> None:
    """An installed gpupool has no uv.lock: role acceptance_gate's packer resolves gpupool's
    declared requirements under the versions this environment runs, which (this venv being
    synced from uv.lock) are the lock's: the same packages as the checkout packs."""
    assert not (installed / "uv.lock").exists()
    out = tmp_path / "gate-bundle.tar.gz"
    proc = _run([sys.executable, "-m", "gpupool.gate.bundle", str(out)], tmp_path, installed)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with tarfile.open(out) as tar:
        names = tar.getnames()
    assert "lib/gpupool/gate/boot.py" in names
    assert not [n for n in names if n.startswith("lib/gpupool/share/")]
    dists = {top.removesuffix(".dist-info") for n in names
             if (top := n.split("/")[1]).endswith(".dist-info")}
    packed = {(canonicalize_name(d.rsplit("-", 1)[0]), d.rsplit("-", 1)[1]) for d in dists}
    locked = {(canonicalize_name(r.split("==")[0]), r.split("==")[1])
              for r in bundle.requirements()}
    assert packed == locked


def _bare(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """argv with nothing of this venv's or the checkout's on its paths."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def test_the_base_install_helps_with_every_verb_and_names_the_missing_extra(
        base_install: Path, tmp_path: Path) -> None:
    gpupool = str(base_install / "gpupool")
    heavy = _bare([str(base_install / "python"), "-c",
                   "import importlib.util as u; print([m for m in ('pulumi', 'ansible', "
                   "'pytest', 'matplotlib') if u.find_spec(m)])"], tmp_path)
    assert heavy.stdout.strip() == "[]", "the base venv sees an extra's packages"
    for argv in (["--help"], ["--version"], *([verb, "--help"] for verb in registry.VERBS)):
        proc = _bare([gpupool, *argv], tmp_path)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, \
            f"{argv}: {proc.stdout}{proc.stderr}"
        if argv[0] in registry.VERBS:
            assert proc.stdout.startswith(f"usage: gpupool {argv[0]}"), proc.stdout
    typo = _bare([gpupool, "valdiate"], tmp_path)
    assert typo.returncode == 2 and "invalid choice" in typo.stderr, typo.stderr
    assert "Traceback" not in typo.stderr
    gate = _bare([gpupool, "gate", "--help"], tmp_path)
    assert "pip install 'gpupool[gate]'" in " ".join(gate.stdout.split()), gate.stdout
    # In a project of its own, the light verbs run; each heavy one names its extra, exit 2.
    assert _bare([gpupool, "init", "mine"], tmp_path).returncode == 0
    project = tmp_path / "mine"
    for argv in (["validate"], ["show"], ["inventory"], ["slurm", "render"],
                 ["policy", "--list"]):
        proc = _bare([gpupool, *argv], project)
        assert proc.returncode == 0, f"{argv}: {proc.stdout}{proc.stderr}"
    for argv, extra in ((["plan"], "cloud"), (["policy"], "cloud"),
                        (["gate", "--tier", "quick"], "gate")):
        proc = _bare([gpupool, *argv], project)
        assert proc.returncode == 2 and f"pip install 'gpupool[{extra}]'" in proc.stderr, \
            f"{argv}: {proc.stdout}{proc.stderr}"
        assert "Traceback" not in proc.stderr
