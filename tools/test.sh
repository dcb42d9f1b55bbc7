#!/usr/bin/env bash
# The whole test suite, as CI runs it:
#   1. set-up (Debian packages), build with warnings as errors;
#   2. unit tests (doctest), integration and end-to-end tests (pytest, real
#      sockets on loopback, real openssl peers), a bounded fuzz run;
#   3. the same unit, integration and e2e tests again on an
#      AddressSanitizer + UndefinedBehaviorSanitizer build.
# Ends with one line "N passed, N failed". Exit status 0 only if nothing failed.
#
# Options: --quick (skip the sanitizer pass and the fuzz run),
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

suite() {  # build dir, label
  local dir=$1 label=$2
  for t in config balance preread runtime log health admin; do
    run_step "$label unit $t" "$dir/tests/unit/$t/test_$t"
  done
  run_step "$label integration+e2e" env SLUICE_BIN="$PWD/$dir/sluice" \
    "$py" -m pytest -q -p no:cacheprovider tests/integration tests/e2e
}

echo "== build (warnings are errors)"
if ! tools/build.sh build-ci -Dstrict=true -Dbuildtype=debugoptimized; then
  echo "0 passed, 1 failed"
  exit 1
fi
suite build-ci "default build"

if [[ $quick -eq 0 ]]; then
  run_step "fuzz ClientHello and PROXY header parsers ${fuzz_seconds}s" tools/fuzz.sh "$fuzz_seconds"
  echo "== build with AddressSanitizer + UndefinedBehaviorSanitizer"
  if tools/build.sh build-asan -Dstrict=true -Db_sanitize=address,undefined -Db_lundef=false; then
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    suite build-asan "asan+ubsan"
  else
    failed=$((failed + 1))
  fi
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
