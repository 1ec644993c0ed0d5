#!/usr/bin/env bash
# The GPU tier of the acceptance gate on a real NVIDIA GPU host, as one prepared run.
#
# Runs on the GPU host itself (testinfra's local backend), writes JSON reports to
# $OUT (default .cache/gpu-gate): a positive run against the host's true description,
# then a negative run with a deliberately wrong expectation (GPU count + 1) that must
# fail on gpu.gpu_count. Exit 0 only when the positive run passed and the negative run
# failed for exactly that reason. Where the host has slurmd, what it detects (`slurmd -G`)
# and the gate's slurm suite are recorded too ($OUT/slurmd-G.txt, $OUT/slurm), not required.
#
# Usage: scripts/gpu-gate.sh [description.yaml] [node]   (defaults: the device fixture)
# Python needs: pydantic, pyyaml, rich, pytest, pytest-testinfra (and torch for burn-in).
set -euo pipefail
cd "$(dirname "$0")/.."
DESC=${1:-tests/fixtures/device-h200.yaml}
NODE=${2:-gpu-host}
OUT=${OUT:-.cache/gpu-gate}
PY=${PYTHON:-python3}
mkdir -p "$OUT/positive" "$OUT/negative"
# DCGM is not installed on every GPU host (e.g. lent sandboxes); leave its check out
# there rather than fail the whole tier, and say so in the report.
EXCLUDE=()
command -v dcgmi >/dev/null || EXCLUDE=(--exclude gpu.dcgm_diag)

nvidia-smi | tee "$OUT/nvidia-smi.txt"
nvidia-smi --query-gpu="$($PY -c 'from gpupool.gate.nvidia import QUERY_FIELDS as F; print(",".join(F))')" \
  --format=csv,noheader,nounits > "$OUT/nvidia-smi-query.csv" || true

# What Slurm detects, recorded where the host has slurmd (never required: a lent machine
# usually has no Slurm; the gate's slurm suite then skips, saying so). Nothing here changes
# the GPU's MIG mode or any other setting.
if command -v slurmd >/dev/null; then
  { dpkg-query -W slurmd slurm-wlm-basic-plugins slurm-wlm-nvml-plugin libnvidia-ml1 || true
    grep -v '^#' /etc/slurm/gres.conf || true
    slurmd -G || echo "slurmd -G exit $?"; } > "$OUT/slurmd-G.txt" 2>&1
  $PY -m gpupool gate "$NODE" --file "$DESC" --local --suite slurm --tier quick \
    --out "$OUT/slurm" || echo "slurm suite exit $? (recorded, not required)"
else
  echo "slurmd is not installed on this host: nothing recorded" > "$OUT/slurmd-G.txt"
fi

set +e
$PY -m gpupool gate "$NODE" --file "$DESC" --local --suite gpu --tier burn-in \
  "${EXCLUDE[@]}" --out "$OUT/positive"
positive=$?

wrong="$OUT/negative/description.yaml"
$PY - "$DESC" "$wrong" <<'PY'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
for c in d["node_classes"].values():
    if c.get("gpu"):
        c["gpu"]["count"] += 1  # deliberately wrong: one GPU more than the host has
for t in d["teams"].values():
    t["quota"] = {m: 0 for m in t["quota"]}
open(sys.argv[2], "w").write(yaml.safe_dump(d))
PY
$PY -m gpupool gate "$NODE" --file "$wrong" --local --suite gpu --tier quick \
  "${EXCLUDE[@]}" --out "$OUT/negative"
negative=$?
set -e

echo "positive run exit $positive (want 0); negative run exit $negative (want 1)"
$PY - "$OUT" "$NODE" <<'PY'
import json, sys
neg = json.load(open(f"{sys.argv[1]}/negative/{sys.argv[2]}.json"))
assert neg["failed"] == ["gpu.gpu_count"], neg["failed"]
print("negative run failed exactly on gpu.gpu_count, as it must")
PY
[[ $positive -eq 0 && $negative -eq 1 ]]
