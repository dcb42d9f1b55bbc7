// Test helpers for what goes through Upstream: server configurations from
// "address" text and an Upstream over fresh server states. The candidate
// pools of the pure balancer tests are shared from balance/pool.hpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../balance/pool.hpp"
#include "sluice/config.hpp"
#include "sluice/time.hpp"
#include "upstream/upstream.hpp"

namespace sluice::test {

// A fixed start for tests that pass the time in: an hour after the clock's
// epoch, so that times before it are valid too.
inline const TimePoint t0{std::chrono::hours(1)};

inline ServerConfig server_config(const std::string& text, std::uint32_t weight = 1,
                                  std::uint32_t max_conns = 0, bool backup = false) {
  ServerConfig c;
  c.address.text = text;
  const auto colon = text.rfind(':');
  c.address.host = text.substr(0, colon);
  c.address.port = static_cast<std::uint16_t>(std::stoul(text.substr(colon + 1)));
  c.weight = weight;
  c.max_conns = max_conns;
  c.backup = backup;
  return c;
}

inline std::unique_ptr<Upstream> make_upstream(const UpstreamConfig& config, std::uint64_t seed = 1) {
  std::vector<std::shared_ptr<ServerState>> states;
  for (const ServerConfig& s : config.servers) {
    states.push_back(std::make_shared<ServerState>(config.name, s.address, config.max_fails, config.fail_timeout));
  }
  return std::make_unique<Upstream>(config, std::move(states), seed);
}

}  // namespace sluice::test
