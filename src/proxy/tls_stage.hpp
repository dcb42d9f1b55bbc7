// The TLS preread stage: reads the ClientHello without terminating TLS and
// routes on its SNI (routes, then default_upstream), per the listener's
// on_not_tls / on_malformed.
#pragma once

#include "preread/client_hello.hpp"
#include "proxy/preread_stage.hpp"

namespace sluice {

struct ListenerView;
class Snapshot;

class TlsStage final : public PrereadStage {
 public:
  TlsStage(const ListenerView& listener, const Snapshot& snapshot);

  PrereadResult feed(std::span<const std::uint8_t> data) override;
  std::vector<std::uint8_t> take_forward() override;
  const char* error() const override { return parser_.error(); }

 private:
  const ListenerView& listener_;
  const Snapshot& snapshot_;
  preread::ClientHelloParser parser_;
  std::vector<std::uint8_t> extra_;  // bytes of the last read past the parser's cap
};

}  // namespace sluice
