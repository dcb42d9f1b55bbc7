#!/usr/bin/env bash
# Builds the libFuzzer targets (ClientHello parser, PROXY protocol header
# parser, configuration loader and validator) with clang + ASan/UBSan in their
# own build dir and runs each for a third of SECONDS, starting from captured
# hellos, sample headers and the shipped and broken configuration files.
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
ninja -C "$build" tests/fuzz/fuzz_client_hello tests/fuzz/fuzz_proxy_header tests/fuzz/fuzz_config
share=$(( (seconds + 2) / 3 ))

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

# run_fuzzer TARGET MAX_LEN CORPUS: one target for its share of the time, findings in $artifacts.
run_fuzzer() {
  "$build/tests/fuzz/$1" \
    -max_total_time="$share" \
    -max_len="$2" \
    -timeout=10 \
    -rss_limit_mb=2048 \
    -print_final_stats=1 \
    -artifact_prefix="$artifacts/" \
    "$3"
}

run_fuzzer fuzz_client_hello 20000 "$corpus"

# PROXY protocol headers: v1 and v2 samples as seeds.
pcorpus="$build/fuzz-corpus-proxy"
rm -rf "$pcorpus"
mkdir -p "$pcorpus"
printf 'PROXY TCP4 192.0.2.1 192.0.2.9 56324 443\r\n' > "$pcorpus/v1_tcp4"
printf 'PROXY TCP6 2001:db8::1 ::1 1000 5432\r\nrest' > "$pcorpus/v1_tcp6"
printf 'PROXY UNKNOWN\r\n' > "$pcorpus/v1_unknown"
printf '\r\n\r\n\000\r\nQUIT\n\041\021\000\014\300\000\002\001\300\000\002\011\333\004\001\273' > "$pcorpus/v2_tcp4"
printf '\r\n\r\n\000\r\nQUIT\n\040\000\000\000' > "$pcorpus/v2_local"
run_fuzzer fuzz_proxy_header 5000 "$pcorpus"

# Configuration files: the shipped examples and the broken-file corpus.
ccorpus="$build/fuzz-corpus-config"
rm -rf "$ccorpus"
mkdir -p "$ccorpus"
cp "$root"/conf/*.toml "$root"/tests/data/bad-configs/*.toml "$ccorpus/"
run_fuzzer fuzz_config 8192 "$ccorpus"
