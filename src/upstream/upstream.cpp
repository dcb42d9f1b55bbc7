#include "upstream/upstream.hpp"

#include <cmath>

#include "balance/hash.hpp"
#include "upstream/slow_start.hpp"

namespace sluice {

Upstream::Upstream(const UpstreamConfig& config, std::vector<std::shared_ptr<ServerState>> states,
                   std::uint64_t random_seed)
    : config_(config),
      slow_start_(config.health ? config.health->slow_start : Duration{0}),
      balancer_(make_balancer(config.balance, config.hash_balance_factor, random_seed)) {
  members_.reserve(config_.servers.size());
  for (std::size_t i = 0; i < config_.servers.size(); ++i) {
    Member m;
    m.state = std::move(states[i]);
    m.config = config_.servers[i];
    m.seed = rendezvous_server_seed(m.config.address.text);
    members_.push_back(std::move(m));
  }
  candidates_.resize(members_.size());
}

std::uint32_t Upstream::base_weight(std::size_t index) const {
  const Member& m = members_[index];
  const std::uint32_t o = m.state->weight_override();
  return o != 0 ? o : m.config.weight;
}

std::uint32_t Upstream::effective_weight_centi(std::size_t index, TimePoint now) const {
  const double base = base_weight(index) * 100.0;
  if (slow_start_.count() <= 0) return static_cast<std::uint32_t>(base);
  const TimePoint up = members_[index].state->up_since();
  if (up == TimePoint{}) return static_cast<std::uint32_t>(base);
  const auto since = std::chrono::duration_cast<Duration>(now - up);
  const double w = std::round(base * slow_start_factor(since, slow_start_));
  return w < 1.0 ? 1U : static_cast<std::uint32_t>(w);
}

bool Upstream::fill(bool backup_tier, bool ignore_health, const TriedSet& tried, TimePoint now) {
  const bool hashing = config_.balance == Balance::hash;
  bool any = false;
  for (std::size_t i = 0; i < members_.size(); ++i) {
    const Member& m = members_[i];
    const ServerState& s = *m.state;
    Candidate& c = candidates_[i];
    c.seed = m.seed;
    c.active = s.active.load(std::memory_order_relaxed);
    // Hashing keeps the file's weight (a ramp would move keys back and forth).
    c.weight = hashing ? base_weight(i) : effective_weight_centi(i, now);
    bool ok = m.config.backup == backup_tier && !tried.contains(i) &&
              (m.config.max_conns == 0 || c.active < m.config.max_conns);
    if (ok) ok = ignore_health ? s.admin() == AdminState::enabled : s.eligible(now);
    c.eligible = ok;
    any = any || ok;
  }
  return any;
}

long Upstream::pick(const TriedSet& tried, std::string_view key, TimePoint now) {
  std::lock_guard lock(mu_);
  std::size_t chosen = kNoCandidate;
  for (const bool backup_tier : {false, true}) {
    if (fill(backup_tier, false, tried, now)) {
      chosen = balancer_->choose(candidates_, key);
      if (chosen != kNoCandidate) break;
    }
  }
  if (chosen == kNoCandidate && config_.all_down == AllDown::fail_open) {
    // Panic mode (Envoy's term): only when no server at all passes its health
    // checks; servers that are merely full or already tried do not count.
    bool any_healthy = false;
    for (const Member& m : members_) any_healthy = any_healthy || m.state->eligible(now);
    if (!any_healthy) {
      for (const bool backup_tier : {false, true}) {
        if (fill(backup_tier, true, tried, now)) {
          chosen = balancer_->choose(candidates_, key);
          if (chosen != kNoCandidate) break;
        }
      }
    }
  }
  if (chosen == kNoCandidate) return -1;
  ServerState& s = *members_[chosen].state;
  s.on_selected(now);
  s.active.fetch_add(1, std::memory_order_relaxed);
  s.total_sessions.fetch_add(1, std::memory_order_relaxed);
  return static_cast<long>(chosen);
}

}  // namespace sluice
