#!/usr/bin/env bash
# Installs the Debian packages sluice needs to build, test and benchmark
# (HAProxy and nginx are PROXY protocol receivers in the tests and the
# benchmark's peers); with --build only what building and running it needs,
# with --test-build what building it with its tests and tools needs.
# Idempotent: quiet and quick when everything is already there. Needs root
# (or sudo) on Debian 12.
set -euo pipefail

# What building and running sluice needs (tools/demo.sh installs only these).
build_packages=(
  g++ pkg-config meson ninja-build
  libuv1-dev libtomlplusplus-dev libspdlog-dev libxxhash-dev libsystemd-dev
  libhttp-parser-dev libhiredis-dev libpq-dev   # active health checks (HTTP, Redis, PostgreSQL)
  libmariadb-dev   # MySQL/MariaDB role checks
  libc-ares-dev   # servers from DNS (c-ares)
  nlohmann-json3-dev   # the admin API's JSON
  python3   # the demo's backends
)
# What building the tests and the benchmark's tools needs on top
# (tools/test.sh installs these first, builds, and installs the rest meanwhile).
test_build_packages=(
  cmake doctest-dev ccache   # unit tests; the compiler cache
  libssl-dev   # the load generator's TLS loads
  scdoc   # man pages sluice(8) and sluice.toml(5), built when meson finds it
)
# What running the tests, the fuzz run and the benchmark needs on top.
test_packages=(
  openssl python3-pytest curl procps logrotate
  clang libclang-rt-14-dev   # libFuzzer for the ClientHello fuzz target
  postgresql postgresql-client redis-server redis-tools   # database end-to-end tests
  mariadb-server mariadb-client   # MySQL role checks against real replication
  haproxy nginx libnginx-mod-stream   # PROXY protocol receivers in tests; the benchmark's peers
  prometheus chromium   # promtool checks /metrics; a headless browser loads the status page
  python3-matplotlib   # the L4/L7 routing comparison draws its chart (tools/compare_routing.py)
  iproute2 nftables   # network-namespace fault tests: veth pairs, dropped packets
  strace   # system calls per connection, in a test and in the benchmark
  keepalived   # scale-out: a VRRP pair whose track_script asks GET /ready
  bird2 exabgp   # scale-out: BGP announcements that follow GET /ready, a router's multipath route
  python3-yaml   # the Kubernetes recipe's manifests are parsed in a test
  debhelper dpkg-dev fakeroot lintian   # the Debian package (tools/deb.sh, tests/package)
  man-db   # reading the man pages in tests
  systemd   # systemd-analyze verifies the unit; systemd-sysusers/-tmpfiles for the package
  dnsmasq-base   # a real DNS server in the discovery tests
  redis-sentinel   # servers taken from Redis Sentinel, in the end-to-end tests
  sysbench   # the benchmark's MariaDB load (oltp_read_only)
  linux-perf   # where the CPU goes, in the benchmark's two-worker runs
)

packages=("${build_packages[@]}")
case "${1:-}" in
  --build) ;;
  --test-build) packages+=("${test_build_packages[@]}") ;;
  "") packages+=("${test_build_packages[@]}" "${test_packages[@]}") ;;
  *) echo "usage: tools/setup.sh [--build | --test-build]" >&2; exit 2 ;;
esac

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
for pair in nginx:nginx haproxy:haproxy postgresql:postgresql redis-server:redis-server \
    prometheus:prometheus mariadb-server:mariadb bird2:bird exabgp:exabgp; do
  for p in "${missing[@]}"; do
    if [[ "$p" == "${pair%%:*}" ]]; then
      $sudo service "${pair#*:}" stop >/dev/null 2>&1 || true
    fi
  done
done
