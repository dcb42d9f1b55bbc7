// Test helper: a pool of ServerStates built from "address:weight" specs, with
// numeric addresses filled in by hand (no config parser involved).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sluice/config.hpp"
#include "upstream/server_state.hpp"

namespace sluice::test {

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

struct Pool {
  std::vector<std::unique_ptr<ServerState>> owned;
  std::vector<ServerState*> ptrs;

  ServerState& add(const std::string& text, std::uint32_t weight = 1) {
    owned.push_back(std::make_unique<ServerState>("test", server_config(text, weight), 1,
                                                  std::chrono::seconds(10)));
    ptrs.push_back(owned.back().get());
    return *owned.back();
  }
  std::vector<std::size_t> all() const {
    std::vector<std::size_t> v(ptrs.size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = i;
    return v;
  }
  ServerState& operator[](std::size_t i) { return *owned[i]; }
};

}  // namespace sluice::test
