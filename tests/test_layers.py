"""The package's layers hold: each module imports only from its own layer or the layers
below it, programs copied to hosts import nothing of gpupool, and no import cycle exists
among gpupool's, infra's and policies' modules (deferred imports included)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

PKG = ROOT / "gpupool"
# Layer -> the layers (and top-level packages) it may import. Lowest layer first.
ALLOWED: dict[str, set[str]] = {
    "paths": set(),
    "onhost": set(),
    "spec": {"paths"},
    "render": {"paths", "spec"},
    "workload": set(),
    "preview": {"paths", "spec", "render", "infra"},
    "gate": {"paths", "spec", "render"},
    "lab": {"paths", "spec", "render"},
    "exercise": {"paths", "spec", "render", "workload", "preview", "gate", "lab", "onhost"},
    "cli": {"paths", "spec", "render", "workload", "preview", "gate", "lab", "exercise",
            "onhost", "policies"},
    "__main__": {"cli"},
    "infra": {"paths", "spec", "render"},
    "policies": {"paths", "spec", "render", "preview"},
}


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if parts[0] == "gpupool" and len(parts) > 1 else parts[0]


def _imports(path: Path, top_level_only: bool, modules: set[str]) -> Iterator[str]:
    """The modules of ours that path imports."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from gpupool.render import slurm` imports the module gpupool.render.slurm;
            # `from gpupool.spec.model import X` imports gpupool.spec.model.
            subs = [f"{node.module}.{a.name}" for a in node.names]
            yield from [s for s in subs if s in modules] or [node.module]


def _sources() -> list[Path]:
    return sorted(p for d in ("gpupool", "infra", "policies") for p in (ROOT / d).rglob("*.py")
                  if "data" not in p.relative_to(ROOT).parts)




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
        if name not in modules:
            continue
        target = _layer(name)
        if target != layer and target not in ALLOWED[layer]:
            bad.add(name)
    assert not bad, f"{module} ({layer}) imports {sorted(bad)} from a layer above it"


def test_first_line_of_every_module_says_what_it_is() -> None:
    missing = [str(p.relative_to(ROOT)) for p in (PKG.rglob("*.py"))
               if "data" not in p.parts and p.stat().st_size
               and not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []


def test_no_import_cycle() -> None:
    sources = _sources()
    modules = {_module(p) for p in sources}
    graph = {_module(p): {n for n in _imports(p, top_level_only=False, modules=modules)
                             if n in modules}
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
