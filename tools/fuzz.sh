#!/usr/bin/env bash
# Builds the libFuzzer targets (ClientHello parser, PROXY protocol header
# parser, configuration loader and validator, PostgreSQL first-message
# classifier, admin API request parser) with clang + ASan/UBSan in their own
# build dir and runs each for a fifth of SECONDS, starting from captured
# hellos, sample headers, the shipped and broken configuration files, sample
# PostgreSQL starts and sample admin requests.
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
targets=(fuzz_client_hello fuzz_proxy_header fuzz_config fuzz_postgres_start fuzz_refusal fuzz_admin_request)
ninja -C "$build" "${targets[@]/#/tests/fuzz/}"
share=$(( (seconds + ${#targets[@]} - 1) / ${#targets[@]} ))

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

# PostgreSQL first messages: SSLRequest alone and followed by a captured
# ClientHello, direct TLS, a StartupMessage, GSSENCRequest and CancelRequest.
pgcorpus="$build/fuzz-corpus-postgres"
rm -rf "$pgcorpus"
mkdir -p "$pgcorpus"
ssl_request='\000\000\000\010\004\322\026\057'
printf "$ssl_request" > "$pgcorpus/ssl_request"
{ printf "$ssl_request"; cat "$root/tests/data/hello_openssl_tls13_sni.bin"; } > "$pgcorpus/ssl_request_hello"
cp "$root/tests/data/hello_openssl_tls13_alpn.bin" "$pgcorpus/direct_tls"
printf '\000\000\000\051\000\003\000\000user\000alice\000database\000db\000\000' > "$pgcorpus/startup"
printf '\000\000\000\010\004\322\026\060' > "$pgcorpus/gssenc_request"
printf '\000\000\000\020\004\322\026\056\000\000\004\322\000\000\026\056' > "$pgcorpus/cancel_request"
run_fuzzer fuzz_postgres_start 20000 "$pgcorpus"

# A refused client's first message: the first byte picks the protocol
# (0: PostgreSQL, 1: Redis, 2: MySQL) and the cut.
rcorpus="$build/fuzz-corpus-refusal"
rm -rf "$rcorpus"
mkdir -p "$rcorpus"
{ printf '\000'; printf "$ssl_request"; printf '\000\000\000\051\000\003\000\000user\000alice\000database\000db\000\000'; } \
  > "$rcorpus/pg_ssl_startup"
printf '\001*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n' > "$rcorpus/redis_echo"
printf '\004PING\r\n' > "$rcorpus/redis_inline"
printf '\002' > "$rcorpus/mysql"
run_fuzzer fuzz_refusal 70000 "$rcorpus"

# Admin API requests: the routes the API serves, a chunked body, a
# 100-continue upload, and a few broken ones. The first three bytes are the
# target's parameters (limits, split seed).
acorpus="$build/fuzz-corpus-admin"
rm -rf "$acorpus"
mkdir -p "$acorpus"
admin_seed() {  # name, request text
  printf '\000\001\002%b' "$2" > "$acorpus/$1"
}
admin_seed get_status 'GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n\r\n'
admin_seed get_metrics 'GET /metrics?x=1 HTTP/1.1\r\nAuthorization: Bearer t0ken\r\n\r\n'
admin_seed post_drain 'POST /upstreams/pg/servers/10.0.0.1%3A5432/drain HTTP/1.1\r\nContent-Length: 0\r\n\r\n'
admin_seed put_weight 'PUT /upstreams/pg/servers/10.0.0.1:5432/weight HTTP/1.1\r\nContent-Length: 2\r\n\r\n50'
admin_seed put_config 'PUT /config HTTP/1.1\r\nContent-Length: 28\r\nExpect: 100-continue\r\n\r\n[global]\nworkers = 1\nx = 1\n\n'
admin_seed chunked 'POST /reload HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n'
admin_seed repeated 'GET / HTTP/1.1\r\nX-A: 1\r\nx-a: 2\r\nX-A: 3\r\n\r\n'
admin_seed bad_version 'GET / HTTP/9.9\r\n\r\n'
admin_seed bad_length 'POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n'
admin_seed pipelined 'GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n'
run_fuzzer fuzz_admin_request 70000 "$acorpus"
