"""The package's layers hold: each module imports only from its own layer or the layers
below it, and only the third-party modules its layer needs; programs copied to hosts import
nothing of gpupool and only what their role installs from Debian; no import cycle exists
among gpupool's, infra's and policies' modules (deferred imports included).

Every import counts: `import a.b`, `from a import b`, relative imports (resolved to the
absolute name), deferred ones inside functions, and `importlib.import_module` / `__import__`
called with a string literal (an f-string's literal prefix counts as importing that package:
`import_module(f"gpupool.cli.commands.{verb}")` imports gpupool.cli.commands). A dynamic
import with no literal prefix must be listed in DYNAMIC with what it loads."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpupool.cli.registry import EXTRAS
from tests.conftest import ROOT

PKG = ROOT / "gpupool"
# The folders scanned, besides the role files (roles/*/files/*.py).
FOLDERS = ("gpupool", "infra", "policies", "bench", "inventory_plugins", "strategy_plugins")
# Top-level names that are ours: an import of one is checked against ALLOWED, never taken
# for a third-party module.
OURS = {*FOLDERS, "tests", "roles"}
# Layer -> the layers (and top-level folders) it may import. Lowest layer first.
# `paths` (gpupool/paths.py) is the leaf under spec: stdlib only, it says where the
# checkout, the shipped Ansible content and the vendored data are, so every layer that
# reads a file of gpupool's (spec's catalogue and loader, render's prices, the lab, the
# gate's bundle) may import it without importing the description's loader; onhost and
# workload need no file of gpupool's and do not. docs/architecture.md's table has it as
# its first (lowest) row; test_the_documented_table_matches_allowed compares the rest.
ALLOWED: dict[str, set[str]] = {
    "paths": set(),
    "onhost": set(),
    "spec": {"paths"},
    "render": {"paths", "spec"},
    # The merge gate's budget grammar is the description's (spec/budgets.py): validation
    # reads it, and the replay comparison judges by it.
    "workload": {"spec"},
    "preview": {"paths", "spec", "render", "infra"},
    "gate": {"paths", "spec", "render"},
    "lab": {"paths", "spec", "render"},
    "exercise": {"paths", "spec", "render", "workload", "preview", "gate", "lab", "onhost"},
    "cli": {"paths", "spec", "render", "workload", "preview", "gate", "lab", "exercise",
            "onhost", "policies"},
    "__main__": {"cli"},
    "infra": {"paths", "spec", "render"},
    "policies": {"paths", "spec", "render", "preview"},
    # Ansible plugins run in Ansible's Python and import gpupool lazily: the inventory
    # plugin loads the description (spec), builds the inventory (render) and finds the
    # project (paths); the strategy plugin is Mitogen's and needs nothing of gpupool.
    "inventory_plugins": {"paths", "spec", "render"},
    "strategy_plugins": set(),
    # Programs a role copies to hosts (roles/*/files/*.py) run under the node's python3.
    "roles": set(),
    # Benchmarks drive everything (and the integration tests' helpers); nothing imports them.
    "bench": {"paths", "onhost", "spec", "render", "workload", "preview", "gate", "lab",
              "exercise", "cli", "__main__", "infra", "policies", "tests"},
}

# Layer -> the third-party top-level modules it may import (stdlib is always allowed).
# Derived from what each layer does; a module outside the base install must come from
# an extra (gpupool/cli/registry.py's EXTRAS) or be in OUTSIDE_EXTRAS, so a verb whose
# extra is missing can say which to install.
THIRD_PARTY: dict[str, set[str]] = {
    "paths": set(),  # stdlib only: everything imports it, the lightest verbs included
    "__main__": set(),
    # The description's model and its YAML: the base install (validate, show, inventory).
    "spec": {"pydantic", "pydantic_core", "yaml"},
    # Pure renderers, description in, plain data out (YAML text for Ansible and Slurm): no
    # Pulumi, no Ansible, no plotting; what needs pulumi_aws lives in preview or infra.
    "render": {"yaml"},
    # Job-history analysis; the report extra's matplotlib draws the audit and replay plots.
    "workload": {"matplotlib"},
    # The program under Pulumi's mocks, manifests against jsonschema and
    # kubernetes-validate, pulumi_aws's classes asked which types take tags (aws_types):
    # the cloud extra; rich draws the plan's tree.
    "preview": {"pulumi", "pulumi_aws", "jsonschema", "kubernetes_validate", "yaml", "rich"},
    # What `gpupool gate --local` has on a GPU node: gpupool[gate] (pytest, testinfra;
    # packaging comes with pytest) and the base install's pydantic.
    "gate": {"pytest", "testinfra", "packaging", "pydantic"},
    # The podman lab: its YAML, and local AWS (moto, boto3) for the burst data plane.
    "lab": {"yaml", "boto3", "moto"},
    # The checkpoint archive drill speaks S3 to the lab's local AWS.
    "exercise": {"boto3"},
    "cli": {"rich", "yaml", "pydantic"},
    # The Pulumi program: the cloud extra's Pulumi and its AWS and Kubernetes providers.
    "infra": {"pulumi", "pulumi_aws", "pulumi_kubernetes"},
    # The policy pack: CrossGuard's SDK, Pulumi's types, YAML for the offline run.
    "policies": {"pulumi", "pulumi_policy", "yaml"},
    # Ansible plugins: Ansible's own API; the strategy plugin wraps Mitogen's.
    "inventory_plugins": {"ansible"},
    "strategy_plugins": {"ansible", "ansible_mitogen"},
    # onhost and roles: per program, in ON_HOST below. bench: anything (not checked).
}
# The base install (pyproject.toml's dependencies: pydantic with its pydantic_core,
# PyYAML, rich).
BASE = {"pydantic", "pydantic_core", "yaml", "rich"}
# Third-party modules gpupool imports that no extra brings, and why that is right.
OUTSIDE_EXTRAS = {
    "packaging": "pytest's own dependency, so gpupool[gate] has it",
    "boto3": "the dev group's: only the lab and its drills (local AWS) import it, deferred",
    "moto": "the dev group's: the lab's local AWS endpoint, imported deferred",
    "ansible_mitogen": "the lab extra's mitogen; only Ansible loads the strategy plugin",
}

# Programs that run on hosts under the node's Debian python3, with only the Debian
# packages their role installs: program (path from the root, without .py) -> (the role
# that installs it or None, the key of its package list in roles/<role>/vars/Debian.yml
# (dotted) or None, the third-party modules it may import, the sibling files the role
# copies beside it that it imports by their bare name). Every program has a row.
ON_HOST: dict[str, tuple[str | None, str | None, set[str], set[str]]] = {
    "gpupool/onhost/burst": ("slurm", "slurm_packages_burst", {"boto3", "botocore"}, set()),
    "gpupool/onhost/spot_watch": ("slurm", None, set(), set()),
    "gpupool/onhost/checkpoint_age": ("storage", "storage_packages.checkpoint_age",
                                      {"prometheus_client"}, {"prom_textfile"}),
    "gpupool/onhost/scratch_devices": ("storage", None, set(), set()),
    "gpupool/onhost/controller_backup": ("controller_backup", "controller_backup_packages",
                                         {"prometheus_client", "boto3"}, set()),
    "gpupool/onhost/idle_reclaim": ("idle_reclaim", "idle_reclaim_packages",
                                    {"prometheus_client"}, set()),
    "gpupool/onhost/slurm_exporter": ("slurm_exporter", "slurm_exporter_packages",
                                      {"prometheus_client"}, {"prom_textfile"}),
    "gpupool/onhost/web_password": ("monitoring", "monitoring_packages", {"bcrypt"}, set()),
    # Copied beside checkpoint_age and slurm_exporter by their roles; the gate runs it too.
    "gpupool/onhost/prom_textfile": (None, None, set(), set()),
    # The gate copies the burn-in to the node under test; PyTorch is the node's own, if
    # any (no role installs it): its import is guarded and a node without it exits 3.
    "gpupool/onhost/burn": (None, None, {"torch"}, set()),
    # The drills copy the reference job to the lab's shared folder; standard library only.
    "gpupool/onhost/reference_train": (None, None, set(), set()),
    "gpupool/onhost/__init__": (None, None, set(), set()),
    "roles/slurm/files/gpupool_sacct_apply": ("slurm", None, set(), set()),
}
# Debian's package for each module an on-host program may import (python3-boto3 depends
# on python3-botocore). A module not here is no Debian package: its import must be
# guarded (try/except ImportError).
DEBIAN = {"prometheus_client": "python3-prometheus-client", "boto3": "python3-boto3",
          "botocore": "python3-boto3", "bcrypt": "python3-bcrypt"}

# Dynamic imports with no literal prefix, and what they load.
DYNAMIC = {
    # Names from its MODULES table: pulumi_aws and pulumi_kubernetes packages (infra's).
    "infra/sdk.py": "pulumi_aws.*, pulumi_kubernetes.* (sdk.MODULES)",
}
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if parts[0] == "gpupool" and len(parts) > 1 else parts[0]


def _top(name: str) -> str:
    return name.partition(".")[0]


def _sources() -> list[Path]:
    return sorted([*(p for d in FOLDERS for p in (ROOT / d).rglob("*.py")
                     if "data" not in p.relative_to(ROOT).parts),
                   *ROOT.glob("roles/*/files/*.py")])


def _on_host(path: Path) -> bool:
    rel = path.relative_to(ROOT).parts
    return rel[:2] == ("gpupool", "onhost") or rel[0] == "roles"


def _literal_prefix(arg: ast.expr) -> str | None:
    """The module a string argument names: a literal, or an f-string's literal prefix up
    to its last dot (the package it imports from)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = str(arg.values[0].value)
        return prefix.rpartition(".")[0] or None
    return None


def _dynamic(node: ast.AST) -> ast.Call | None:
    if not isinstance(node, ast.Call) or not node.args:
        return None
    f = node.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    return node if name in ("import_module", "__import__") else None


def _imports(path: Path, top_level_only: bool, modules: set[str]) -> Iterator[str]:
    """The absolute names of the modules path imports."""
    yield from (name for name, _ in _imports_at(path, top_level_only, modules))


def _imports_at(path: Path, top_level_only: bool,
                modules: set[str]) -> Iterator[tuple[str, ast.AST]]:
    return _resolved(ast.parse(path.read_text()), _module(path), path.name == "__init__.py",
                     top_level_only, modules)


def _resolved(tree: ast.Module, module: str, is_package: bool, top_level_only: bool,
              modules: set[str]) -> Iterator[tuple[str, ast.AST]]:
    """(absolute name, node) for each import in module's tree."""
    package = module if is_package else module.rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from ((a.name, node) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # `from ..render import x` in gpupool.gate.y: gpupool.render
                parts = package.split(".")
                assert node.level <= len(parts), f"{module}: relative import above the root"
                anchor = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            # `from gpupool.render import slurm` imports the module gpupool.render.slurm;
            # `from gpupool.spec.model import X` imports gpupool.spec.model.
            subs = [f"{base}.{a.name}" for a in node.names]
            yield from ((s, node) for s in ([s for s in subs if s in modules] or [base]))
        elif (call := _dynamic(node)) is not None:
            name = _literal_prefix(call.args[0])
            if name is not None:
                yield name, node


# --- gpupool's layers -----------------------------------------------------------------


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_imports_only_its_layer_and_below(path: Path) -> None:
    module = _module(path)
    layer = _layer(module)
    if module == "gpupool":
        return
    assert layer in ALLOWED, f"{module}: its folder is not a known layer; add it to ALLOWED"
    modules = {_module(p) for p in _sources()}
    bad = set()
    for name in _imports(path, top_level_only=False, modules=modules):
        if _top(name) not in OURS or name == "gpupool":
            continue
        target = _layer(name)
        if target != layer and target not in ALLOWED[layer]:
            bad.add(name)
    assert not bad, f"{module} ({layer}) imports {sorted(bad)} from a layer it may not"


def test_nothing_imports_the_benchmarks_or_the_tests() -> None:
    allowed = {"bench": {"bench"}, "tests": {"bench"}}
    bad = [(_module(p), n) for p in _sources() for n in _imports(p, False, set())
           if _top(n) in allowed and _top(_module(p)) not in allowed[_top(n)]]
    assert bad == []


def test_relative_and_dynamic_imports_are_resolved() -> None:
    """The resolution this file relies on, on a throwaway module tree."""
    src = ("from . import sibling\nfrom .. import render\nfrom ..render import slurm\n"
           "from ..spec.model import X\nimport importlib\n"
           "def f(v):\n    importlib.import_module('gpupool.lab.hosts')\n"
           "    importlib.import_module(f'gpupool.cli.commands.{v}')\n"
           "    __import__('pulumi_aws')\n")
    modules = {"gpupool.gate.sibling", "gpupool.render", "gpupool.render.slurm",
               "gpupool.spec.model"}
    found = [n for n, _ in _resolved(ast.parse(src), "gpupool.gate.probe", False, False,
                                     modules)]
    in_init = [n for n, _ in _resolved(ast.parse("from . import x\nfrom .. import y\n"),
                                       "gpupool.gate", True, False, set())]
    assert in_init == ["gpupool.gate", "gpupool"]
    assert sorted(found) == sorted([
        "gpupool.gate.sibling", "gpupool.render", "gpupool.render.slurm",
        "gpupool.spec.model", "importlib", "gpupool.lab.hosts", "gpupool.cli.commands",
        "pulumi_aws"])


def test_every_dynamic_import_names_what_it_loads() -> None:
    """An import_module or __import__ whose argument has no literal prefix escapes the
    checks above; each must be listed in DYNAMIC with what it loads."""
    unnamed = sorted({str(p.relative_to(ROOT)) for p in _sources()
                      for n in ast.walk(ast.parse(p.read_text()))
                      if (c := _dynamic(n)) is not None and _literal_prefix(c.args[0]) is None})
    assert unnamed == sorted(DYNAMIC)


def test_the_documented_table_matches_allowed() -> None:
    """docs/architecture.md's layer table says what ALLOWED says (paths aside: its own
    first row, and ALLOWED's comment says who imports it)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## The package's layers", 1)[1]
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in table.splitlines() if line.startswith("| `gpupool/")]
    layers = [re.sub(r"[`/]", "", r[0]).removeprefix("gpupool").removesuffix(".py")
              for r in rows]
    assert "paths" in layers, "the table has no row for gpupool/paths.py"
    assert rows[layers.index("paths")][2] == "nothing of gpupool" and ALLOWED["paths"] == set()
    documented: dict[str, set[str]] = {}
    for i, (layer, row) in enumerate(zip(layers, rows, strict=True)):
        may = row[2]
        below = {x for x in layers[:i] if x != "paths"}
        if may in ("—", "nothing of gpupool"):
            names: set[str] = set()
        elif may == "all of the above":
            names = below
        else:
            names = {re.sub(r"[`/]", "", w).strip() for w in may.split(",")}
            if "everything" in names:
                names = (names - {"everything"}) | {x for x in layers if x not in (layer,
                                                                                 "paths")}
        documented[layer] = names
    assert {k: ALLOWED[k] - {"paths"} for k in documented if k != "paths"} == {
        k: v for k, v in documented.items() if k != "paths"}


# --- third-party imports --------------------------------------------------------------


def _third_party(path: Path, tree: ast.Module | None = None) -> dict[str, list[ast.AST]]:
    """Third-party top-level module -> the nodes importing it."""
    tree = tree or ast.parse(path.read_text())
    out: dict[str, list[ast.AST]] = {}
    for name, node in _resolved(tree, _module(path), path.name == "__init__.py", False, set()):
        if _top(name) not in STDLIB | OURS:
            out.setdefault(_top(name), []).append(node)
    return out


@pytest.mark.parametrize("path", [p for p in _sources() if not _on_host(p)
                                  and _layer(_module(p)) not in ("bench", "gpupool")],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_module_imports_only_its_layers_third_party(path: Path) -> None:
    layer = _layer(_module(path))
    assert layer in THIRD_PARTY, f"{_module(path)}: add its layer to THIRD_PARTY"
    bad = sorted(set(_third_party(path)) - THIRD_PARTY[layer])
    assert bad == [], f"{_module(path)} ({layer}) imports {bad}, not its layer's"


def test_third_party_table_is_used_and_declared() -> None:
    used: dict[str, set[str]] = {}
    for p in _sources():
        if not _on_host(p) and _layer(_module(p)) in THIRD_PARTY:
            used.setdefault(_layer(_module(p)), set()).update(_third_party(p))
    stale = {k: v - used.get(k, set()) for k, v in THIRD_PARTY.items() if v - used.get(k, set())}
    assert stale == {}, "THIRD_PARTY allows modules its layer no longer imports"
    undeclared = {m for v in THIRD_PARTY.values() for m in v} - BASE - set(EXTRAS) - set(
        OUTSIDE_EXTRAS)
    assert undeclared == set(), "comes from no extra: add it to one, or to OUTSIDE_EXTRAS"


# --- programs that run on hosts -------------------------------------------------------


def _guarded(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside a try whose handler catches ImportError."""
    out: set[int] = set()
    for t in ast.walk(tree):
        if isinstance(t, ast.Try) and any(
                h.type is not None and {"ImportError", "ModuleNotFoundError"}
                & {n.id for n in ast.walk(h.type) if isinstance(n, ast.Name)}
                for h in t.handlers):
            out |= {id(n) for s in t.body for n in ast.walk(s)}
    return out


def _packages(role: str, key: str) -> list[str]:
    value = yaml.safe_load((ROOT / "roles" / role / "vars" / "Debian.yml").read_text())
    for part in key.split("."):
        value = value[part]
    return list(value)


def test_every_program_on_hosts_has_a_row() -> None:
    programs = {str(p.relative_to(ROOT).with_suffix("")) for p in _sources() if _on_host(p)}
    assert programs == set(ON_HOST)


@pytest.mark.parametrize("program", sorted(ON_HOST))
def test_program_on_hosts_imports_only_what_its_role_installs(program: str) -> None:
    role, key, allowed, siblings = ON_HOST[program]
    path = ROOT / f"{program}.py"
    tree = ast.parse(path.read_text())
    guarded = _guarded(tree)
    third = _third_party(path, tree)
    # Siblings: imported by bare name on the host, as gpupool.onhost.X in the package.
    bare = {m for m in third if m in siblings}
    assert sorted(set(third) - allowed - bare) == [], f"{program}: not on the host"
    assert allowed <= set(third), f"{program}: ON_HOST allows modules it no longer imports"
    ours = {f"gpupool.onhost.{s}" for s in siblings}
    for name, node in _resolved(tree, _module(path), False, False, ours):
        if _top(name) in OURS:  # only a guarded fallback of a sibling the role copies
            assert id(node) in guarded and name.rpartition(".")[2] in siblings, (
                f"{program} imports {name}: on the host there is no gpupool")
    for m, nodes in third.items():
        if m in siblings:  # the fallback in the except clause (checked above)
            continue
        if m not in DEBIAN:
            assert all(id(n) in guarded for n in nodes), f"{program}: unguarded {m}"
            continue
        assert role is not None and key is not None, f"{program}: {m} from which role?"
        assert DEBIAN[m] in _packages(role, key), f"role {role} does not install {DEBIAN[m]}"
    if role is not None:
        texts = [p.read_text() for p in (ROOT / "roles" / role).rglob("*.yml")]
        assert any(f"{path.name}" in t for t in texts), f"role {role} does not install it"
        for s in siblings:
            assert any(f"{s}.py" in t for t in texts), f"role {role} does not copy {s}.py"


# --- the rest -------------------------------------------------------------------------


def test_first_line_of_every_module_says_what_it_is() -> None:
    missing = [str(p.relative_to(ROOT)) for p in (PKG.rglob("*.py"))
               if "data" not in p.parts and p.stat().st_size
               and not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []


def test_no_import_cycle() -> None:
    sources = _sources()
    modules = {_module(p) for p in sources}
    # A package's own dynamic import of its modules (bench: f"bench.{name}") is no edge.
    graph = {_module(p): {n for n in _imports(p, top_level_only=False, modules=modules)
                             if n in modules and n != _module(p)}
             for p in sources}
    seen: dict[str, int] = {}  # 1 on the current path, 2 done
    stack: list[str] = []

    def visit(m: str) -> None:
        seen[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if seen.get(n) == 1:
                pytest.fail("import cycle: " + " -> ".join([*stack[stack.index(n):], n]))
            elif n not in seen:
                visit(n)
        stack.pop()
        seen[m] = 2

    for m in sorted(graph):
        if m not in seen:
            visit(m)


def test_basenames_are_unique_outside_the_verbs() -> None:
    names = [p.stem for p in PKG.rglob("*.py") if p.stem not in ("__init__", "__main__")
             and "commands" not in p.parts and "suites" not in p.parts]
    assert sorted({n for n in names if names.count(n) > 1}) == []
