// The PROXY protocol stage (accept_proxy listeners): collects the v1 or v2
// header a trusted proxy puts before the client's bytes, and learns the
// client's address and the one it connected to from it. It never routes:
// the bytes after the header go to the next stage of the chain.
#pragma once

#include "proxy/preread_stage.hpp"

namespace sluice {

class ProxyHeaderStage final : public PrereadStage {
 public:
  PrereadResult feed(std::span<const std::uint8_t> data) override;
  std::vector<std::uint8_t> take_forward() override { return std::move(rest_); }
  const char* error() const override { return error_.c_str(); }
  bool names_client() const override { return true; }

 private:
  std::vector<std::uint8_t> head_;  // the header's bytes so far
  std::vector<std::uint8_t> rest_;  // what followed it
  std::string error_;
};

}  // namespace sluice
