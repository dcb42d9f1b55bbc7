// libFuzzer target for PostgreSQL's first-message classifier, used the way
// the PostgreSQL preread stage uses it: the client's bytes arrive in pieces
// and are classified again after each one; an SSLRequest or a direct TLS
// start hands the bytes after it (or all of them) to the ClientHello parser.
//
// Invariants: the answer for every prefix is the one the protocol defines
// (0x16 first: direct TLS; the 8 SSLRequest bytes: ssl_request; fewer than 8
// other bytes: need_more; else plain), and once a prefix is decided every
// longer one gets the same answer, so the stage may decide as early as it
// likes. The ClientHello behind it gets the same answer fed whole or in two.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "preread/client_hello.hpp"
#include "preread/postgres.hpp"

using sluice::preread::ClientHelloParser;
using sluice::preread::PgStart;
using sluice::preread::Status;
using sluice::preread::classify_pg_start;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

// What the protocol says the first bytes are, written out independently.
PgStart expected(std::span<const std::uint8_t> head) {
  if (head.empty()) return PgStart::need_more;
  if (head[0] == 0x16) return PgStart::direct_tls;
  if (head.size() < 8) return PgStart::need_more;
  const auto req = sluice::preread::pg_ssl_request();
  return std::equal(req.begin(), req.end(), head.begin()) ? PgStart::ssl_request : PgStart::plain;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> all(data, size);
  PgStart decided = PgStart::need_more;
  std::size_t decided_at = 0;
  for (std::size_t n = 0; n <= size; ++n) {
    const PgStart got = classify_pg_start(all.first(n));
    check(got == expected(all.first(n)));
    if (decided != PgStart::need_more) {
      check(got == decided);
    } else if (got != PgStart::need_more) {
      decided = got;
      decided_at = n;
    }
  }
  if (decided == PgStart::need_more) {
    check(size < 8);
    return 0;
  }
  check(decided_at == (decided == PgStart::direct_tls ? 1 : 8));

  // What the stage feeds on: the ClientHello after the SSLRequest, or the
  // whole stream for direct TLS.
  if (decided == PgStart::plain) return 0;
  const std::span<const std::uint8_t> tls =
      decided == PgStart::ssl_request ? all.subspan(sluice::preread::kSslRequestSize) : all;
  ClientHelloParser whole(16384);
  const Status a = whole.feed(tls);
  ClientHelloParser two(16384);
  const std::size_t cut = tls.size() / 2;
  Status b = two.feed(tls.first(cut));
  if (b == Status::need_more) b = two.feed(tls.subspan(cut));
  check(a == b);
  if (a == Status::done) check(whole.info().sni == two.info().sni && whole.info().alpn == two.info().alpn);
  return 0;
}
