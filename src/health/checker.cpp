#include "health/checker.hpp"

#include <algorithm>
#include <iterator>
#include <utility>

#include "health/target.hpp"
#include "runtime/snapshot.hpp"

namespace sluice {

using health::Target;

HealthChecker::HealthChecker(uv_loop_t* loop, DownCallback on_down)
    : loop_(loop), on_down_(std::move(on_down)), rng_(std::random_device{}()) {}

HealthChecker::~HealthChecker() = default;

void HealthChecker::update(const Snapshot& snapshot) {
  if (stopping_) return;
  struct Wanted {
    std::shared_ptr<ServerState> state;
    const HealthConfig* config;
    const Endpoint* address;  // as the file says now
  };
  std::map<const ServerState*, Wanted> wanted;
  for (const auto& [name, upstream] : snapshot.upstreams) {
    const auto& health = upstream->config().health;
    if (!health) continue;
    for (std::size_t i = 0; i < upstream->size(); ++i) {
      const Member& m = upstream->member(i);
      wanted.emplace(m.state.get(), Wanted{m.state, &*health, &m.config.address});
    }
  }
  for (auto it = targets_.begin(); it != targets_.end();) {
    const auto w = wanted.find(it->first);
    if (w != wanted.end() && health::same_check(it->second->config(), *w->second.config) &&
        health::same_target(it->second->address(), *w->second.address)) {
      ++it;
      continue;
    }
    // No longer checked: a "down" left behind would keep the server out for good.
    if (w == wanted.end()) it->second->state()->set_active(ActiveState::unchecked, "active checks off");
    retire(std::move(it->second));
    it = targets_.erase(it);
  }
  for (const auto& [key, w] : wanted) {
    if (targets_.count(key) != 0) continue;
    auto target = std::make_unique<Target>(*this, w.state, *w.config, *w.address);
    target->start();
    targets_.emplace(key, std::move(target));
  }
}

void HealthChecker::stop(std::function<void()> done) {
  stopping_ = true;
  stopped_ = std::move(done);
  for (auto& [key, target] : targets_) retire(std::move(target));
  targets_.clear();
  maybe_stopped();
}

void HealthChecker::retire(std::unique_ptr<Target> target) {
  Target* raw = target.get();
  retiring_.push_back(std::move(target));
  const auto it = std::prev(retiring_.end());
  raw->close([this, it] {
    retiring_.erase(it);
    maybe_stopped();
  });
}

void HealthChecker::maybe_stopped() {
  if (!stopping_ || !retiring_.empty() || !stopped_) return;
  auto done = std::move(stopped_);
  stopped_ = nullptr;
  done();
}

double HealthChecker::uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

std::size_t HealthChecker::waiting_first() const {
  std::size_t n = 0;
  for (const auto& [key, target] : targets_) n += target->waiting_first() ? 1 : 0;
  return n;
}

Duration HealthChecker::longest_first_wait() const {
  Duration longest{0};
  for (const auto& [key, target] : targets_) {
    if (target->waiting_first()) longest = std::max(longest, target->config().timeout);
  }
  return longest;
}

void HealthChecker::reported_down(Target& target, bool role_changed) {
  if (!on_down_) return;
  const HealthConfig& c = target.config();
  // A demoted node's sessions write to the wrong place: on_role_change
  // decides for them, whatever on_down says about an ordinary failure.
  if (role_changed && c.on_role_change == OnRoleChange::close_sessions) {
    on_down_(target.state(), c, SessionAction::close);
    return;
  }
  switch (c.on_down) {
    case OnDown::keep: return;
    case OnDown::close_sessions: on_down_(target.state(), c, SessionAction::close); return;
    case OnDown::drain: on_down_(target.state(), c, SessionAction::drain); return;
  }
}

}  // namespace sluice
