#!/usr/bin/env bash
# Configures (once) and builds sluice in DIR (default build/). Extra arguments
# go to `meson setup` / `meson configure`, e.g.
#   tools/build.sh build-asan -Db_sanitize=address,undefined
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
if [[ ! -f "$dir/build.ninja" ]]; then
  meson setup "$dir" "$@" >/dev/null
elif [[ $# -gt 0 ]]; then
  meson configure "$dir" "$@" >/dev/null
fi
if ! out=$(ninja -C "$dir" 2>&1); then
  echo "$out" >&2
  exit 1
fi
