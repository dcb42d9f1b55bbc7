#!/usr/bin/env bash
# Installs the Debian packages sluice needs to build and test (and, with
# --bench, to run the benchmark against HAProxy and nginx). Idempotent: quiet
# and quick when everything is already there. Needs root (or sudo) on Debian 12.
set -euo pipefail

packages=(
  g++ pkg-config meson ninja-build cmake
  libuv1-dev libtomlplusplus-dev libspdlog-dev doctest-dev libxxhash-dev
  libhttp-parser-dev libhiredis-dev libpq-dev   # active health checks (HTTP, Redis, PostgreSQL)
  libssl-dev openssl python3 python3-pytest curl procps
  clang libclang-rt-14-dev   # libFuzzer for the ClientHello fuzz target
  postgresql postgresql-client redis-server redis-tools   # database end-to-end tests
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(haproxy nginx-light libnginx-mod-stream)
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts freshly installed daemons; the tests and the benchmark run
# their own copies on ephemeral ports, so stop the system ones we just added.
for svc in nginx haproxy postgresql redis-server; do
  for p in "${missing[@]}"; do
    if [[ "$p" == "$svc" || ( "$svc" == nginx && "$p" == nginx-light ) ]]; then
      $sudo service "$svc" stop >/dev/null 2>&1 || true
    fi
  done
done
