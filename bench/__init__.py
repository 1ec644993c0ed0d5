"""Benchmarks and the figures they write.

Each module here is named after the results file it writes, `bench/results/<module>.json`,
and has `main()` (which measures, or runs the integration test that measures) and `SHAPE`
(what the file holds). Every file is written through `write()`, never by hand: it checks
the figures against the writer's SHAPE, adds the provenance (the command, the commit and
whether the tree had local changes, the CPU count, the date) and a digest of the figures,
so `tests/test_bench_results.py` fails on a file that was edited or typed in. The test
suite measures as it proves, but writes its figures under .cache/figures/ (it sets
GPUPOOL_FIGURES_DIR): only a benchmark run changes bench/results/.
`python -m bench [NAME ...]` (make bench) runs them and renders bench/RESULTS.md.

A shape is a plain literal: a type (`int`, `float` also takes an int, `str`, `bool`;
`object` takes anything: a report passed through whole), a
tuple of alternatives (`(float, None)`), `[shape]` for a list of such items, `{str: shape}`
for a mapping with any keys, or a dict with exactly the keys given (a key ending in "?"
may be absent: a figure only some runs measure; a key `...` gives the shape of any other
keys, beside the named ones).
"""

from __future__ import annotations

import configparser
import datetime
import hashlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpupool.paths import ANSIBLE_CONFIG

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
FIGURES_DIR = "GPUPOOL_FIGURES_DIR"  # where write() puts results files; RESULTS if unset
PROVENANCE = {"command": str, "commit": str, "local_changes": bool, "cpus": int, "date": str,
              "digest": str, "ansible_strategy?": str}


def mismatches(value: Any, shape: Any, where: str = "") -> list[str]:
    """Where value departs from shape (empty when it conforms)."""
    here = where or "the figures"
    if isinstance(shape, tuple):
        tries = [mismatches(value, s, where) for s in shape]
        return [] if any(not t for t in tries) else [
            f"{here}: {value!r} matches none of {len(shape)} alternatives"]
    if isinstance(shape, list):
        if not isinstance(value, list):
            return [f"{here}: not a list"]
        return [m for i, v in enumerate(value) for m in mismatches(v, shape[0], f"{where}[{i}]")]
    if isinstance(shape, dict):
        return _mapping_mismatches(value, shape, where)
    if shape is object:
        ok = True
    elif shape is None:
        ok = value is None
    elif shape is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = type(value) is shape
    return [] if ok else [f"{here}: {value!r} is not {getattr(shape, '__name__', shape)}"]


def _mapping_mismatches(value: Any, shape: dict[Any, Any], where: str) -> list[str]:
    here = where or "the figures"
    if not isinstance(value, dict):
        return [f"{here}: not a mapping"]

    def at(key: str) -> str:
        return f"{where}.{key}" if where else key

    if list(shape) == [str]:
        return [m for k, v in value.items() for m in mismatches(v, shape[str], at(k))]
    keys = {k.removesuffix("?"): s for k, s in shape.items() if k is not ...}
    if ... in shape:
        keys |= {k: shape[...] for k in value if k not in keys}
    found = [f"{here}: unexpected key {k!r}" for k in value if k not in keys]
    found += [f"{here}: missing key {k!r}" for k in shape
              if k is not ... and not k.endswith("?") and k not in value]
    return found + [m for k, s in keys.items() if k in value
                    for m in mismatches(value[k], s, at(k))]


def digest(figures: Any) -> str:
    return hashlib.sha256(json.dumps(figures, sort_keys=True).encode()).hexdigest()


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT,
                          check=False, timeout=30).stdout.strip()


def ansible_strategy() -> str:
    """The strategy playbooks run under: ANSIBLE_STRATEGY where set, else the one the
    Ansible settings gpupool runs with name (ansible.cfg), else Ansible's default."""
    if wanted := os.environ.get("ANSIBLE_STRATEGY"):
        return wanted
    settings = configparser.ConfigParser(interpolation=None)
    settings.read(os.environ.get("ANSIBLE_CONFIG") or ANSIBLE_CONFIG)
    return settings.get("defaults", "strategy", fallback="linear")


def provenance(command: str, figures: Any) -> dict[str, Any]:
    return {"command": command, "commit": _git("rev-parse", "HEAD") or "unknown",
            # Results and prose do not count (a run rewrites the results and renders
            # RESULTS.md and the README's figures as it goes); code and configuration do.
            "local_changes": bool(_git("status", "--porcelain", "--", ".",
                                       ":(exclude)bench/results", ":(exclude,glob)**/*.md")),
            "cpus": os.cpu_count() or 0,
            # Playbook timings depend on it (tests/integration/conftest.py: playbook_strategy).
            "ansible_strategy": ansible_strategy(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "digest": digest(figures)}


def shape_of(name: str) -> Any:
    return importlib.import_module(f"bench.{name}").SHAPE


def write(name: str, figures: dict[str, Any], command: str | None = None) -> Path:
    """Write bench/results/<name>.json: the figures, checked against bench.<name>.SHAPE,
    with their provenance. command: how to rerun it (default: the running command)."""
    wrong = mismatches(figures, shape_of(name))
    if wrong:
        raise ValueError(f"bench.{name}: the figures do not match its SHAPE: {wrong[:5]}")
    command = command or " ".join(["python", *sys.argv]).replace(str(ROOT) + "/", "")
    folder = Path(os.environ.get(FIGURES_DIR) or RESULTS)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    data = {"provenance": provenance(command, figures), "figures": figures}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def measured(argv: list[str], cwd: Path, timeout_s: float, ok: tuple[int, ...] = (0,),
             stdout: Path | None = None) -> dict[str, Any]:
    """One command as a user runs it: wall time, CPU time and peak memory of its own
    process (wait4's rusage, not the benchmark's), its exit code, and where stdout is kept,
    its size. Killed past timeout_s; an exit code not in ok prints the end of stderr."""
    with tempfile.TemporaryFile("w+") as errors, \
            (stdout.open("wb") if stdout else open(os.devnull, "wb")) as out:
        t = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=errors)
        deadline = t + timeout_s
        while not (reaped := os.wait4(proc.pid, os.WNOHANG))[0]:
            if time.perf_counter() > deadline:
                proc.kill()
            time.sleep(0.02)
        wall = time.perf_counter() - t
        proc.returncode = code = os.waitstatus_to_exitcode(reaped[1])
        usage = reaped[2]
        if code not in ok:
            errors.seek(0)
            print(f"  {' '.join(argv)} exited {code}: {errors.read()[-500:]}")
    return {"wall_s": round(wall, 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "exit": code,
            **({"output_mib": round(stdout.stat().st_size / 2**20, 2)} if stdout else {})}


def run_tests(*paths: str) -> int:
    """Run integration tests that measure and write their own figures; their exit code."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:warnings",
                           "-m", "integration", *paths], cwd=ROOT, check=False,
                          env={**os.environ, FIGURES_DIR: str(RESULTS)}).returncode


def problems(path: Path) -> list[str]:
    """Why a results file is not one its writer produced (empty when it is)."""
    name = path.stem
    try:
        data = json.loads(path.read_text())
        shape = shape_of(name)
    except (OSError, ValueError) as e:
        return [f"{path.name}: {e}"]
    except (ImportError, AttributeError):
        return [f"{path.name}: no bench/{name}.py with a SHAPE writes it"]
    if not isinstance(data, dict) or set(data) != {"provenance", "figures"}:
        return [f"{path.name}: not {{provenance, figures}}"]
    found = mismatches(data["provenance"], PROVENANCE, "provenance")
    found += mismatches(data["figures"], shape)
    if not found and data["provenance"]["digest"] != digest(data["figures"]):
        found.append(f"{path.name}: the figures differ from what was written "
                     "(digest mismatch): edited by hand?")
    return found
