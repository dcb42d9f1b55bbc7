#!/usr/bin/env bash
# Configures (once) and builds sluice in DIR (default build/). Extra arguments
# go to `meson setup` / `meson configure`; after `--`, the ninja targets to
# build (default: all), e.g.
#   tools/build.sh build-asan -Db_sanitize=address,undefined
#   tools/build.sh build-tsan -Db_sanitize=thread -- sluice sluice-next
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
args=()
while [[ $# -gt 0 && "$1" != "--" ]]; do args+=("$1"); shift; done
[[ $# -gt 0 ]] && shift  # the targets follow
if [[ ! -f "$dir/build.ninja" ]]; then
  meson setup "$dir" "${args[@]}" >/dev/null
elif [[ ${#args[@]} -gt 0 ]]; then
  meson configure "$dir" "${args[@]}" >/dev/null
fi
if ! out=$(ninja -C "$dir" "$@" 2>&1); then
  echo "$out" >&2
  exit 1
fi
