"""The package's layers hold: each module imports only from its own layer or the layers
below it, and only the third-party modules its layer needs; programs copied to hosts (a
role's, gpupool/onhost's, the lab's fixtures, Python inside a role's shell template) import
nothing of gpupool and only what their host installs from Debian; docs/architecture.md's
layer table says what ALLOWED says; no import cycle exists among the scanned modules
(deferred imports included).

Every import counts: `import a.b`, `from a import b`, relative imports (resolved to the
absolute name), deferred ones inside functions, and `importlib.import_module` / `__import__`
called with a string literal, positional or `name=` (an f-string's literal prefix counts as
importing that package: `import_module(f"gpupool.cli.commands.{verb}")` imports
gpupool.cli.commands; `import_module(".x", __package__)` is resolved like `from . import x`).
A dynamic import with no literal prefix must be listed in DYNAMIC with what it loads.
Every tracked Python file but the tests and the vendored data is scanned
(test_every_python_file_is_scanned), and each check is proven failing on a planted
violation (the tests at the end, on tmp_path trees)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpupool.cli.registry import EXTRAS
from tests.conftest import ROOT

PKG = ROOT / "gpupool"
# The folders scanned, besides every Python program under roles/ (_sources). scripts/ holds
# no Python today; one added there is scanned and fails until its layer is in ALLOWED.
FOLDERS = ("gpupool", "infra", "policies", "bench", "inventory_plugins", "strategy_plugins",
           "scripts")
# Top-level names that are ours: an import of one is checked against ALLOWED, never taken
# for a third-party module.
OURS = {*FOLDERS, "tests", "roles"}
# Tracked Python that no layer holds: the tests import whatever they test, and the vendored
# data is third-party's.
UNSCANNED = ("tests/", "gpupool/data/")
# Layer -> the layers (and top-level folders) it may import. Lowest layer first.
# `paths` (gpupool/paths.py) is the leaf under spec: stdlib only, it says where the
# checkout, the shipped Ansible content and the vendored data are, so every layer that
# reads a file of gpupool's (spec's catalogue and loader, render's prices, the lab, the
# gate's bundle) may import it without importing the description's loader; onhost and
# workload need no file of gpupool's and do not. docs/architecture.md's table has it as
# its first (lowest) row; test_the_documented_table_matches_allowed compares the rest.
ALLOWED: dict[str, set[str]] = {
    # gpupool/__init__.py runs before any module of the package, in every layer and on the
    # hosts that run the gate: it imports nothing of gpupool.
    "gpupool": set(),
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
    # `python -m gpupool` (gpupool/__main__.py): the CLI's entry point, no row of the table.
    "__main__": {"cli"},
    "infra": {"paths", "spec", "render"},
    "policies": {"paths", "spec", "render", "preview"},
    # Ansible plugins run in Ansible's Python and import gpupool lazily: the inventory
    # plugin loads the description (spec), builds the inventory (render) and finds the
    # project (paths); the strategy plugin is Mitogen's and needs nothing of gpupool.
    "inventory_plugins": {"paths", "spec", "render"},
    "strategy_plugins": set(),
    # Benchmarks drive everything (the CLI's start-up included, and the integration tests'
    # helpers); nothing imports them. Not gpupool/__main__.py: importing it runs the CLI
    # and exits.
    "bench": {"paths", "onhost", "spec", "render", "workload", "preview", "gate", "lab",
              "exercise", "cli", "infra", "policies", "tests"},
}

# Layer -> the third-party top-level modules it may import (stdlib is always allowed).
# Derived from what each layer does; a module outside the base install must come from
# an extra (gpupool/cli/registry.py's EXTRAS) or be in OUTSIDE_EXTRAS, so a verb whose
# extra is missing can say which to install.
THIRD_PARTY: dict[str, set[str]] = {
    "gpupool": set(),  # runs first in every layer, the gate's nodes included
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
    # Benchmarks run in the development environment (`make bootstrap`: all extras and the
    # dev group); bench/exporter.py measures the scheduler exporter's prometheus_client
    # rendering.
    "bench": {"yaml", "prometheus_client"},
    # onhost and roles: per program, in ON_HOST below.
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
    "prometheus_client": "the dev group's, for the benchmarks; on hosts Debian's (ON_HOST)",
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
    "gpupool/onhost/oci_runtime": ("slurm_containers", "slurm_containers_packages", set(),
                                   set()),
    "gpupool/onhost/image_pull": ("image_registry", "image_registry__client_packages", set(),
                                  {"tool_run"}),
    # Copied beside image_pull and registry_prune by their role.
    "gpupool/onhost/tool_run": ("image_registry", None, set(), set()),
    "gpupool/onhost/registry_prune": ("image_registry", "image_registry__server_packages",
                                      set(), {"tool_run"}),
    # Copied beside checkpoint_age and slurm_exporter by their roles; the gate runs it too.
    "gpupool/onhost/prom_textfile": (None, None, set(), set()),
    # The gate copies the burn-in to the node under test; PyTorch is the node's own, if
    # any (no role installs it): its import is guarded and a node without it exits 3.
    "gpupool/onhost/burn": (None, None, {"torch"}, set()),
    # The drills copy the reference job to the lab's shared folder; standard library only.
    "gpupool/onhost/reference_train": (None, None, set(), set()),
    "gpupool/onhost/__init__": (None, None, set(), set()),
    # The lab's fixtures, programs with a shebang run by the lab hosts' python3, where there
    # is no gpupool: the lab mirror packs this one as /usr/bin/dcgm-exporter
    # (gpupool/lab/mirror.py), the burst image installs the metadata service
    # (gpupool/lab/burst_image.py). Standard library only.
    "gpupool/lab/fixture_dcgm_exporter": (None, None, set(), set()),
    "gpupool/lab/fixture_imds": (None, None, set(), set()),
    "gpupool/onhost/sacct_apply": ("slurm", None, set(), set()),
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
# Python a role's shell script or template feeds to the host's python3 on its standard
# input (`python3 - ARGS <<'PY'` ... `PY`): checked like an on-host program.
HEREDOC = re.compile(r"python3?\b[^\n]*<<-?\s*['\"]?(\w+)['\"]?\n(.*?)\n\s*\1\n", re.S)
# Where such Python may hide: what Ansible copies or templates onto hosts.
HOST_TEXT = ("roles/", "playbooks/")


def _module(path: Path, root: Path = ROOT) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if parts[0] == "gpupool" and len(parts) > 1 else parts[0]


def _top(name: str) -> str:
    return name.partition(".")[0]


def _shebang(path: Path) -> bool:
    """The file's first line runs python: a program executed as it is."""
    with path.open("rb") as f:
        return re.match(rb"#!.*python", f.readline()) is not None


def _is_python(path: Path) -> bool:
    """A Python source: a .py file, or a file with no suffix that runs python (an Ansible
    module in roles/*/library, an executable in roles/*/files)."""
    return path.suffix == ".py" or (not path.suffix and _shebang(path))


def _sources(root: Path = ROOT) -> list[Path]:
    found = [*(p for d in FOLDERS for p in (root / d).rglob("*.py")),
             *(p for p in (root / "roles").rglob("*") if p.is_file() and _is_python(p))]
    return sorted(p for p in found if not str(p.relative_to(root)).startswith(UNSCANNED))


SOURCES = _sources()
MODULES = {_module(p) for p in SOURCES}


def _runs_on_hosts(path: Path, root: Path = ROOT) -> bool:
    """Copied to a host and run by its python3, where there is no gpupool: gpupool/onhost,
    roles/, and any program with a python shebang (the lab's fixtures)."""
    rel = path.relative_to(root).parts
    return rel[:2] == ("gpupool", "onhost") or rel[0] == "roles" or _shebang(path)


def _literal_prefix(arg: ast.expr | None) -> str | None:
    """The module a string argument names: a literal, or an f-string's literal prefix up
    to its last dot (the package it imports from)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = str(arg.values[0].value)
        return prefix.rpartition(".")[0] or None
    return None


def _dynamic(node: ast.AST) -> ast.Call | None:
    """node, if it calls import_module or __import__ (however reached: importlib's, a
    from-import's)."""
    if not isinstance(node, ast.Call):
        return None
    f = node.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    return node if name in ("import_module", "__import__") else None


def _argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    """A call's argument, given positionally or by keyword (`import_module(name=...)`)."""
    if len(call.args) > position:
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def _absolute(package: str, level: int, name: str, module: str) -> str:
    """A relative import's absolute name: level dots up from package (`from ..render import
    x` in gpupool.gate.y, or `import_module("..render", __package__)`: gpupool.render)."""
    parts = package.split(".")
    assert level <= len(parts), f"{module}: relative import above the root"
    anchor = ".".join(parts[:len(parts) - level + 1])
    return f"{anchor}.{name}" if name else anchor


def _imports(path: Path, modules: set[str], root: Path = ROOT) -> Iterator[str]:
    """The absolute names of the modules path imports."""
    tree = ast.parse(path.read_text())
    yield from (name for name, _ in _resolved(tree, _module(path, root),
                                              path.name == "__init__.py", modules))


def _resolved(tree: ast.Module, module: str, is_package: bool,
              modules: set[str]) -> Iterator[tuple[str, ast.AST]]:
    """(absolute name, node) for each import in module's tree, deferred ones included."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((a.name, node) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = _absolute(package, node.level, base, module)
            # `from gpupool.render import slurm` imports the module gpupool.render.slurm;
            # `from gpupool.spec.model import X` imports gpupool.spec.model.
            subs = [f"{base}.{a.name}" for a in node.names]
            yield from ((s, node) for s in ([s for s in subs if s in modules] or [base]))
        elif (call := _dynamic(node)) is not None:
            name = _literal_prefix(_argument(call, 0, "name"))
            if name is not None and name.startswith("."):
                # import_module's relative name is resolved against its package argument:
                # a literal, or else the module's own (`__package__`, what code passes).
                anchor = _literal_prefix(_argument(call, 1, "package")) or package
                stripped = name.lstrip(".")
                name = _absolute(anchor, len(name) - len(stripped), stripped, module)
            if name is not None:
                yield name, node


# --- gpupool's layers -----------------------------------------------------------------


def _layer_violations(path: Path, modules: set[str], root: Path = ROOT) -> list[str]:
    """The modules path imports from a layer its own may not import (ALLOWED)."""
    layer = _layer(_module(path, root))
    if layer not in ALLOWED:
        return [f"{_module(path, root)}: its folder is not a known layer; add it to ALLOWED"]
    return sorted({name for name in _imports(path, modules, root)
                   if _top(name) in OURS and name != "gpupool"
                   and _layer(name) != layer and _layer(name) not in ALLOWED[layer]})


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_imports_only_its_layer_and_below(path: Path) -> None:
    bad = _layer_violations(path, MODULES)
    assert bad == [], f"{_module(path)} imports {bad} from a layer it may not"


def test_programs_for_hosts_live_in_one_place() -> None:
    """Issue 55: a program a role puts on hosts lives in gpupool/onhost (its role's defaults
    name it by role_path), never in roles/*/files: one place to find, lint and test them."""
    assert [str(p.relative_to(ROOT)) for p in SOURCES if p.parts[len(ROOT.parts)] == "roles"] \
        == []


def test_every_layer_has_modules() -> None:
    """ALLOWED names the layers there are (a layer gone leaves no stale row), and nothing
    imports the benchmarks or the tests (no layer lists them but the benchmarks)."""
    assert set(ALLOWED) == {_layer(m) for m in MODULES}
    assert [k for k, v in ALLOWED.items() if v & {"bench", "tests"} and k != "bench"] == []


def test_relative_and_dynamic_imports_are_resolved() -> None:
    """The resolution this file relies on, on a throwaway module tree."""
    src = ("from . import sibling\nfrom .. import render\nfrom ..render import slurm\n"
           "from ..spec.model import X\nimport importlib\n"
           "def f(v):\n    importlib.import_module('gpupool.lab.hosts')\n"
           "    importlib.import_module(f'gpupool.cli.commands.{v}')\n"
           "    importlib.import_module(name='gpupool.exercise')\n"
           "    importlib.import_module('..workload', __package__)\n"
           "    importlib.import_module('.x', package='gpupool.preview')\n"
           "    __import__('pulumi_aws')\n")
    modules = {"gpupool.gate.sibling", "gpupool.render", "gpupool.render.slurm",
               "gpupool.spec.model"}
    found = [n for n, _ in _resolved(ast.parse(src), "gpupool.gate.probe", False, modules)]
    in_init = [n for n, _ in _resolved(ast.parse("from . import x\nfrom .. import y\n"),
                                       "gpupool.gate", True, set())]
    assert in_init == ["gpupool.gate", "gpupool"]
    assert sorted(found) == sorted([
        "gpupool.gate.sibling", "gpupool.render", "gpupool.render.slurm",
        "gpupool.spec.model", "importlib", "gpupool.lab.hosts", "gpupool.cli.commands",
        "gpupool.exercise", "gpupool.workload", "gpupool.preview.x", "pulumi_aws"])


def _unnamed_dynamic(sources: list[Path], root: Path = ROOT) -> list[str]:
    """The files with an import_module or __import__ whose argument has no literal prefix."""
    return sorted({str(p.relative_to(root)) for p in sources
                   for n in ast.walk(ast.parse(p.read_text()))
                   if (c := _dynamic(n)) is not None
                   and _literal_prefix(_argument(c, 0, "name")) is None})


def test_every_dynamic_import_names_what_it_loads() -> None:
    """A dynamic import with no literal prefix escapes the checks above; each must be
    listed in DYNAMIC with what it loads."""
    assert _unnamed_dynamic(SOURCES) == sorted(DYNAMIC)


def _unscanned(tracked: list[str], root: Path = ROOT) -> list[str]:
    """The tracked Python files (of git ls-files' names) that no check reads."""
    scanned = {str(p.relative_to(root)) for p in _sources(root)}
    return sorted(f for f in tracked if f not in scanned and not f.startswith(UNSCANNED)
                  and (root / f).is_file() and (_is_python(root / f) or f.endswith(".py.j2")))


def test_every_python_file_is_scanned() -> None:
    """A Python file outside the scanned folders (a top-level script, a role's templated
    program) would escape every check: each must be scanned or be in UNSCANNED."""
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert _unscanned(tracked.split()) == []


def _package_layers(package: Path = PKG) -> set[str]:
    """The layers the documented table must have a row for: gpupool's subpackages and
    top-level modules, but its __init__ and `python -m gpupool`'s __main__."""
    return {p.name.removesuffix(".py") for p in package.iterdir()
            if p.name not in ("data", "__pycache__", "__init__.py", "__main__.py")
            and (p.is_dir() or p.suffix == ".py")}


def _names(cell: str) -> set[str]:
    """Layer names in a table cell or a phrase: `spec/`, render, `infra/` ..."""
    return {re.sub(r"[`/]", "", w).strip() for w in re.split(r",|\band\b", cell)} - {""}


def _table_problems(text: str, allowed: dict[str, set[str]],
                    package_layers: set[str]) -> list[str]:
    """Where docs/architecture.md's layer table (lowest first) and its paragraph on infra/
    and policies/ disagree with allowed. The table's rows leave paths out but in its own
    row, which names the layers that may not import it ("all but ...")."""
    table = text.split("## The package's layers", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in table.splitlines() if line.startswith("| `gpupool/")]
    layers = [re.sub(r"[`/]", "", r[0]).removeprefix("gpupool").removesuffix(".py")
              for r in rows]
    if not layers or layers[0] != "paths":
        return ["the table's first (lowest) row is not gpupool/paths.py"]
    problems = [f"{sorted(package_layers - set(layers))} have no row"] \
        if package_layers - set(layers) else []
    problems += [f"rows for no layer: {sorted(set(layers) - package_layers)}"] \
        if set(layers) - package_layers else []
    if rows[0][2] != "nothing of gpupool" or allowed.get("paths"):
        problems.append("paths may import nothing of gpupool")
    but = re.search(r"all but (.+)$", rows[0][1])
    without = {x for x in layers[1:] if "paths" not in allowed.get(x, set())}
    if but is None or _names(but.group(1)) != without:
        problems.append(f"the paths row should say all but {sorted(without)}")
    for i, (layer, row) in enumerate(zip(layers, rows, strict=True)):
        if i == 0:
            continue
        if row[2] in ("—", "nothing of gpupool"):
            names: set[str] = set()
        elif row[2] == "all of the above":
            names = set(layers[1:i])
        else:
            names = _names(row[2])
            if "everything" in names:
                names = (names - {"everything"}) | (set(layers[1:]) - {layer})
        if upward := sorted(names & set(layers) - set(layers[:i])):
            problems.append(f"{layer} may import {upward}, rows above it (lowest first)")
        if names != allowed.get(layer, set()) - {"paths"}:
            problems.append(f"{layer}: the table says {sorted(names)}, ALLOWED "
                            f"{sorted(allowed.get(layer, set()) - {'paths'})}")
    # "`infra/` and `policies/` import only paths, spec and render (`policies/offline.py`
    # also the preview's mocks, ...)": infra's list, and policies' with the layers named in
    # the parenthesis.
    prose = re.search(r"`infra/` and `policies/` import only ([^(]+)\(([^)]+)\)", table)
    if prose is None:
        return [*problems, "no sentence says what infra/ and policies/ import"]
    listed = _names(prose.group(1))
    also = {x for x in layers if re.search(rf"\b{x}\b", prose.group(2))}
    if listed != allowed.get("infra") or listed | also != allowed.get("policies"):
        problems.append(f"infra/ and policies/ import {sorted(listed)} (policies also "
                        f"{sorted(also)}): not what ALLOWED says")
    return problems


def test_the_documented_table_matches_allowed() -> None:
    """docs/architecture.md's layer table says what ALLOWED says, with a row for every
    layer of the package and in order; README.md has no layer table of its own (its
    index points at docs/architecture.md)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert _table_problems(text, ALLOWED, _package_layers()) == []


# --- third-party imports --------------------------------------------------------------


def _third_party(tree: ast.Module, module: str, is_package: bool) -> dict[str, list[ast.AST]]:
    """Third-party top-level module -> the nodes importing it."""
    out: dict[str, list[ast.AST]] = {}
    for name, node in _resolved(tree, module, is_package, set()):
        if _top(name) not in STDLIB | OURS:
            out.setdefault(_top(name), []).append(node)
    return out


def _third_party_of(path: Path, root: Path = ROOT) -> dict[str, list[ast.AST]]:
    return _third_party(ast.parse(path.read_text()), _module(path, root),
                        path.name == "__init__.py")


def _third_party_violations(path: Path, root: Path = ROOT) -> list[str]:
    """The third-party modules path imports that its layer may not (THIRD_PARTY)."""
    layer = _layer(_module(path, root))
    if layer not in THIRD_PARTY:
        return [f"{_module(path, root)}: add its layer to THIRD_PARTY"]
    return sorted(set(_third_party_of(path, root)) - THIRD_PARTY[layer])


@pytest.mark.parametrize("path", [p for p in SOURCES if not _runs_on_hosts(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_module_imports_only_its_layers_third_party(path: Path) -> None:
    bad = _third_party_violations(path)
    assert bad == [], f"{_module(path)} imports {bad}, not its layer's"


def test_third_party_table_is_used_and_declared() -> None:
    used: dict[str, set[str]] = {}
    for p in SOURCES:
        if not _runs_on_hosts(p) and _layer(_module(p)) in THIRD_PARTY:
            used.setdefault(_layer(_module(p)), set()).update(_third_party_of(p))
    stale = {k: v - used.get(k, set()) for k, v in THIRD_PARTY.items() if v - used.get(k, set())}
    assert stale == {}, "THIRD_PARTY allows modules its layer no longer imports"
    undeclared = {m for v in THIRD_PARTY.values() for m in v} - BASE - set(EXTRAS) - set(
        OUTSIDE_EXTRAS)
    assert undeclared == set(), "comes from no extra: add it to one, or to OUTSIDE_EXTRAS"


def test_the_gate_needs_only_what_its_bundle_installs() -> None:
    """A GPU node runs the gate from gpupool/gate/bundle.py's archive: gpupool with the base
    install and the gate extra. What the gate's layer and the layers below it import must
    come from those (packaging: pytest's own dependency)."""
    layers = {"gate", *ALLOWED["gate"]}
    needed = {m for layer in layers for m in THIRD_PARTY[layer]}
    installed = BASE | {m for m, extra in EXTRAS.items() if extra == "gate"} | {"packaging"}
    assert needed - installed == set()


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


def _packages(role: str, key: str, root: Path = ROOT) -> list[str]:
    value = yaml.safe_load((root / "roles" / role / "vars" / "Debian.yml").read_text())
    for part in key.split("."):
        value = value[part]
    return list(value)


def _host_problems(path: Path, row: tuple[str | None, str | None, set[str], set[str]],
                   root: Path = ROOT) -> list[str]:
    """Why a program run by a host's python3 (its ON_HOST row) would fail to import
    there: it imports gpupool, or a module its role does not install from Debian (unless
    guarded), or its role does not copy it and the siblings it imports."""
    role, key, allowed, siblings = row
    tree = ast.parse(path.read_text())
    guarded = _guarded(tree)
    module, is_package = _module(path, root), path.name == "__init__.py"
    third = _third_party(tree, module, is_package)
    problems = []
    # Siblings: imported by bare name on the host, as gpupool.onhost.X in the package.
    if extra := sorted(set(third) - allowed - siblings):
        problems.append(f"imports {extra}, which the host does not have")
    if stale := sorted(allowed - set(third)):
        problems.append(f"ON_HOST allows {stale}, which it no longer imports")
    ours = {f"gpupool.onhost.{s}" for s in siblings}
    for name, node in _resolved(tree, module, is_package, ours):
        # Only a guarded fallback to a sibling the role copies may name gpupool.
        if _top(name) in OURS and not (id(node) in guarded
                                       and name.rpartition(".")[2] in siblings):
            problems.append(f"imports {name}: on the host there is no gpupool")
    for m, nodes in third.items():
        if m in siblings or m not in allowed:  # the fallback above; or reported already
            continue
        if m not in DEBIAN:
            if not all(id(n) in guarded for n in nodes):
                problems.append(f"{m} is no Debian package: its import must be guarded")
        elif role is None or key is None:
            problems.append(f"{m}: which role installs it?")
        elif DEBIAN[m] not in _packages(role, key, root):
            problems.append(f"role {role} does not install {DEBIAN[m]}")
    if role is not None:
        texts = [p.read_text() for p in (root / "roles" / role).rglob("*.yml")]
        problems += [f"role {role} does not copy {name}"
                     for name in [path.name, *(f"{s}.py" for s in sorted(siblings))]
                     if not any(name in t for t in texts)]
    return problems


def test_every_program_on_hosts_has_a_row() -> None:
    programs = {str(p.relative_to(ROOT).with_suffix("")) for p in SOURCES if _runs_on_hosts(p)}
    assert programs == set(ON_HOST)


@pytest.mark.parametrize("program", sorted(ON_HOST))
def test_program_on_hosts_imports_only_what_its_role_installs(program: str) -> None:
    assert _host_problems(ROOT / f"{program}.py", ON_HOST[program]) == []


def _heredoc_problems(text: str) -> list[str]:
    """The imports of Python fed to a host's python3 inside a shell script (HEREDOC) that
    are not the standard library's."""
    return [f"python3 <<{m.group(1)} imports {name}" for m in HEREDOC.finditer(text)
            for name, _ in _resolved(ast.parse(m.group(2)), "heredoc", False, set())
            if _top(name) not in STDLIB]


def test_python_in_roles_shell_imports_only_the_standard_library() -> None:
    tracked = subprocess.run(["git", "ls-files", *HOST_TEXT], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    texts = {f: (ROOT / f).read_text(errors="replace") for f in tracked
             if not _is_python(ROOT / f)}
    assert "roles/dcgm/templates/gpupool-dcgm-health.sh.j2" in [
        f for f, t in texts.items() if HEREDOC.search(t)], "HEREDOC finds no Python"
    assert {f: p for f, t in texts.items() if (p := _heredoc_problems(t))} == {}
# --- the rest -------------------------------------------------------------------------


def test_first_line_of_every_module_says_what_it_is() -> None:
    missing = [str(p.relative_to(ROOT)) for p in (PKG.rglob("*.py"))
               if "data" not in p.parts and p.stat().st_size
               and not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []


def test_no_import_cycle() -> None:
    # A package's own dynamic import of its modules (bench: f"bench.{name}") is no edge.
    graph = {_module(p): {n for n in _imports(p, MODULES) if n in MODULES and n != _module(p)}
             for p in SOURCES}
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


# --- each check fails on a planted violation ------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> dict[str, Path]:
    """Write files (path from root -> text) and return their paths."""
    out = {}
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        out[name] = path
    return out


def test_planted_layer_violations_fail(tmp_path: Path) -> None:
    """An import up a layer fails whichever way it is written, deferred or not."""
    files = _tree(tmp_path, {
        "gpupool/__init__.py": "from gpupool.cli import main\n",
        "gpupool/cli/main.py": "",
        "gpupool/render/up.py": "def f():\n    from ..cli import main\n",
        "gpupool/render/ok.py": "from . import up\nfrom ..spec import model\n",
        "gpupool/spec/model.py": "import importlib\nimportlib.import_module('gpupool.lab.hosts')\n",
        "gpupool/spec/named.py": "import importlib\nimportlib.import_module(name='gpupool.lab')\n",
        "gpupool/spec/rel.py": "import importlib\n"
                               "importlib.import_module('..render', __package__)\n",
        "gpupool/spec/fstr.py": "def f(v):\n    __import__(f'gpupool.cli.commands.{v}')\n",
        "gpupool/cli/bench_user.py": "import bench.plan\n",
        "gpupool/cli/tests_user.py": "from tests import conftest\n",
        "bench/cli_user.py": "from gpupool.cli import main\nfrom tests import conftest\n",
        "bench/entry.py": "import gpupool.__main__\n",
        "scripts/tool.py": "import gpupool.paths\n",
    })
    modules = {_module(p, tmp_path) for p in files.values()}
    bad = {name: _layer_violations(p, modules, tmp_path) for name, p in files.items()}
    assert bad == {
        "gpupool/__init__.py": ["gpupool.cli.main"],
        "gpupool/cli/main.py": [],
        "gpupool/render/up.py": ["gpupool.cli.main"],
        "gpupool/render/ok.py": [],
        "gpupool/spec/model.py": ["gpupool.lab.hosts"],
        "gpupool/spec/named.py": ["gpupool.lab"],
        "gpupool/spec/rel.py": ["gpupool.render"],
        "gpupool/spec/fstr.py": ["gpupool.cli.commands"],
        "gpupool/cli/bench_user.py": ["bench.plan"],
        "gpupool/cli/tests_user.py": ["tests"],
        # The benchmarks drive the CLI and use the tests' helpers; not `python -m gpupool`.
        "bench/cli_user.py": [],
        "bench/entry.py": ["gpupool.__main__"],
        "scripts/tool.py": ["scripts.tool: its folder is not a known layer; add it to ALLOWED"],
    }


def test_planted_unnamed_dynamic_import_and_unscanned_file_fail(tmp_path: Path) -> None:
    files = _tree(tmp_path, {
        "gpupool/lab/load.py": "import importlib\nNAME = 'x'\nimportlib.import_module(NAME)\n",
        "gpupool/lab/kw.py": "import importlib\ndef f(v):\n    importlib.import_module(name=v)\n",
        "gpupool/lab/fine.py": "import importlib\nimportlib.import_module('gpupool.spec')\n",
        "roles/r/library/module": "#!/usr/bin/python3\nimport yaml\n",
        "roles/r/templates/prog.py.j2": "import {{ x }}\n",
        "monitoring/check.py": "import json\n",
        "tests/test_x.py": "import gpupool\n",
    })
    assert _unnamed_dynamic(_sources(tmp_path), tmp_path) == ["gpupool/lab/kw.py",
                                                              "gpupool/lab/load.py"]
    assert tmp_path / "roles/r/library/module" in _sources(tmp_path)
    assert _unscanned(sorted(files), tmp_path) == ["monitoring/check.py",
                                                   "roles/r/templates/prog.py.j2"]


def test_planted_third_party_violations_fail(tmp_path: Path) -> None:
    files = _tree(tmp_path, {
        "gpupool/render/cloud.py": "def f():\n    import pulumi_aws\n",
        "gpupool/render/dyn.py": "__import__('pulumi')\n",
        "gpupool/spec/model.py": "import pydantic\nimport yaml\nimport rich\n",
        "gpupool/paths.py": "import yaml\n",
        "bench/plot.py": "import matplotlib\nimport yaml\n",
        "inventory_plugins/gpupool.py": "from ansible.plugins import inventory\n",
    })
    bad = {name: _third_party_violations(p, tmp_path) for name, p in files.items()}
    assert bad == {"gpupool/render/cloud.py": ["pulumi_aws"], "gpupool/render/dyn.py": ["pulumi"],
                   "gpupool/spec/model.py": ["rich"], "gpupool/paths.py": ["yaml"],
                   "bench/plot.py": ["matplotlib"], "inventory_plugins/gpupool.py": []}


def test_planted_host_violations_fail(tmp_path: Path) -> None:
    files = _tree(tmp_path, {
        "roles/r/vars/Debian.yml": "r_packages: [python3-bcrypt]\n",
        "roles/r/tasks/main.yml": "- copy: {src: prog.py}\n- copy: {src: guarded.py}\n",
        "roles/r/files/prog.py": "import prometheus_client\nfrom gpupool.spec import loader\n",
        "roles/r/files/guarded.py": "try:\n    import torch\nexcept ImportError:\n"
                                    "    torch = None\nimport bcrypt\n",
        "gpupool/onhost/deb.py": "import yaml\nimport importlib\n"
                                 "importlib.import_module('gpupool')\n",
        # The package's copy first (tests, the control host), else the role's beside it.
        "gpupool/onhost/sib.py": "try:\n    from . import prom_textfile\nexcept ImportError:\n"
                                 "    import prom_textfile\n",
        "gpupool/onhost/unguarded.py": "import torch\nfrom . import prom_textfile\n",
        "gpupool/lab/fixture.py": "#!/usr/bin/python3\nfrom gpupool.spec import model\n",
        "gpupool/lab/hosts.py": "from gpupool.spec import model\n",
    })
    host = {n: p for n, p in files.items() if n.endswith(".py") and _runs_on_hosts(p, tmp_path)}
    assert sorted(host) == ["gpupool/lab/fixture.py", "gpupool/onhost/deb.py",
                            "gpupool/onhost/sib.py", "gpupool/onhost/unguarded.py",
                            "roles/r/files/guarded.py", "roles/r/files/prog.py"]
    rows: dict[str, tuple[str | None, str | None, set[str], set[str]]] = {
        "roles/r/files/prog.py": ("r", "r_packages", {"prometheus_client"}, set()),
        "roles/r/files/guarded.py": ("r", "r_packages", {"torch", "bcrypt"}, set()),
        "gpupool/onhost/deb.py": (None, None, set(), set()),
        "gpupool/onhost/sib.py": ("r", None, set(), {"prom_textfile"}),
        "gpupool/onhost/unguarded.py": (None, None, {"torch"}, {"prom_textfile"}),
        "gpupool/lab/fixture.py": (None, None, set(), set()),
    }
    assert {n: _host_problems(host[n], row, tmp_path) for n, row in rows.items()} == {
        "roles/r/files/prog.py": ["imports gpupool.spec: on the host there is no gpupool",
                                  "role r does not install python3-prometheus-client"],
        "roles/r/files/guarded.py": [],
        "gpupool/onhost/deb.py": ["imports ['yaml'], which the host does not have",
                                  "imports gpupool: on the host there is no gpupool"],
        "gpupool/onhost/sib.py": ["role r does not copy sib.py",
                                  "role r does not copy prom_textfile.py"],
        "gpupool/onhost/unguarded.py": [
            "imports gpupool.onhost.prom_textfile: on the host there is no gpupool",
            "torch is no Debian package: its import must be guarded"],
        "gpupool/lab/fixture.py": ["imports gpupool.spec: on the host there is no gpupool"],
    }
    assert _heredoc_problems("python3 - \"$a\" <<'PY'\nimport json, yaml\nPY\n") == [
        "python3 <<PY imports yaml"]
    assert _heredoc_problems("python3 <<EOF\nimport json\nEOF\n") == []


def test_planted_table_disagreements_fail() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    layers = _package_layers()
    row = {line.split("`")[1]: line for line in text.splitlines() if line.startswith("| `")}
    render_row, lab_row = row["gpupool/render/"], row["gpupool/lab/"]
    assert _table_problems(text, ALLOWED, layers) == []
    upward = render_row.replace("| spec |", "| spec, lab |")
    assert _table_problems(text.replace(render_row, upward), ALLOWED, layers) == [
        "render may import ['lab'], rows above it (lowest first)",
        "render: the table says ['lab', 'spec'], ALLOWED ['spec']"]
    assert _table_problems(text.replace(lab_row + "\n", ""), ALLOWED, layers)[0] == (
        "['lab'] have no row")
    assert _table_problems(text, ALLOWED, layers - {"lab"}) == ["rows for no layer: ['lab']"]
    wider = {**ALLOWED, "workload": {"spec", "paths"}, "infra": {"paths", "spec", "render", "gate"}}
    assert _table_problems(text, wider, layers) == [
        "the paths row should say all but ['onhost']",
        "infra/ and policies/ import ['paths', 'render', 'spec'] (policies also ['preview']): "
        "not what ALLOWED says"]
    assert _table_problems(text, ALLOWED, layers | {"newlayer"}) == ["['newlayer'] have no row"]
