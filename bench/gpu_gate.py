"""The GPU tier of the acceptance gate on a real NVIDIA GPU host: `scripts/gpu-gate.sh` (a
positive burn-in run against the host's description, then a negative run with one GPU too
many that must fail on gpu.gpu_count), its two reports kept whole.

Only on a host with an NVIDIA GPU (the device tool's lent machine, for one): elsewhere it
says so and writes nothing. The last run recorded by hand is
tests/gate/fixtures/gpu-gate-h200.recorded.json.

    python -m bench gpu_gate [DESCRIPTION NODE]   # default: tests/fixtures/device-h200.yaml
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import bench

OUT = bench.ROOT / ".cache" / "gpu-gate"
SCRIPT_TIMEOUT_S = 1800
_REPORT = {"node": str, "tier": str, "verdict": str, "duration_s": float,
           "counts": {str: int}, "failed": [str], ...: object}
SHAPE = {"script_exit": int, "script_wall_s": float, "nvidia_smi_query": [str],
         "positive": _REPORT, "negative": _REPORT}


def main(argv: list[str] | None = None) -> int:
    if shutil.which("nvidia-smi") is None:
        print("no nvidia-smi here: the GPU gate needs an NVIDIA GPU host; nothing written")
        return 0
    args = list(argv or [])
    node = args[1] if len(args) > 1 else "gpu-host"
    t = time.monotonic()
    proc = subprocess.run(["bash", "scripts/gpu-gate.sh", *args], cwd=bench.ROOT, check=False,
                          env={**os.environ, "OUT": str(OUT)},
                          timeout=SCRIPT_TIMEOUT_S)
    wall = time.monotonic() - t
    reports = {run: OUT / run / f"{node}.json" for run in ("positive", "negative")}
    if missing := [str(p) for p in reports.values() if not p.exists()]:
        print(f"scripts/gpu-gate.sh exited {proc.returncode} without {', '.join(missing)}")
        return proc.returncode or 1
    query = OUT / "nvidia-smi-query.csv"
    figures = {"script_exit": proc.returncode, "script_wall_s": round(wall, 1),
               "nvidia_smi_query": query.read_text().splitlines() if query.exists() else [],
               **{run: json.loads(p.read_text()) for run, p in reports.items()}}
    command = " ".join(["python -m bench.gpu_gate", *args]).strip()
    print(f"wrote {bench.write('gpu_gate', figures, command)}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
