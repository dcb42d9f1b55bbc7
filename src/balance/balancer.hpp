// One small interface for every balancing algorithm (HAProxy's lb_ops):
// the caller (Upstream::pick) has already filtered for eligibility and tiers;
// an algorithm only chooses among the candidates it is given.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>

#include "sluice/config.hpp"

namespace sluice {

class ServerState;

class Balancer {
 public:
  virtual ~Balancer() = default;
  // `servers` is the whole pool (stable order = config order); `candidates` is
  // a non-empty list of indices into it, all eligible. Returns one of
  // `candidates`. `key` is the hash key (empty if none). Called under the
  // upstream's lock, so implementations may keep unsynchronised state.
  virtual std::size_t choose(std::span<ServerState* const> servers,
                             std::span<const std::size_t> candidates,
                             std::string_view key) = 0;
};

std::unique_ptr<Balancer> make_balancer(const UpstreamConfig& config);

}  // namespace sluice
