#include "proxy/postgres_stage.hpp"

#include "preread/postgres.hpp"
#include "runtime/snapshot.hpp"

namespace sluice {

PostgresStage::PostgresStage(const ListenerView& listener, const Snapshot& snapshot)
    : listener_(listener), snapshot_(snapshot) {}

PrereadResult PostgresStage::feed_tls(std::span<const std::uint8_t> data) {
  PrereadResult r = tls_->feed(data);
  sni = tls_->sni;
  alpn = tls_->alpn;
  return r;
}

PrereadResult PostgresStage::feed(std::span<const std::uint8_t> data) {
  if (tls_) return feed_tls(data);
  head_.insert(head_.end(), data.begin(), data.end());
  PrereadResult r;
  switch (preread::classify_pg_start(head_)) {
    case preread::PgStart::need_more:
      return r;
    case preread::PgStart::direct_tls: {
      tls_.emplace(listener_, snapshot_);
      std::vector<std::uint8_t> all = std::move(head_);
      head_ = {};
      return feed_tls(all);
    }
    case preread::PgStart::ssl_request: {
      // Answer 'S' ourselves; the SSLRequest is not forwarded (the session
      // sends its own to the server it chooses). A client that sent more
      // without waiting has its ClientHello bytes fed on.
      ssl_requested_ = true;
      tls_.emplace(listener_, snapshot_);
      std::vector<std::uint8_t> rest(head_.begin() + preread::kSslRequestSize, head_.end());
      head_ = {};
      r = rest.empty() ? PrereadResult{} : feed_tls(rest);
      r.reply.push_back('S');
      return r;
    }
    case preread::PgStart::plain:
      break;
  }
  plain_ = true;
  const ListenerConfig& lc = *listener_.config;
  if (lc.on_not_tls == OnNotTls::close || listener_.default_upstream == nullptr) {
    r.kind = PrereadResult::Kind::close;
    r.cause = lc.on_not_tls == OnNotTls::close ? Cause::rejected_not_tls : Cause::no_server;
    return r;
  }
  r.kind = PrereadResult::Kind::route;
  r.upstream = listener_.default_upstream;
  return r;
}

std::vector<std::uint8_t> PostgresStage::take_forward() {
  if (plain_) return std::move(head_);
  return tls_->take_forward();
}

}  // namespace sluice
