#!/usr/bin/env bash
# The whole test suite, as CI runs it:
#   1. set-up (Debian packages), build with warnings as errors;
#   2. unit tests (doctest), integration and end-to-end tests (pytest, real
#      sockets on loopback, real openssl peers) with every listener
#      splicing, a bounded fuzz run;
#   3. the same unit, integration and e2e tests again on an
#      AddressSanitizer + UndefinedBehaviorSanitizer build in copy mode, and
#      the tests that move bytes once more with every listener splicing
#      (with --quick: the default build in copy mode instead);
#   4. the unit tests that start threads and the tests where threads share state (several
#      workers, reload, admin API, health checks) on a ThreadSanitizer build.
# Ends with a timing summary per stage and one line "N passed, N failed".
# Exit status 0 only if nothing failed.
#
# Where the time goes: a test mostly waits for sockets and processes, a
# build mostly computes. So the sanitizer builds run in the background
# (ASan+UBSan beside the default build, TSan niced while the tests run),
# the test packages install while the builds compile, and the suites that do not
# measure anything against each other run side by side (each test binds
# port 0 and names its namespaces after its own PID, so two pytest
# processes never meet). Every test is written to hold on a busy machine.
#
# Options: --quick (skip the sanitizer passes and the fuzz run),
#          --fuzz-seconds N (default 60),
#          --serial (one stage at a time, as before: for timing one stage).
set -uo pipefail
cd "$(dirname "$0")/.."

quick=0
serial=0
fuzz_seconds=60
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1 ;;
    --serial) serial=1 ;;
    --fuzz-seconds) fuzz_seconds=$2; shift ;;
    *) echo "usage: tools/test.sh [--quick] [--serial] [--fuzz-seconds N]" >&2; exit 2 ;;
  esac
  shift
done

t_start=$(date +%s)
# The machine's busy CPU time since boot, in clock ticks (user, nice,
# system, irq, softirq, steal): the summary says how much of the two cores
# the run used, which tells whether waiting or computing bounds it.
cpu_busy() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
cpu_start=$(cpu_busy)
py=/usr/bin/python3
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
# What the builds need first; the rest (database servers, peers, the
# browser, the packaging tools) installs while the default build compiles.
tools/setup.sh --test-build || exit 1
# Builds in clones at other paths share compiled objects (ccache, when
# installed, is used by meson on its own): paths are hashed relative to the
# tree, and not the build directory's own path (it only names the sources'
# directory in the debug information).
export CCACHE_BASEDIR=$PWD
export CCACHE_NOHASHDIR=true

# Each step leaves in $log: NAME.log (its output), NAME.count ("passed
# failed"), NAME.time ("start end" in seconds since the epoch) and, when it
# ran in the background, NAME.done.

# Counts the tests in a doctest or pytest summary in file $1 (or the whole
# step as one test when no summary is found); $2 is the step's exit status.
count() {
  local file=$1 rc=$2 p=0 f=0 line=""
  if line=$(grep -E '^\[doctest\] test cases:' "$file" | tail -n 1) && [[ -n "$line" ]]; then
    p=$(sed -E 's/.*\| *([0-9]+) passed.*/\1/' <<<"$line")
    f=$(sed -E 's/.*\| *([0-9]+) failed.*/\1/' <<<"$line")
  elif line=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped).* in [0-9.]+s' "$file" | tail -n 1) && [[ -n "$line" ]]; then
    p=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+' || echo 0)
    f=$(( $(grep -oE '[0-9]+ failed' <<<"$line" | grep -oE '[0-9]+' || echo 0) + \
          $(grep -oE '[0-9]+ errors?' <<<"$line" | grep -oE '[0-9]+' || echo 0) ))
  fi
  if [[ -z "$line" ]]; then  # a step without a summary counts as one test
    if [[ $rc -eq 0 ]]; then p=1; else f=1; fi
  fi
  [[ -z "$p" ]] && p=0
  [[ -z "$f" ]] && f=0
  if [[ $rc -ne 0 && $f -eq 0 ]]; then f=1; fi
  echo "$p $f"
}

key() { tr ' /+,=' '_____' <<<"$1"; }

# Runs a step and records its counts and times; prints nothing.
exec_step() {  # name, command...
  local name=$1; shift
  local k; k=$(key "$name")
  local t0; t0=$(date +%s)
  echo "$name" >>"$log/order"
  "$@" >"$log/$k.log" 2>&1
  local rc=$?
  count "$log/$k.log" "$rc" >"$log/$k.count"
  echo "$rc" >"$log/$k.rc"
  echo "$t0 $(date +%s)" >"$log/$k.time"
}

# Prints a finished step's result: its summary line, or its tail on failure.
report_step() {  # name
  local name=$1 k; k=$(key "$name")
  local rc; rc=$(cat "$log/$k.rc")
  if [[ $rc -ne 0 ]]; then
    tail -n 60 "$log/$k.log"
    echo "== $name: FAILED (exit $rc)"
  else
    grep -E '^\[doctest\] test cases:|^(=+ )?[0-9]+ (passed|failed).* in [0-9.]+s' "$log/$k.log" | tail -n 1
  fi
}

run_step() {  # name, command...
  echo "== $1"
  exec_step "$@"
  report_step "$1"
}

# Each unit-test program as a step of its own: step function (run_step
# prints it, exec_step only records it), label, the environment, then --
# and the programs.
unit_tests() {
  local step=$1 label=$2; shift 2
  local envs=() t
  while [[ $# -gt 0 && "$1" != "--" ]]; do envs+=("$1"); shift; done
  shift
  for t in "$@"; do
    [[ -x "$t" && -f "$t" ]] || continue
    "$step" "$label unit $(basename "$t" | sed 's/^test_//')" env "${envs[@]}" "$t"
  done
}

pytest_suite() {  # build dir, extra env..., then -- pytest arguments
  local dir=$1; shift
  local envs=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" SLUICE_BIN="$PWD/$dir/sluice" "$py" -m pytest -q -p no:cacheprovider "$@"
}

# Where threads share state: two workers (least_conn counts, per-client
# limits, accept back-off, real database clients, the short soak and the
# integrity run under backend kills), reload and stop (the
# control loop hands new snapshots to the workers), the admin API and the
# health checks (on the control loop, reading and changing what the workers
# use), and the logging thread (reopen, a stalled pipe).
tsan_tests=(
  tests/integration/test_balance.py
  tests/integration/test_access_control.py
  tests/integration/test_lifecycle.py
  tests/integration/test_defects.py::test_accept_backs_off_when_out_of_fds
  tests/integration/test_reload.py
  tests/integration/test_admin.py
  tests/integration/test_health.py
  tests/integration/test_log_files.py
  tests/integration/test_stop_and_reload_defects.py
  tests/integration/test_soak.py
  tests/integration/test_integrity.py
  tests/e2e/test_active_health.py
  tests/e2e/test_databases.py
  tests/e2e/test_postgres_sni.py
  tests/integration/test_safe_start.py
  tests/integration/test_readiness.py
  tests/integration/test_queue.py
  tests/integration/test_upgrade.py
  tests/integration/test_upgrade_promises.py
  tests/e2e/test_upgrade_db.py
  tests/e2e/test_one_writer.py
)

# The unit tests that start threads (the upstream module's: several
# workers picking and counting, the wait queue handing slots across). The
# others run one thread, where ThreadSanitizer cannot see a race, so the
# TSan build leaves them out (about a third of its compile time).
tsan_units=(tests/unit/upstream/test_upstream)

# Passes when no ThreadSanitizer report was written to $1 (a directory);
# otherwise prints the first report whole and the summary line of each.
no_tsan_reports() {
  local reports=("$1"/tsan.*)
  [[ -e "${reports[0]}" ]] || return 0
  echo "${#reports[@]} ThreadSanitizer report file(s) in $1"
  grep -h '^SUMMARY: ThreadSanitizer' "${reports[@]}" | sort | uniq -c
  cat "${reports[0]}"
  return 1
}

# Every build here is a unity build (a library's or program's files compiled
# eight at a time as one) with line tables only (-g1: a report or a
# backtrace still names file and line): together they take a cold default
# build from 535 CPU-seconds to 229 (docs/decisions.md, "The test suite").
# Developers' own builds (tools/build.sh build) stay file by file.
unity=(-Dunity=on -Dunity_size=8)

# The sanitizer builds, one after the other; each leaves a marker file that
# the lanes wait for. The ASan+UBSan build starts beside the default build
# at the same priority: with an empty compiler cache the ASan lanes wait for
# it, and they are the longest ones. The TSan build, needed last, is niced:
# it fills the CPU the tests leave idle.
sanitizer_builds() {
  # No vptr check: gcc 12's runtime verifies a vtable by probing its memory
  # through pipe(2), which fails while the process is out of descriptors --
  # the state several tests create on purpose -- and then reports a valid
  # object as having an "invalid vptr" (and leaks the demangled names).
  # -g1: reports still name file and line. TSan at -O1, what its
  # documentation suggests. ASan+UBSan at -Og: UBSan's checks make the
  # optimiser's work at -O1 about twice as long (a heavy unit here: 29
  # CPU-seconds at -O1, 15 at -Og, 9 at -O1 without sanitizers), and on a
  # fresh machine that build is the longest single step before its tests
  # can start. Warnings are errors
  # in the default build only: gcc's flow warnings (stringop-overflow,
  # maybe-uninitialized) change with the optimisation level and the
  # sanitizers' instrumentation, and a false one must not cost the
  # sanitized test passes.
  local rc=0 r
  tools/build.sh build-asan "${unity[@]}" -Db_sanitize=address,undefined -Db_lundef=false \
      -Doptimization=g "-Dcpp_args=-fno-sanitize=vptr -g1"
  r=$?; [[ $r -ne 0 ]] && rc=1
  echo "$r" >"$log/asan-built"
  nice -n 10 tools/build.sh build-tsan "${unity[@]}" -Db_sanitize=thread -Db_lundef=false \
      -Doptimization=1 -Dcpp_args=-g1 -- sluice sluice-next tools/loadgen "${tsan_units[@]}"
  r=$?; [[ $r -ne 0 ]] && rc=1
  echo "$r" >"$log/tsan-built"
  return $rc
}
# Waits until the build marker $1 exists; true when that build succeeded.
built() {
  while [[ ! -e "$log/$1-built" ]]; do sleep 2; done
  [[ $(cat "$log/$1-built") == 0 ]]
}

# Records a build that failed as one failed test.
build_failed() {  # name
  echo "0 1" >"$log/$(key "$1").count"
  echo 1 >"$log/$(key "$1").rc"
  echo "$1" >>"$log/order"
}

exec_step "set-up: the packages the tests need (tools/setup.sh)" tools/setup.sh &
setup_pid=$!
if [[ $quick -eq 0 ]]; then
  if [[ $serial -eq 1 ]]; then
    exec_step "build asan+ubsan, then tsan" sanitizer_builds
  else
    echo "== build asan+ubsan, then tsan (started in the background)"
    exec_step "build asan+ubsan, then tsan" sanitizer_builds &
    builds_pid=$!
  fi
fi
echo "== build (warnings are errors)"
exec_step "build default" tools/build.sh build-ci "${unity[@]}" -Dstrict=true -Dbuildtype=debugoptimized \
    -Dcpp_args=-g1
wait "$setup_pid"
for step in "set-up: the packages the tests need (tools/setup.sh)" "build default"; do
  if [[ $(cat "$log/$(key "$step").rc") -ne 0 ]]; then
    report_step "$step"
    [[ -n "${builds_pid:-}" ]] && wait "$builds_pid"
    echo "0 passed, 1 failed"
    exit 1
  fi
done

tsan_env=""
reports="$PWD/build-tsan/tsan-reports"
asan_env=(ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)

# Every integration and e2e test runs in both ways of moving bytes, and on
# both the default and the ASan+UBSan build, without running every test
# four times: the default build's pass has every listener the tests write
# splicing (splice = "pipe"; moving bytes with splice(2) must not change
# any behaviour a test can see), the ASan+UBSan pass copies (the default
# mode, where sluice's own buffers hold the bytes), and the tests that move
# bytes (below) run once more under ASan+UBSan with splice = "pipe", where
# the pipes, the hand-over of spliced sessions and the switch in "auto" live.
splice_tests=(
  tests/integration/test_splice.py
  tests/integration/test_integrity.py
  tests/integration/test_half_close.py
  tests/integration/test_bytes.py
  tests/integration/test_resets.py
  tests/integration/test_client_faults.py
  tests/integration/test_backend_faults.py
  tests/integration/test_interim_bytes.py
  tests/integration/test_idle_crowd.py
  tests/integration/test_keepalive.py
  tests/integration/test_limits.py
  tests/integration/test_retired.py
  tests/integration/test_close_spread.py
  tests/integration/test_syscalls.py
  tests/integration/test_upgrade.py
  tests/integration/test_upgrade_promises.py
  tests/e2e/test_tls.py
  tests/e2e/test_proxy_protocol.py
)

# Three lanes of tests run side by side, each at most one pytest process.
# A test mostly waits for sockets and processes: with two lanes the two
# cores were busy about half the time once the builds were done. Every test
# holds on a busy machine. The lanes are balanced by their usual length:
#   lane 1: default build unit, integration+e2e (splice = "pipe");
#   lane 2: Debian package; ASan unit, e2e and the integration tests
#           test_a* to test_e* (copy); the tests that move bytes again with
#           splice = "pipe";
#   lane 3: ASan integration tests test_f* onwards (copy); fuzz; the TSan
#           unit and thread tests.
# The ASan lanes start when the ASan build is done (at once with a warm
# compiler cache). Lanes 2 and 3 print their results when they are joined.
asan_first=(tests/e2e tests/integration/test_[a-e]*.py)
asan_second=(tests/integration/test_[!a-e]*.py)
lane_two() {
  exec_step "Debian package (tools/deb.sh, dpkg-deb, lintian)" "$py" -m pytest -q -p no:cacheprovider tests/package
  if [[ $quick -eq 1 ]]; then
    exec_step "default build integration+e2e, copy" \
      pytest_suite build-ci -- tests/integration tests/e2e
    return
  fi
  if built asan; then
    unit_tests exec_step asan+ubsan "${asan_env[@]}" -- build-asan/tests/unit/*/test_*
    exec_step "asan+ubsan e2e and integration test_a* to test_e*, copy" \
      pytest_suite build-asan "${asan_env[@]}" -- "${asan_first[@]}"
    exec_step "asan+ubsan tests that move bytes, splice = pipe" \
      pytest_suite build-asan "${asan_env[@]}" SLUICE_TEST_SPLICE=pipe -- "${splice_tests[@]}"
  else
    build_failed "build with AddressSanitizer + UndefinedBehaviorSanitizer"
  fi
}

lane_three() {
  if built asan; then
    exec_step "asan+ubsan integration test_f* onwards, copy" \
      pytest_suite build-asan "${asan_env[@]}" -- "${asan_second[@]}"
  fi
  exec_step "fuzz ClientHello, PROXY header, configuration, PostgreSQL start, refusal and admin request parsers ${fuzz_seconds}s" \
    tools/fuzz.sh "$fuzz_seconds"
  tsan_steps
}

# The TSan unit and thread tests, once the TSan build is there.
tsan_steps() {
  if built tsan; then
    rm -rf "$reports"
    mkdir -p "$reports"
    # Reports go to files so that none is lost in a process whose output no
    # test reads; halt_on_error makes the process fail its test as well.
    # Suppressions only for reports inside third-party libraries (see the file).
    tsan_env="TSAN_OPTIONS=halt_on_error=1 second_deadlock_stack=1 log_path=$reports/tsan suppressions=$PWD/tools/tsan.supp"
    unit_tests exec_step tsan "$tsan_env" -- "${tsan_units[@]/#/build-tsan/}"
    exec_step "tsan integration+e2e (threads sharing state)" \
      pytest_suite build-tsan "$tsan_env" -- "${tsan_tests[@]}"
    exec_step "tsan reports" no_tsan_reports "$reports"
  else
    build_failed "build with ThreadSanitizer"
  fi
}

if [[ $serial -eq 0 ]]; then
  echo "== lane 2: Debian package, ASan (e2e, integration test_a* to test_e*; splice = pipe) (started in the background)"
  lane_two &
  lane_two_pid=$!
  if [[ $quick -eq 0 ]]; then
    echo "== lane 3: ASan (integration test_f* onwards), fuzz, TSan (started in the background)"
    lane_three &
    lane_three_pid=$!
  fi
fi

unit_tests run_step "default build" -- build-ci/tests/unit/*/test_*
run_step "default build integration+e2e, splice = pipe" \
  pytest_suite build-ci SLUICE_TEST_SPLICE=pipe -- tests/integration tests/e2e

if [[ $serial -eq 1 ]]; then
  lane_two
  [[ $quick -eq 0 ]] && lane_three
else
  wait "$lane_two_pid"
  [[ -n "${lane_three_pid:-}" ]] && wait "$lane_three_pid"
  [[ -n "${builds_pid:-}" ]] && wait "$builds_pid"
fi
# Lanes 2 and 3's results (and the builds'), now that they are all in.
echo "== lanes 2 and 3 and the sanitizer builds"
while read -r name; do
  case "$name" in
    "Debian package"*|asan*|fuzz*|tsan*|"default build integration+e2e, copy"|"build asan+ubsan, then tsan"|"build with AddressSanitizer + UndefinedBehaviorSanitizer"|"build with ThreadSanitizer")
      echo "== $name"
      report_step "$name" ;;
  esac
done < <(cat "$log/order")

# Timing, per stage, in the order the stages began.
echo "== timing (wall-clock seconds; background stages overlap others)"
passed=0
failed=0
while read -r name; do
  k=$(key "$name")
  read -r p f <"$log/$k.count"
  passed=$((passed + p))
  failed=$((failed + f))
  if [[ -f "$log/$k.time" ]]; then
    read -r a b <"$log/$k.time"
    printf '%6ds  %s\n' $((b - a)) "$name"
  fi
done < <(cat "$log/order")
t_total=$(($(date +%s) - t_start))
printf '%6ds  %s\n' "$t_total" "total"
ticks=$(getconf CLK_TCK)
busy=$(( ($(cpu_busy) - cpu_start) / ticks ))
cores=$(nproc)
echo "CPU: ${busy} CPU-seconds busy of $((t_total * cores)) on ${cores} cores ($(( 100 * busy / (t_total * cores > 0 ? t_total * cores : 1) )) %)"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
