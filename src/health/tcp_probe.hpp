// type = "tcp": the server accepts a connection. Closed as soon as it is up.
#pragma once

#include "health/stream_probe.hpp"

namespace sluice::health {

class TcpProbe final : public StreamProbe {
 public:
  using StreamProbe::StreamProbe;

 private:
  void on_connected() override { finish(true, "connected"); }
  void on_data(std::string_view) override {}
  void on_end(std::string_view) override {}
};

}  // namespace sluice::health
