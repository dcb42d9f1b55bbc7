#!/usr/bin/env bash
# The whole test suite, as CI runs it:
#   1. set-up (Debian packages), build with warnings as errors;
#   2. unit tests (doctest), integration and end-to-end tests (pytest, real
#      sockets on loopback, real openssl peers), a bounded fuzz run;
#   3. the same unit, integration and e2e tests again on an
#      AddressSanitizer + UndefinedBehaviorSanitizer build, and its
#      integration and e2e tests once more with every listener splicing
#      (with --quick: on the default build);
#   4. the unit tests and the tests where threads share state (several
#      workers, reload, admin API, health checks) on a ThreadSanitizer build.
# Ends with one line "N passed, N failed". Exit status 0 only if nothing failed.
#
# Options: --quick (skip the sanitizer passes and the fuzz run),
#          --fuzz-seconds N (default 60).
set -uo pipefail
cd "$(dirname "$0")/.."

quick=0
fuzz_seconds=60
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1 ;;
    --fuzz-seconds) fuzz_seconds=$2; shift ;;
    *) echo "usage: tools/test.sh [--quick] [--fuzz-seconds N]" >&2; exit 2 ;;
  esac
  shift
done

tools/setup.sh || exit 1
py=/usr/bin/python3
passed=0
failed=0
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

# Adds the counts from a doctest or pytest summary in file $1 (or counts the
# whole step as one failure when no summary is found and $2 != 0).
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
  passed=$((passed + p))
  failed=$((failed + f))
}

run_step() {  # name, command...
  local name=$1; shift
  local out="$log/$(tr ' /' '__' <<<"$name").log"
  echo "== $name"
  "$@" >"$out" 2>&1
  local rc=$?
  count "$out" "$rc"
  if [[ $rc -ne 0 ]]; then
    tail -n 60 "$out"
    echo "== $name: FAILED (exit $rc)"
  else
    grep -E '^\[doctest\] test cases:|^(=+ )?[0-9]+ (passed|failed).* in [0-9.]+s' "$out" | tail -n 1
  fi
}

unit_tests() {  # build dir, label
  local dir=$1 label=$2
  for t in config balance upstream preread runtime log health admin proxy; do
    run_step "$label unit $t" "$dir/tests/unit/$t/test_$t"
  done
}

suite() {  # build dir, label
  local dir=$1 label=$2
  unit_tests "$dir" "$label"
  run_step "$label integration+e2e" env SLUICE_BIN="$PWD/$dir/sluice" \
    "$py" -m pytest -q -p no:cacheprovider tests/integration tests/e2e
}

# The same integration and e2e tests with every listener the tests write
# splicing (splice = "pipe"): moving bytes with splice(2) must not change
# any behaviour a test can see.
splice_suite() {  # build dir, label
  local dir=$1 label=$2
  run_step "$label integration+e2e, splice = pipe" env SLUICE_TEST_SPLICE=pipe SLUICE_BIN="$PWD/$dir/sluice" \
    "$py" -m pytest -q -p no:cacheprovider tests/integration tests/e2e
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
)

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

tsan_suite() {  # build dir
  local dir=$1 reports="$PWD/$1/tsan-reports"
  rm -rf "$reports"
  mkdir -p "$reports"
  # Reports go to files so that none is lost in a process whose output no
  # test reads; halt_on_error makes the process fail its test as well.
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 log_path=$reports/tsan"
  # Only for reports inside third-party libraries (see the file).
  if [[ -f tools/tsan.supp ]]; then
    TSAN_OPTIONS+=" suppressions=$PWD/tools/tsan.supp"
  fi
  unit_tests "$dir" "tsan"
  run_step "tsan integration+e2e (threads sharing state)" env SLUICE_BIN="$PWD/$dir/sluice" \
    "$py" -m pytest -q -p no:cacheprovider "${tsan_tests[@]}"
  run_step "tsan reports" no_tsan_reports "$reports"
}

echo "== build (warnings are errors)"
if ! tools/build.sh build-ci -Dstrict=true -Dbuildtype=debugoptimized; then
  echo "0 passed, 1 failed"
  exit 1
fi
suite build-ci "default build"
[[ $quick -eq 1 ]] && splice_suite build-ci "default build"

if [[ $quick -eq 0 ]]; then
  run_step "fuzz ClientHello, PROXY header, configuration, PostgreSQL start and admin request parsers ${fuzz_seconds}s" tools/fuzz.sh "$fuzz_seconds"
  echo "== build with AddressSanitizer + UndefinedBehaviorSanitizer"
  # No vptr check: gcc 12's runtime verifies a vtable by probing its memory
  # through pipe(2), which fails while the process is out of descriptors --
  # the state several tests create on purpose -- and then reports a valid
  # object as having an "invalid vptr" (and leaks the demangled names).
  if tools/build.sh build-asan -Dstrict=true -Db_sanitize=address,undefined -Db_lundef=false \
      -Dcpp_args=-fno-sanitize=vptr; then
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    suite build-asan "asan+ubsan"
    splice_suite build-asan "asan+ubsan"
  else
    failed=$((failed + 1))
  fi
  echo "== build with ThreadSanitizer"
  if tools/build.sh build-tsan -Dstrict=true -Db_sanitize=thread -Db_lundef=false; then
    tsan_suite build-tsan
  else
    failed=$((failed + 1))
  fi
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
