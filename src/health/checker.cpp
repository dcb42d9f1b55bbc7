#include "health/checker.hpp"

#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "health/one_writer.hpp"
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
    // No longer checked: a "down" left behind would keep the server out for
    // good, and so would a fence no check can lift any more.
    if (w == wanted.end()) {
      ServerState& st = *it->second->state();
      st.set_active(ActiveState::unchecked, "active checks off");
      st.set_first_pending(false);
      if (st.fence_kind() == FenceKind::lost || st.fence_kind() == FenceKind::waiting) {
        st.unfence("active checks off");
      }
    }
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

void HealthChecker::serves_again(const std::shared_ptr<ServerState>& state) {
  if (on_up_) on_up_(state);
}

void HealthChecker::fence(Target& loser, FenceKind kind, const Target& winner, const std::string& why) {
  const bool was = loser.state()->fenced();
  loser.state()->fence(kind, winner.state()->address.text,
                       winner.state()->address.text + " also says it is the primary; " + why);
  if (!was && on_down_) on_down_(loser.state(), loser.config(), SessionAction::fence);
}

bool HealthChecker::arbitrate(Target& t) {
  if (!health::wants_one_writer(t.config())) return false;
  // The pool: the servers checked for the same upstream (one per server).
  std::vector<Target*> pool;
  for (auto& [key, other] : targets_) {
    if (other->state()->upstream == t.state()->upstream && health::wants_one_writer(other->config())) {
      pool.push_back(other.get());
    }
  }
  // Fences that no longer hold: a fenced server that no longer says it is
  // the primary; one that waits, once no rival says so any more.
  for (Target* f : pool) {
    const FenceKind kind = f->state()->fence_kind();
    if (kind != FenceKind::lost && kind != FenceKind::waiting) continue;
    if (!f->says_primary()) {
      f->state()->unfence("it no longer says it is the primary");
      serves_again(f->state());
      continue;
    }
    if (kind == FenceKind::waiting &&
        std::none_of(pool.begin(), pool.end(), [f](const Target* r) {
          return r != f && r->says_primary() && r->state()->fence_kind() != FenceKind::lost;
        })) {
      f->state()->unfence("no other server says it is the primary any more");
      serves_again(f->state());
    }
  }
  if (!t.says_primary() || t.state()->fenced()) return false;
  // A server waiting behind this one is weighed again against this newer
  // reading: a rule may have waited for it (MySQL's GTID containment).
  if (t.state()->active_state() == ActiveState::up) {
    for (Target* w : pool) {
      if (w == &t || w->state()->fence_kind() != FenceKind::waiting || !w->says_primary() ||
          w->state()->fenced_by() != t.state()->address.text) {
        continue;
      }
      const health::Verdict v = health::judge(t.config().type, t.facts(), w->facts(), true);
      if (v.winner != health::Winner::newcomer) continue;
      w->state()->unfence("a newer reading of " + t.state()->address.text + " shows " + v.why);
      fence(t, v.loser, *w, v.why);
      serves_again(w->state());
      return false;
    }
  }
  // Its rival: another primary not fenced, the one serving first.
  Target* rival = nullptr;
  for (Target* r : pool) {
    if (r == &t || !r->says_primary() || r->state()->fenced()) continue;
    if (rival == nullptr || (r->state()->active_state() == ActiveState::up &&
                             rival->state()->active_state() != ActiveState::up)) {
      rival = r;
    }
  }
  if (rival == nullptr) return false;
  const bool serving = rival->state()->active_state() == ActiveState::up;
  const health::Verdict v = health::judge(t.config().type, rival->facts(), t.facts(), serving);
  switch (v.winner) {
    case health::Winner::newcomer:
      fence(*rival, v.loser, t, v.why);
      return true;
    case health::Winner::incumbent:
      fence(t, v.loser, *rival, v.why);
      return false;
    case health::Winner::neither:
      fence(t, FenceKind::waiting, *rival, v.why);
      fence(*rival, FenceKind::waiting, t, v.why);
      return false;
  }
  return false;
}

}  // namespace sluice
