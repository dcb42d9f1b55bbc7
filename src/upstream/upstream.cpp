#include "upstream/upstream.hpp"

namespace sluice {

Upstream::Upstream(const UpstreamConfig& config)
    : config_(config), balancer_(make_balancer(config)) {
  servers_.reserve(config_.servers.size());
  server_ptrs_.reserve(config_.servers.size());
  for (const ServerConfig& s : config_.servers) {
    servers_.push_back(
        std::make_unique<ServerState>(config_.name, s, config_.max_fails, config_.fail_timeout));
    server_ptrs_.push_back(servers_.back().get());
  }
  scratch_.reserve(servers_.size());
}

long Upstream::pick(const std::vector<bool>& tried, std::string_view key, TimePoint now) {
  std::lock_guard lock(mu_);
  // Primaries first; the backup tier only when no primary is left to try.
  for (const bool backup_tier : {false, true}) {
    scratch_.clear();
    for (std::size_t i = 0; i < servers_.size(); ++i) {
      const ServerState& s = *servers_[i];
      if (s.backup != backup_tier) continue;
      if (i < tried.size() && tried[i]) continue;
      if (!s.eligible(now)) continue;
      scratch_.push_back(i);
    }
    if (!scratch_.empty()) break;
  }
  if (scratch_.empty()) return -1;

  const std::size_t chosen = balancer_->choose(server_ptrs_, scratch_, key);
  ServerState& s = *servers_[chosen];
  s.on_selected(now);
  s.active.fetch_add(1, std::memory_order_relaxed);
  s.total_sessions.fetch_add(1, std::memory_order_relaxed);
  return static_cast<long>(chosen);
}

}  // namespace sluice
