#!/usr/bin/env bash
# Install everything gpupool needs on a fresh Debian 12 machine. Idempotent: a second run
# installs nothing. Python packages come only from uv.lock; Debian packages from
# scripts/apt-packages.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
PYTHON=${GPUPOOL_PYTHON:-python3.11}

log() { printf '\033[1mbootstrap:\033[0m %s\n' "$*"; }

missing=()
while read -r pkg; do
  [[ -z "$pkg" || "$pkg" == \#* ]] && continue
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$pkg")
done < scripts/apt-packages.txt
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

if ! command -v uv >/dev/null || [[ "$(uv --version | cut -d' ' -f2)" != "$UV_VERSION" ]]; then
  log "installing uv $UV_VERSION"
  "$PYTHON" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
fi
log "syncing .venv from uv.lock"
# Bytecode is compiled here, not on first import: some environments set
# PYTHONDONTWRITEBYTECODE, and every `gpupool` command would then recompile its libraries.
uv sync --frozen --quiet --python "$PYTHON" --compile-bytecode --all-extras
.venv/bin/python -m compileall -q gpupool infra policies bench >/dev/null
