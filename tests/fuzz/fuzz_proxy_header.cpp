// libFuzzer target for the PROXY protocol header parser. Invariants: it
// never reads past its input, an `ok` header is never longer than the input
// nor than kMaxProxyHeader, and feeding the same bytes in two pieces gives the
// same answer as feeding them at once (need_more on the first piece unless it
// already decides).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "preread/proxy_protocol.hpp"

using sluice::preread::ProxyHeader;
using sluice::preread::parse_proxy_header;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> all(data, size);
  const ProxyHeader whole = parse_proxy_header(all);
  if (whole.status == ProxyHeader::Status::ok) {
    if (whole.length == 0 || whole.length > size || whole.length > sluice::preread::kMaxProxyHeader) std::abort();
    // Exactly the header is enough; one byte less is not.
    const ProxyHeader exact = parse_proxy_header(all.first(whole.length));
    if (exact.status != ProxyHeader::Status::ok || exact.length != whole.length) std::abort();
    if (whole.length > 1) {
      const ProxyHeader shorter = parse_proxy_header(all.first(whole.length - 1));
      if (shorter.status == ProxyHeader::Status::ok) std::abort();
    }
  }
  if (whole.status == ProxyHeader::Status::invalid && whole.error.empty()) std::abort();
  return 0;
}
