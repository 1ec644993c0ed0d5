#!/usr/bin/env bash
# Wheels of every dependency in uv.lock for a newer CPython than this machine's (default
# 3.13, Debian trixie's), for tests/integration/test_newer_python.py: it installs them in a
# trixie host that has no network. Idempotent: kept while uv.lock is unchanged.
#   scripts/wheelhouse.sh [3.13]
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${1:-3.13}
[[ "$VERSION" =~ ^3\.[0-9]{2}$ ]] || { echo "wheelhouse: expected a version like 3.13, got '$VERSION'" >&2; exit 2; }
TAG="cp${VERSION/./}"
DEST=".cache/wheelhouse/$TAG"
STAMP="$DEST/.uv.lock-$(sha256sum uv.lock | cut -c1-16)"
[[ -f "$STAMP" ]] && exit 0

printf '\033[1mwheelhouse:\033[0m downloading the locked wheels for CPython %s\n' "$VERSION"
rm -rf "$DEST"
mkdir -p "$DEST"
uv export --frozen --all-extras --no-hashes --no-emit-project --quiet -o "$DEST/requirements.txt"
# pip takes the target's tags literally: every manylinux level a locked wheel may carry.
platforms=(--platform any --platform manylinux1_x86_64 --platform manylinux2010_x86_64
           --platform manylinux2014_x86_64)
for glibc in 5 12 17 24 27 28 31 34 35 36 37 38 39; do
  platforms+=(--platform "manylinux_2_${glibc}_x86_64")
done
python3.11 -m pip download --quiet --disable-pip-version-check --no-deps \
  --only-binary=:all: --python-version "$VERSION" --implementation cp \
  --abi "$TAG" --abi abi3 --abi none "${platforms[@]}" \
  -r "$DEST/requirements.txt" -d "$DEST" 2> >(grep -v "is ignored: it is neither" >&2)
touch "$STAMP"
