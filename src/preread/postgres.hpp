// PostgreSQL's first client message, as far as a balancer needs it: is this
// an in-band request for TLS (SSLRequest), PostgreSQL 17's direct TLS (the
// ClientHello comes first), or something that stays plain (StartupMessage,
// GSSENCRequest, CancelRequest)? Pure, like the ClientHello parser.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace sluice::preread {

enum class PgStart {
  need_more,    // fewer than 8 bytes, and not TLS
  ssl_request,  // the 8-byte SSLRequest: the client waits for 'S' or 'N'
  direct_tls,   // a TLS record: PostgreSQL 17's sslnegotiation=direct
  plain,        // StartupMessage, GSSENCRequest, CancelRequest or anything else
};

inline constexpr std::uint32_t kSslRequestCode = 80877103;  // 1234 << 16 | 5679
inline constexpr std::size_t kSslRequestSize = 8;

// Classifies the first bytes a client sent on a PostgreSQL listener.
PgStart classify_pg_start(std::span<const std::uint8_t> head);

// The SSLRequest sluice sends to the chosen server.
std::array<std::uint8_t, kSslRequestSize> pg_ssl_request();

}  // namespace sluice::preread
