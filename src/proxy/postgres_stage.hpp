// The PostgreSQL preread stage (preread = "postgres"). PostgreSQL clients ask
// for TLS in-band: an 8-byte SSLRequest, the server answers 'S', then the
// ClientHello follows. This stage answers 'S' itself, reads the ClientHello
// with the TLS stage (routes, default_upstream, hashing on SNI), and tells the
// session to repeat the SSLRequest to the chosen server before replaying the
// hello. A ClientHello first (PostgreSQL 17's direct TLS) goes straight to the
// TLS stage. A plain start (StartupMessage, GSSENCRequest, CancelRequest)
// goes to default_upstream unchanged, or is closed, per on_not_tls.
#pragma once

#include <optional>

#include "proxy/preread_stage.hpp"
#include "proxy/tls_stage.hpp"

namespace sluice {

class PostgresStage final : public PrereadStage {
 public:
  PostgresStage(const ListenerView& listener, const Snapshot& snapshot);

  PrereadResult feed(std::span<const std::uint8_t> data) override;
  std::vector<std::uint8_t> take_forward() override;
  const char* error() const override { return tls_ ? tls_->error() : ""; }
  bool server_needs_ssl_request() const override { return ssl_requested_; }

 private:
  PrereadResult feed_tls(std::span<const std::uint8_t> data);

  const ListenerView& listener_;
  const Snapshot& snapshot_;
  std::vector<std::uint8_t> head_;  // the first bytes, until classified
  std::optional<TlsStage> tls_;
  bool ssl_requested_ = false;
  bool plain_ = false;
};

}  // namespace sluice
