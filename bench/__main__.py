"""Run the benchmarks in bench/ (all of them, or those named), then render bench/RESULTS.md
and the README's figures from bench/results/.

    python -m bench                 # every benchmark (make bench)
    python -m bench plan replay     # only these
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import bench
from bench import report

# Not benchmarks: the figures' renderer.
NOT_BENCHMARKS = {"report"}


def names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(bench.__path__)
                  if not m.name.startswith("_") and m.name not in NOT_BENCHMARKS)


def run(selected: list[str]) -> int:
    unknown = sorted(set(selected) - set(names()))
    if unknown:
        print(f"no such benchmark: {', '.join(unknown)} (have: {', '.join(names())})",
              file=sys.stderr)
        return 2
    failed = []
    for name in selected or names():
        print(f"== bench.{name}", flush=True)
        if importlib.import_module(f"bench.{name}").main():
            failed.append(name)
    report.render_files()
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
