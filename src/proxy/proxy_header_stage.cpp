#include "proxy/proxy_header_stage.hpp"

#include "preread/proxy_protocol.hpp"
#include "sluice/address.hpp"

namespace sluice {

PrereadResult ProxyHeaderStage::feed(std::span<const std::uint8_t> data) {
  head_.insert(head_.end(), data.begin(), data.end());
  const preread::ProxyHeader h = preread::parse_proxy_header(head_);
  PrereadResult r;
  switch (h.status) {
    case preread::ProxyHeader::Status::need_more:
      return r;
    case preread::ProxyHeader::Status::invalid:
      error_ = h.error;
      r.kind = PrereadResult::Kind::close;
      r.cause = Cause::rejected_proxy;
      return r;
    case preread::ProxyHeader::Status::ok:
      break;
  }
  if (!h.local) {  // LOCAL / UNKNOWN: the connection's own addresses stand
    copy_inet(&client, reinterpret_cast<const sockaddr*>(&h.source));
    copy_inet(&destination, reinterpret_cast<const sockaddr*>(&h.destination));
  }
  rest_.assign(head_.begin() + static_cast<std::ptrdiff_t>(h.length), head_.end());
  head_ = {};
  r.kind = PrereadResult::Kind::next;
  return r;
}

}  // namespace sluice
