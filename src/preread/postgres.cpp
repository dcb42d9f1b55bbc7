#include "preread/postgres.hpp"

#include "preread/client_hello.hpp"

namespace sluice::preread {

namespace {

std::uint32_t be32(std::span<const std::uint8_t> b) {
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
}

}  // namespace

PgStart classify_pg_start(std::span<const std::uint8_t> head) {
  if (head.empty()) return PgStart::need_more;
  // No PostgreSQL message starts with 0x16: its first four bytes are a
  // length below 2^24 for any real startup packet.
  if (head[0] == kTlsHandshake) return PgStart::direct_tls;
  if (head.size() < kSslRequestSize) return PgStart::need_more;
  if (be32(head.first(4)) == kSslRequestSize && be32(head.subspan(4, 4)) == kSslRequestCode) {
    return PgStart::ssl_request;
  }
  return PgStart::plain;
}

std::array<std::uint8_t, kSslRequestSize> pg_ssl_request() {
  return {0, 0, 0, 8, static_cast<std::uint8_t>(kSslRequestCode >> 24),
          static_cast<std::uint8_t>(kSslRequestCode >> 16), static_cast<std::uint8_t>(kSslRequestCode >> 8),
          static_cast<std::uint8_t>(kSslRequestCode)};
}

}  // namespace sluice::preread
