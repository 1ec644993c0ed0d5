"""CPU time of the light `gpupool` verbs (validate, show, inventory) on the lab stack, as a
user runs them: a fresh interpreter each time, bytecode cache warm (one untimed run
first). Target (issue 13): under 0.3 CPU-seconds each, which holds only while these verbs
import neither Pulumi nor matplotlib.

Figures: bench/results/cli_startup.json, with the command, commit, CPU count and date.
"""

from __future__ import annotations

import datetime
import os
import resource
import statistics
import subprocess
import sys
from typing import Any

import bench
from gpupool.paths import PROJECT_ROOT

VERBS = ("validate", "show", "inventory")
RUNS = 7


def _cpu_s(argv: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=PROJECT_ROOT, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def heavy_modules(verb: str) -> list[str]:
    """Which heavy libraries the verb loads (none, if the imports stay lazy)."""
    code = ("import sys; from gpupool import cli; cli.main(sys.argv[1:]); "
            "print('HEAVY=' + ' '.join(sorted({'pulumi', 'pulumi_aws', 'matplotlib', 'boto3', "
            "'ansible', 'jsonschema'} & set(sys.modules))))")
    out = subprocess.run([sys.executable, "-c", code, verb, "--stack", "lab"], check=True,
                         capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=60).stdout
    return out.rpartition("HEAVY=")[2].split()


def main() -> dict[str, Any]:
    gpupool = str(PROJECT_ROOT / ".venv" / "bin" / "gpupool")
    verbs = {}
    for verb in VERBS:
        argv = [gpupool, verb, "--stack", "lab"]
        _cpu_s(argv)  # warm the bytecode cache
        samples = [_cpu_s(argv) for _ in range(RUNS)]
        verbs[verb] = {"cpu_s_median": round(statistics.median(samples), 3),
                       "cpu_s_max": round(max(samples), 3), "runs": RUNS,
                       "heavy_modules_loaded": heavy_modules(verb)}
        print(f"{verb:10s} median {verbs[verb]['cpu_s_median']:.3f} CPU-s "
              f"(max {verbs[verb]['cpu_s_max']:.3f}) over {RUNS} runs")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=PROJECT_ROOT, check=False).stdout.strip()
    figures = {"command": "python -m bench.cli_startup", "commit": commit,
               "cpus": os.cpu_count(),
               "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
               "target_cpu_s": 0.3, "verbs": verbs}
    print(f"wrote {bench.write('cli_startup', figures)}")
    return figures


if __name__ == "__main__":
    main()
