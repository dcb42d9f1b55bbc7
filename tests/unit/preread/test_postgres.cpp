// PostgreSQL's first client message: SSLRequest, direct TLS, or plain.
#include <doctest/doctest.h>

#include <vector>

#include "preread/postgres.hpp"

using namespace sluice::preread;

namespace {

PgStart of(std::vector<std::uint8_t> b) { return classify_pg_start(b); }

}  // namespace

TEST_CASE("an SSLRequest is recognised only when all 8 bytes are there") {
  const auto req = pg_ssl_request();
  CHECK(std::vector<std::uint8_t>(req.begin(), req.end()) ==
        std::vector<std::uint8_t>{0x00, 0x00, 0x00, 0x08, 0x04, 0xd2, 0x16, 0x2f});
  for (std::size_t n = 1; n < req.size(); ++n) {
    CAPTURE(n);
    CHECK(of({req.begin(), req.begin() + static_cast<long>(n)}) == PgStart::need_more);
  }
  CHECK(of({req.begin(), req.end()}) == PgStart::ssl_request);
  std::vector<std::uint8_t> more(req.begin(), req.end());
  more.push_back(0x16);  // a client that did not wait for the answer
  CHECK(of(more) == PgStart::ssl_request);
}

TEST_CASE("a TLS record first is PostgreSQL 17's direct TLS") {
  CHECK(of({0x16}) == PgStart::direct_tls);
  CHECK(of({0x16, 0x03, 0x01, 0x00, 0xc8}) == PgStart::direct_tls);
}

TEST_CASE("StartupMessage, GSSENCRequest, CancelRequest and garbage stay plain") {
  CHECK(of({0, 0, 0, 0x29, 0x00, 0x03, 0x00, 0x00, 'u', 's'}) == PgStart::plain);  // protocol 3.0
  CHECK(of({0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30}) == PgStart::plain);                // GSSENCRequest
  CHECK(of({0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e, 1, 2, 3, 4, 5, 6, 7, 8}) == PgStart::plain);  // CancelRequest
  CHECK(of({0, 0, 0, 9, 0x04, 0xd2, 0x16, 0x2f}) == PgStart::plain);  // SSLRequest code, wrong length
  CHECK(of({'G', 'E', 'T', ' ', '/', ' ', 'H', 'T'}) == PgStart::plain);
  CHECK(of({}) == PgStart::need_more);
}
