#include "proxy/tls_stage.hpp"

#include "preread/sni_router.hpp"
#include "runtime/snapshot.hpp"
#include "sluice/host.hpp"

namespace sluice {

TlsStage::TlsStage(const ListenerView& listener, const Snapshot& snapshot)
    : listener_(listener), snapshot_(snapshot), parser_(listener.config->preread_max_bytes) {}

PrereadResult TlsStage::feed(std::span<const std::uint8_t> data) {
  const ListenerConfig& lc = *listener_.config;
  const std::size_t held = parser_.input_size();
  PrereadResult r;
  switch (parser_.feed(data)) {
    case preread::Status::need_more:
      return r;
    case preread::Status::done: {
      const preread::ClientHelloInfo& info = parser_.info();
      if (info.has_sni) sni = normalize_host(info.sni);
      for (const std::string& p : info.alpn) {
        if (!alpn.empty()) alpn += ',';
        alpn += p;
      }
      r.route = info.has_sni ? listener_.router->match_index(sni) : -1;
      r.upstream = r.route >= 0 ? snapshot_.find_upstream(lc.routes[static_cast<std::size_t>(r.route)].upstream)
                                : listener_.default_upstream;
      if (!r.upstream) {
        r.kind = PrereadResult::Kind::close;
        r.cause = Cause::no_server;
        return r;
      }
      break;
    }
    case preread::Status::not_tls:
      if (lc.on_not_tls == OnNotTls::close || !listener_.default_upstream) {
        r.kind = PrereadResult::Kind::close;
        r.cause = lc.on_not_tls == OnNotTls::close ? Cause::rejected_not_tls : Cause::no_server;
        return r;
      }
      r.upstream = listener_.default_upstream;
      break;
    case preread::Status::malformed:
      if (lc.on_malformed == OnMalformed::close || !listener_.default_upstream) {
        r.kind = PrereadResult::Kind::close;
        r.cause = Cause::preread_malformed;
        return r;
      }
      r.upstream = listener_.default_upstream;
      break;
  }
  // Whatever this read carried past the parser's cap follows the hello.
  const std::size_t taken = parser_.input_size() - held;
  extra_.assign(data.begin() + static_cast<std::ptrdiff_t>(taken), data.end());
  r.kind = PrereadResult::Kind::route;
  return r;
}

std::vector<std::uint8_t> TlsStage::take_forward() {
  std::vector<std::uint8_t> out = parser_.take_input();
  out.insert(out.end(), extra_.begin(), extra_.end());
  return out;
}

}  // namespace sluice
