#!/usr/bin/env bash
# Installs the Debian packages sluice needs to build, test and benchmark
# (HAProxy and nginx are PROXY protocol receivers in the tests and the
# benchmark's peers). Idempotent: quiet
# and quick when everything is already there. Needs root (or sudo) on Debian 12.
set -euo pipefail

packages=(
  g++ pkg-config meson ninja-build cmake
  libuv1-dev libtomlplusplus-dev libspdlog-dev doctest-dev libxxhash-dev libsystemd-dev
  libssl-dev openssl python3 python3-pytest curl procps logrotate
  libhttp-parser-dev libhiredis-dev libpq-dev   # active health checks (HTTP, Redis, PostgreSQL)
  clang libclang-rt-14-dev   # libFuzzer for the ClientHello fuzz target
  postgresql postgresql-client redis-server redis-tools   # database end-to-end tests
  haproxy nginx libnginx-mod-stream   # PROXY protocol receivers in tests; the benchmark's peers
  nlohmann-json3-dev   # the admin API's JSON
  prometheus chromium   # promtool checks /metrics; a headless browser loads the status page
  python3-matplotlib   # the L4/L7 routing comparison draws its chart (tools/compare_routing.py)
  iproute2 nftables   # network-namespace fault tests: veth pairs, dropped packets
  strace   # system calls per connection, in a test and in the benchmark
  libc-ares-dev dnsmasq-base   # servers from DNS (c-ares); a real DNS server in its tests
)

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
for svc in nginx haproxy postgresql redis-server prometheus; do
  for p in "${missing[@]}"; do
    if [[ "$p" == "$svc" ]]; then
      $sudo service "$svc" stop >/dev/null 2>&1 || true
    fi
  done
done
