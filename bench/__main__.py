"""Run every benchmark module in bench/ (each exposes main())."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import bench


def run_all() -> int:
    names = sorted(m.name for m in pkgutil.iter_modules(bench.__path__)
                   if not m.name.startswith("_"))
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        if hasattr(module, "main"):
            print(f"== bench.{name}", flush=True)
            module.main()
    return 0


if __name__ == "__main__":
    sys.exit(run_all())
