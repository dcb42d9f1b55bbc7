#!/usr/bin/env bash
# Builds the ClientHello libFuzzer target with clang + ASan/UBSan in its own
# build dir and runs it for a while, starting from the captured hellos.
#
#   tools/fuzz.sh [SECONDS] [BUILD_DIR]    (defaults: 60, build-fuzz)
#
# Exits non-zero when the fuzzer finds a crash, a sanitizer report or a
# broken invariant; the offending input is left in BUILD_DIR/fuzz-artifacts/.
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${2:-$root/build-fuzz}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac

if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: clang++ not found (Debian: apt-get install clang libclang-rt-dev)" >&2
  exit 2
fi

if [ ! -f "$build/build.ninja" ]; then
  CXX=clang++ meson setup "$build" "$root" \
    -Dfuzz=true -Dtests=false \
    -Db_sanitize=address,undefined -Db_lundef=false
fi
# Only the fuzz target: the rest of the tree is not needed here.
ninja -C "$build" tests/fuzz/fuzz_client_hello

# A fresh scratch corpus each run: the captured hellos as they are, and each
# behind the 3-byte parameter prefix the target reads (cap 16384, a split seed)
# so the fuzzer starts from correctly framed hellos.
corpus="$build/fuzz-corpus"
artifacts="$build/fuzz-artifacts"
rm -rf "$corpus"
mkdir -p "$corpus" "$artifacts"
i=0
for f in "$root"/tests/data/hello_*.bin; do
  cp "$f" "$corpus/"
  { printf '\000'; printf "\\$(printf '%03o' $((i % 256)))"; printf '\001'; cat "$f"; } \
    > "$corpus/prefixed_$(basename "$f")"
  i=$((i + 1))
done

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
"$build/tests/fuzz/fuzz_client_hello" \
  -max_total_time="$seconds" \
  -max_len=20000 \
  -timeout=10 \
  -rss_limit_mb=2048 \
  -print_final_stats=1 \
  -artifact_prefix="$artifacts/" \
  "$corpus"
