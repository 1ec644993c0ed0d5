"""`gpupool[gate]` (the base dependencies and the gate extra) is all a GPU node needs: the
gate's on-node path (and `validate`) import nothing of Pulumi, Ansible, matplotlib,
jsonschema or kubernetes_validate, and the base dependencies bring none of them.

Two checks, cheapest first: in this venv, those modules stay out of sys.modules; and in an
interpreter that sees only the extra's packages (and what they require), taken from this
venv, the gate's modules import, its suites collect and `validate` passes. (A fresh venv
would need the package index, which tests may not reach: the second check stands in.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from gpupool.gate import bundle
from tests.conftest import ROOT

HEAVY = ("pulumi", "pulumi_aws", "pulumi_kubernetes", "pulumi_policy", "ansible",
         "matplotlib", "jsonschema", "kubernetes_validate", "boto3")
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# What `pip install gpupool[gate]` brings: the base dependencies and the extra's.
GATE_EXTRA = [*PROJECT["dependencies"], *PROJECT["optional-dependencies"]["gate"]]

# What a node runs: the `gate` verb (its module, the runner, the pytest plugin), the
# suites pytest loads, and the description's loader; then `validate` on the lab stack.
PROBE = """
import importlib.util, sys
from pathlib import Path
from gpupool.cli import build_parser, main
build_parser("gate")
import gpupool.gate.actions, gpupool.gate.expect, gpupool.gate.nvidia, gpupool.gate.plugin
import gpupool.gate.runner
for path in sorted(Path("gpupool/gate/suites").glob("*.py")):
    spec = importlib.util.spec_from_file_location(f"suite_{path.stem}", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
code = main(["validate", "--stack", "lab"])
print("HEAVY=" + " ".join(sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)))
sys.exit(code)
"""


def _probe(argv: list[str], env: dict[str, str] | None = None, path: tuple[Path, ...] = ()
           ) -> list[str]:
    """The heavy modules PROBE loaded under this interpreter, with path put first on
    sys.path."""
    code = f"import sys; sys.path[:0] = {[str(p) for p in path]!r}\nHEAVY = {HEAVY!r}\n{PROBE}"
    proc = subprocess.run([*argv, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.rpartition("HEAVY=")[2].split()


def test_gate_and_validate_load_no_heavy_module() -> None:
    assert _probe([sys.executable]) == []


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def _closure(requirements: list[str]) -> list[metadata.Distribution]:
    """The installed distributions the requirements need, transitively (extras of theirs
    that nothing asks for left out)."""
    found: dict[str, metadata.Distribution] = {}
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in found or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        found[name] = dist = metadata.distribution(name)
        todo += [Requirement(r) for r in dist.requires or []]
    return list(found.values())


def test_the_gate_extra_is_enough(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    dists = _closure(GATE_EXTRA)
    for dist in dists:
        base = Path(str(dist.locate_file("")))
        tops = {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] != ".."}
        for top in tops - {"bin", "__pycache__"}:
            if (base / top).exists() and not (site / top).exists():
                (site / top).symlink_to(base / top)
    names = {d.metadata["Name"].lower() for d in dists}
    assert not names & {"pulumi", "ansible", "ansible-core", "matplotlib", "jsonschema",
                        "kubernetes-validate"}, names
    # -S: no site-packages; only the extra's packages and the checkout are importable.
    assert _probe([sys.executable, "-S"], _clean_env(), (site, ROOT)) == []


def test_the_base_install_is_light_and_all_is_everything() -> None:
    """The base dependencies validate a description and nothing heavy comes with them;
    `gpupool[all]` names every other extra."""
    base = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower()
            for d in _closure(PROJECT["dependencies"])}
    assert not base & {"pulumi", "pulumi-aws", "ansible", "ansible-core", "matplotlib",
                       "jsonschema", "kubernetes-validate", "pytest"}, base
    extras = PROJECT["optional-dependencies"]
    assert extras["all"] == [f"gpupool[{','.join(e for e in extras if e != 'all')}]"]


def test_a_verb_without_its_extra_says_which_to_install(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from gpupool import cli  # noqa: PLC0415
    from gpupool.preview import plan  # noqa: PLC0415

    def missing(*_a: object, **_k: object) -> object:
        raise ModuleNotFoundError("No module named 'pulumi'", name="pulumi")

    monkeypatch.setattr(plan, "declare", missing)
    assert cli.main(["plan", "--stack", "lab"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "pip install 'gpupool[cloud]'" in err and "Traceback" not in err


def test_the_nodes_gate_bundle_holds_what_gpupool_gate_installs() -> None:
    """gpupool.gate.bundle packs, for the nodes, the base dependencies and the gate
    extra at uv.lock's versions (the extra alone once left pydantic out, and every node's
    health loop failed to start)."""
    names = {r.split("==")[0] for r in bundle.requirements()}
    direct = {Requirement(r).name for r in GATE_EXTRA}
    assert direct <= names, direct - names
    assert not names & set(HEAVY), names & set(HEAVY)


def test_the_gate_bundle_is_packed_once_for_the_same_inputs(tmp_path: Path) -> None:
    """Every play packs the gate (roles/acceptance_gate): a second run with the same
    checkout leaves the archive as it is; an archive changed since is packed again, to the
    same bytes."""
    out = tmp_path / "gate-bundle.tar.gz"

    def pack() -> None:
        subprocess.run([sys.executable, "-m", "gpupool.gate.bundle", str(out)],
                       check=True, timeout=600, capture_output=True)

    pack()
    packed, written = out.read_bytes(), out.stat().st_mtime_ns
    pack()
    assert out.stat().st_mtime_ns == written
    out.write_bytes(b"not the archive")
    pack()
    assert out.read_bytes() == packed


@pytest.mark.parametrize("python", ["3.12", "3", "3.13; rm -rf /", ""])
def test_the_gate_bundle_refuses_a_python_no_node_runs(python: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """The archive is packed for a Debian release's CPython (3.11 on 12, 3.13 on 13): any
    other --python is refused with the ones it takes, and nothing is written."""
    out = tmp_path / "gate-bundle.tar.gz"
    assert bundle.main([str(out), "--python", python]) == 2
    assert "--python must be one of 3.11, 3.13" in capsys.readouterr().err
    assert not out.exists()

