// An upstream pool at run time: its servers' shared state plus its balancer.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "balance/balancer.hpp"
#include "sluice/config.hpp"
#include "upstream/server_state.hpp"

namespace sluice {

class Upstream {
 public:
  explicit Upstream(const UpstreamConfig& config);

  const std::string& name() const { return config_.name; }
  const UpstreamConfig& config() const { return config_; }
  std::size_t size() const { return servers_.size(); }
  ServerState& server(std::size_t i) { return *servers_[i]; }

  // Picks an eligible server whose index is not set in `tried` (tried.size()
  // == size()). Primaries first; backups only when no primary is eligible.
  // On success the chosen server's `active` and `total_sessions` are
  // incremented (under the lock, so least_conn is exact across workers) and its
  // index is returned; otherwise -1. `key` is the hash key (ignored by other
  // algorithms). Thread-safe.
  long pick(const std::vector<bool>& tried, std::string_view key, TimePoint now);

  // Undo of pick's accounting when the session leaves that server.
  void release(std::size_t index) { servers_[index]->active.fetch_sub(1, std::memory_order_relaxed); }

 private:
  UpstreamConfig config_;
  std::vector<std::unique_ptr<ServerState>> servers_;
  std::vector<ServerState*> server_ptrs_;
  std::unique_ptr<Balancer> balancer_;
  std::mutex mu_;
  std::vector<std::size_t> scratch_;  // candidate indices, reused under mu_
};

}  // namespace sluice
