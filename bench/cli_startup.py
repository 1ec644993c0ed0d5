"""CPU time of the light `gpupool` verbs (validate, show, inventory) on the lab stack, as a
user runs them: a fresh interpreter each time, bytecode cache warm (one untimed run
first). Target (issue 13): under 0.3 CPU-seconds each, which holds only while these verbs
import neither Pulumi nor matplotlib.

    python -m bench cli_startup     # writes bench/results/cli_startup.json
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys

import bench
from gpupool.paths import PROJECT_ROOT

VERBS = ("validate", "show", "inventory")
# And `gpupool --help` and `--version`, which import no verb's module (issue 52).
BARE = ("--help", "--version")
RUNS = 7
SHAPE = {"target_cpu_s": float,
         "verbs": {str: {"cpu_s_median": float, "cpu_s_max": float, "runs": int,
                         "heavy_modules_loaded": [str]}}}


def _cpu_s(argv: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=PROJECT_ROOT, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def heavy_modules(verb: str) -> list[str]:
    """Which heavy libraries the verb (or --help, --version) loads (none, if the imports
    stay lazy)."""
    code = ("import sys\nfrom gpupool import cli\ntry:\n    cli.main(sys.argv[1:])\n"
            "except SystemExit:\n    pass\n"
            "print('HEAVY=' + ' '.join(sorted({'pulumi', 'pulumi_aws', 'matplotlib', 'boto3', "
            "'ansible', 'jsonschema'} & set(sys.modules))))")
    argv = [verb] if verb in BARE else [verb, "--stack", "lab"]
    out = subprocess.run([sys.executable, "-c", code, *argv], check=True,
                         capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=60).stdout
    return out.rpartition("HEAVY=")[2].split()


def main() -> int:
    gpupool = str(PROJECT_ROOT / ".venv" / "bin" / "gpupool")
    verbs = {}
    for verb in (*VERBS, *BARE):
        argv = [gpupool, verb] if verb in BARE else [gpupool, verb, "--stack", "lab"]
        _cpu_s(argv)  # warm the bytecode cache
        samples = [_cpu_s(argv) for _ in range(RUNS)]
        verbs[verb] = {"cpu_s_median": round(statistics.median(samples), 3),
                       "cpu_s_max": round(max(samples), 3), "runs": RUNS,
                       "heavy_modules_loaded": heavy_modules(verb)}
        print(f"{verb:10s} median {verbs[verb]['cpu_s_median']:.3f} CPU-s "
              f"(max {verbs[verb]['cpu_s_max']:.3f}) over {RUNS} runs")
    figures = {"target_cpu_s": 0.3, "verbs": verbs}
    print(f"wrote {bench.write('cli_startup', figures, 'python -m bench cli_startup')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
