// libFuzzer target for the ClientHello parser.
//
// Input layout: byte 0 picks max_bytes, bytes 1..2 seed the split generator,
// the rest is the stream. The stream is fed once whole and once in chunks
// whose sizes come from the seed; both must reach the same answer and the
// same extracted fields, and a decided parser must keep its answer. Anything
// else (including a sanitizer report) aborts.
//
// Seed corpus: tests/data/hello_*.bin work as they are (their first bytes,
// 0x16 0x03 0x01, become the parameters and the rest an unframed stream,
// which still exercises the record layer); tools/fuzz.sh also adds each of
// them behind a 3-byte parameter prefix so the real framing is seen too.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "preread/client_hello.hpp"

using sluice::preread::ClientHelloParser;
using sluice::preread::Status;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

bool host_char_ok(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '-' || c == '.' || c == '_';
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  // Mostly the default cap; sometimes small caps so the limit is hit often.
  static constexpr std::size_t kCaps[] = {16384, 16384, 65536, 512, 64, 9, 1, 0};
  const std::size_t max_bytes = kCaps[data[0] % 8];
  std::uint32_t rng = (std::uint32_t{data[1]} << 8 | data[2]) * 2654435761U + 1;
  const std::span<const std::uint8_t> stream(data + 3, size - 3);

  ClientHelloParser whole(max_bytes);
  const Status a = whole.feed(stream);

  ClientHelloParser split(max_bytes);
  Status b = split.status();
  std::size_t pos = 0;
  while (pos < stream.size()) {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    // Mostly short chunks (TCP trickle), sometimes empty or long ones.
    std::size_t n = rng % 16 == 0 ? 0 : 1 + (rng >> 8) % (rng % 4 == 0 ? 4096 : 8);
    if (n > stream.size() - pos) n = stream.size() - pos;
    const Status prev = b;
    b = split.feed(stream.subspan(pos, n));
    if (prev != Status::need_more) check(b == prev);
    pos += n;
  }

  check(a == b);
  check(whole.status() == a);
  if (a == Status::done) {
    const auto& x = whole.info();
    const auto& y = split.info();
    check(x.has_sni == y.has_sni && x.sni == y.sni && x.alpn == y.alpn &&
          x.record_version == y.record_version && x.client_version == y.client_version);
    if (x.has_sni) {
      check(!x.sni.empty() && x.sni.size() <= 255);
      for (char c : x.sni) check(host_char_ok(c));
    } else {
      check(x.sni.empty());
    }
    for (const auto& p : x.alpn) check(!p.empty() && p.size() <= 255);
    check(stream.size() >= 5 + 4 + 41);
  } else if (a != Status::need_more) {
    check(whole.error() != nullptr && whole.error()[0] != '\0');
  } else {
    check(stream.size() <= max_bytes);
  }

  // A decided parser ignores what follows.
  if (a != Status::need_more) {
    check(whole.feed(stream) == a);
  }
  return 0;
}
