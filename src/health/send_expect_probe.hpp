// type = "send_expect": write `send` (may be empty), then read until the
// reply starts with `expect` (expect_match = "prefix") or contains it
// ("substring"), the peer closes, 64 KiB have come, or the timeout. An empty
// `expect` passes once `send` is written.
#pragma once

#include <string>

#include "health/stream_probe.hpp"

namespace sluice::health {

class SendExpectProbe final : public StreamProbe {
 public:
  using StreamProbe::StreamProbe;

 private:
  void on_connected() override;
  void on_sent() override;
  void on_data(std::string_view bytes) override;
  void on_end(std::string_view error) override;

  std::string reply_;
};

}  // namespace sluice::health
