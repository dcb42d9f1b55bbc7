#include "upstream/server_state.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace sluice {

std::string_view to_string(AdminState s) {
  switch (s) {
    case AdminState::enabled: return "enabled";
    case AdminState::drain: return "drain";
    case AdminState::disabled: return "disabled";
  }
  return "enabled";
}

std::string_view to_string(ActiveState s) {
  switch (s) {
    case ActiveState::unchecked: return "unchecked";
    case ActiveState::up: return "up";
    case ActiveState::down: return "down";
    case ActiveState::standby: return "standby";
  }
  return "unchecked";
}

std::string_view to_string(FenceKind k) {
  switch (k) {
    case FenceKind::none: return "none";
    case FenceKind::lost: return "lost";
    case FenceKind::waiting: return "waiting";
    case FenceKind::failover: return "failover";
  }
  return "none";
}

std::string_view to_string(CheckResult r) {
  switch (r) {
    case CheckResult::none: return "none";
    case CheckResult::pass: return "pass";
    case CheckResult::fail: return "fail";
    case CheckResult::local_error: return "local_error";
  }
  return "none";
}

std::int64_t wall_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

ServerState::ServerState(std::string upstream_name, Endpoint addr, std::uint32_t max_fails, Duration fail_timeout)
    : upstream(std::move(upstream_name)), address(std::move(addr)), health_(max_fails, fail_timeout) {}

void ServerState::observe_connect(double seconds) {
  std::size_t i = 0;
  while (i < kConnectBuckets.size() && seconds > kConnectBuckets[i]) ++i;
  connect_buckets[i].fetch_add(1, std::memory_order_relaxed);
  connect_sum_us.fetch_add(static_cast<std::uint64_t>(seconds * 1e6), std::memory_order_relaxed);
  connect_count.fetch_add(1, std::memory_order_relaxed);
  last_connect_ms.store(wall_ms(), std::memory_order_relaxed);
}

bool ServerState::eligible(TimePoint now) const {
  if (admin_.load(std::memory_order_acquire) != AdminState::enabled) return false;
  const ActiveState a = active_state_.load(std::memory_order_acquire);
  if (a == ActiveState::down || a == ActiveState::standby) return false;
  if (fence_.load(std::memory_order_acquire) != FenceKind::none) return false;
  if (clean_.load(std::memory_order_acquire)) return true;
  std::lock_guard lock(mu_);
  return health_.eligible(now);
}

void ServerState::on_selected(TimePoint now, bool lone) {
  // A clean server is up: selection changes nothing in its health.
  if (clean_.load(std::memory_order_acquire)) return;
  bool changed = false;
  {
    std::lock_guard lock(mu_);
    const TimePoint before = health_.eligible_from();
    health_.on_selected(now, lone);
    changed = health_.eligible_from() != before;
  }
  if (changed) notify();
}

void ServerState::configure_passive(std::uint32_t max_fails, Duration fail_timeout) {
  {
    std::lock_guard lock(mu_);
    health_.configure(max_fails, fail_timeout);
    clean_.store(health_.state() == PassiveHealth::State::up && health_.fails() == 0, std::memory_order_release);
  }
  notify();
}

TimePoint ServerState::passive_eligible_from() const {
  if (clean_.load(std::memory_order_acquire)) return TimePoint::min();
  std::lock_guard lock(mu_);
  return health_.eligible_from();
}

PassiveHealth::Saved ServerState::save_passive(TimePoint now) const {
  std::lock_guard lock(mu_);
  return health_.save(now);
}

void ServerState::restore_passive(const PassiveHealth::Saved& saved, TimePoint now) {
  {
    std::lock_guard lock(mu_);
    health_.restore(saved, now);
    if (health_.state() != PassiveHealth::State::up) {
      passive_reason_ = "as the previous process had it";
      passive_since_ms_ = wall_ms() - saved.down_age.count();
    }
    clean_.store(health_.state() == PassiveHealth::State::up && health_.fails() == 0, std::memory_order_release);
    track_down_locked(now);
  }
  notify();
}

void ServerState::watch(ServerWatcher* watcher, std::size_t index) {
  std::lock_guard lock(watch_mu_);
  watchers_.emplace_back(watcher, index);
  watcher_count_.store(watchers_.size(), std::memory_order_release);
}

void ServerState::unwatch(const ServerWatcher* watcher) {
  std::lock_guard lock(watch_mu_);
  std::erase_if(watchers_, [&](const auto& w) { return w.first == watcher; });
  watcher_count_.store(watchers_.size(), std::memory_order_release);
}

void ServerState::notify(const ServerWatcher* except) {
  if (except != nullptr && watcher_count_.load(std::memory_order_acquire) <= 1) return;
  std::lock_guard lock(watch_mu_);
  for (const auto& [watcher, index] : watchers_) {
    if (watcher != except) watcher->server_changed(index);
  }
}

void ServerState::report(ConnectResult result, std::string_view error, TimePoint now) {
  // Our own resource trouble says nothing about the server.
  if (result == ConnectResult::local_error) return;
  // The common case: a healthy server connected. Nothing to record, no lock.
  if (result == ConnectResult::connected && clean_.load(std::memory_order_acquire)) return;
  PassiveHealth::Transition t;
  {
    std::lock_guard lock(mu_);
    if (result == ConnectResult::connected) {
      t = health_.on_success(now);
    } else {
      total_failures.fetch_add(1, std::memory_order_relaxed);
      if (error.empty()) error = result == ConnectResult::timed_out ? "connect timed out" : "connect failed";
      t = health_.on_failure(now, error);
    }
    if (t.changed) {
      passive_reason_ = t.reason;
      passive_since_ms_ = wall_ms();
      if (t.now_up) up_since_ = now;  // slow start ramps after a passive recovery too
    }
    clean_.store(health_.state() == PassiveHealth::State::up && health_.fails() == 0, std::memory_order_release);
    track_down_locked(now);
  }
  notify();
  // Log outside the lock; each transition is seen by exactly one report() call.
  if (t.changed) {
    if (t.now_up) {
      spdlog::info("upstream \"{}\" server {} is up again: {} (detected in {})", upstream, address.text, t.reason,
                   format_duration(t.detect));
    } else {
      spdlog::warn("upstream \"{}\" server {} marked down: {} (detected in {})", upstream, address.text, t.reason,
                   format_duration(t.detect));
    }
  } else if (!t.reason.empty()) {
    spdlog::debug("upstream \"{}\" server {} still down: {}", upstream, address.text, t.reason);
  }
}

void ServerState::set_active(ActiveState s, std::string_view reason, Duration detect) {
  const ActiveState before = active_state_.exchange(s, std::memory_order_acq_rel);
  {
    std::lock_guard lock(mu_);
    active_reason_ = std::string(reason);
    if (before != s) active_since_ms_ = wall_ms();
    if (s == ActiveState::up && before == ActiveState::down && !active_guess_) up_since_ = Clock::now();
    active_guess_ = before == ActiveState::unchecked && s != ActiveState::unchecked;
    if (before != s) track_down_locked(Clock::now());
  }
  if (before == s) return;
  notify();
  if (s == ActiveState::up) {
    if (before == ActiveState::down || before == ActiveState::standby) {
      spdlog::info("upstream \"{}\" server {} is up (active check): {} (detected in {})", upstream, address.text,
                   reason, format_duration(detect));
    }
  } else if (s == ActiveState::standby) {
    // It answers, with another role: what a replica in a primary pool
    // does all day. Not a failure, so not a warning.
    spdlog::info("upstream \"{}\" server {} is standby (active check): {}", upstream, address.text, reason);
  } else if (s == ActiveState::down && before == ActiveState::unchecked) {
    // Where a server with initial = "down" starts: nothing has failed, and a
    // warning at every start would teach operators to ignore warnings.
    spdlog::info("upstream \"{}\" server {} starts down (active check): {}", upstream, address.text, reason);
  } else if (s == ActiveState::down) {
    spdlog::warn("upstream \"{}\" server {} marked down (active check): {} (detected in {})", upstream,
                 address.text, reason, format_duration(detect));
  }
}

void ServerState::set_role(std::string role, std::optional<double> lag_seconds) {
  std::lock_guard lock(mu_);
  role_ = std::move(role);
  lag_seconds_ = lag_seconds;
}

std::string ServerState::role() const {
  std::lock_guard lock(mu_);
  return role_;
}

std::optional<double> ServerState::lag_seconds() const {
  std::lock_guard lock(mu_);
  return lag_seconds_;
}

void ServerState::set_first_pending(bool pending) {
  if (first_pending_.exchange(pending, std::memory_order_acq_rel) == pending) return;
  {
    // Waiting for a first answer is not downtime; what the answer says may be.
    std::lock_guard lock(mu_);
    track_down_locked(Clock::now());
  }
  notify();
}

void ServerState::fence(FenceKind kind, std::string by, std::string reason) {
  if (kind == FenceKind::none) return;
  const FenceKind before = fence_.exchange(kind, std::memory_order_acq_rel);
  {
    std::lock_guard lock(mu_);
    if (before == FenceKind::none) fence_since_ms_ = wall_ms();
    fenced_by_ = std::move(by);
    fence_reason_ = std::move(reason);
  }
  if (before != FenceKind::none) return;
  notify();
  std::lock_guard lock(mu_);
  const std::string next = fenced_by_.empty()            ? std::string()
                           : kind == FenceKind::failover ? " (" + fenced_by_ + " is to take over)"
                           : kind == FenceKind::lost     ? " (" + fenced_by_ + " serves)"
                                                         : std::string();
  spdlog::warn("upstream \"{}\" server {} fenced: {}{}; no new session goes there, its {} live session(s) are closed",
               upstream, address.text, fence_reason_, next, active.load(std::memory_order_relaxed));
}

void ServerState::unfence(std::string_view why) {
  if (fence_.exchange(FenceKind::none, std::memory_order_acq_rel) == FenceKind::none) return;
  {
    std::lock_guard lock(mu_);
    fenced_by_.clear();
    fence_reason_.clear();
    fence_since_ms_ = wall_ms();
  }
  notify();
  spdlog::info("upstream \"{}\" server {} no longer fenced: {}", upstream, address.text, why);
}

void ServerState::mark_sessions_ended(std::uint64_t at_ms, Cause cause) const {
  ended_cause_.store(cause, std::memory_order_relaxed);
  ended_at_ms_.store(at_ms, std::memory_order_release);
}

Cause ServerState::ended_since(std::uint64_t started_ms) const {
  const std::uint64_t at = ended_at_ms_.load(std::memory_order_acquire);
  if (at == 0 || started_ms > at) return Cause::none;
  return ended_cause_.load(std::memory_order_relaxed);
}

std::string ServerState::fenced_by() const {
  std::lock_guard lock(mu_);
  return fenced_by_;
}

void ServerState::note_check(std::string_view reason, bool failed) {
  std::lock_guard lock(mu_);
  active_reason_ = std::string(reason);
  if (failed) active_guess_ = false;
}

TimePoint ServerState::up_since() const {
  std::lock_guard lock(mu_);
  return up_since_;
}

void ServerState::set_admin(AdminState s) {
  const AdminState before = admin_.exchange(s, std::memory_order_acq_rel);
  if (before == s) return;
  {
    std::lock_guard lock(mu_);
    admin_since_ms_ = wall_ms();
  }
  notify();
  spdlog::info("upstream \"{}\" server {}: admin state {} -> {}", upstream, address.text, to_string(before),
               to_string(s));
}

void ServerState::set_weight_override(std::uint32_t weight, std::uint32_t file_weight) {
  weight_override_base_.store(file_weight, std::memory_order_relaxed);
  weight_override_.store(weight, std::memory_order_relaxed);
  notify();
}

void ServerState::clear_weight_override() {
  weight_override_.store(0, std::memory_order_relaxed);
  notify();
}

bool ServerState::passive_up() const {
  std::lock_guard lock(mu_);
  return health_.state() == PassiveHealth::State::up;
}

ServerState::Status ServerState::status(TimePoint now) const {
  Status st;
  std::lock_guard lock(mu_);
  track_down_locked(now);
  switch (health_.state()) {
    case PassiveHealth::State::up: st.passive = "up"; break;
    case PassiveHealth::State::down: st.passive = "down"; break;
    case PassiveHealth::State::trial: st.passive = "trial"; break;
  }
  st.passive_fails = health_.fails();
  st.active_reason = active_reason_;
  st.active_since_ms = active_since_ms_;
  st.role = role_;
  st.lag_seconds = lag_seconds_;
  const AdminState admin = admin_.load(std::memory_order_acquire);
  const ActiveState checked = active_state_.load(std::memory_order_acquire);
  const bool fenced = fence_.load(std::memory_order_acquire) != FenceKind::none;
  if (fenced) {
    st.fenced_by = fenced_by_;
    st.fence_reason = fence_reason_;
  }
  if (admin == AdminState::disabled) {
    st.state = "disabled";
    st.reason = "disabled through the admin API";
    st.since_ms = admin_since_ms_;
  } else if (admin == AdminState::drain) {
    st.state = "drained";
    st.reason = "draining through the admin API";
    st.since_ms = admin_since_ms_;
  } else if (fenced) {
    st.state = "fenced";
    st.reason = fence_reason_;
    st.since_ms = fence_since_ms_;
  } else if (checked == ActiveState::down) {
    st.state = "down";
    st.reason = "active check: " + active_reason_;
    st.since_ms = active_since_ms_;
  } else if (health_.state() != PassiveHealth::State::up && !health_.eligible(now)) {
    st.state = "down";
    st.reason = "passive: " + passive_reason_;
    st.since_ms = passive_since_ms_;
  } else if (checked == ActiveState::standby) {
    st.state = "standby";
    st.reason = "active check: " + active_reason_;
    st.since_ms = active_since_ms_;
  } else {
    st.state = "up";
    st.reason = checked == ActiveState::up ? "active check: " + active_reason_
                                          : (passive_reason_.empty() ? std::string("no failures") : passive_reason_);
    st.since_ms = std::max({passive_since_ms_, active_since_ms_, admin_since_ms_, fence_since_ms_});
  }
  return st;
}

void ServerState::record_check(std::string_view type, CheckResult result, double seconds, std::string_view reason) {
  if (result == CheckResult::pass || result == CheckResult::fail) check_seconds.observe(seconds);
  if (result == CheckResult::fail) check_failures.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  last_check_.type = std::string(type);
  last_check_.result = result;
  last_check_.seconds = seconds;
  last_check_.at_ms = wall_ms();
  last_check_.reason = std::string(reason);
}

ServerState::LastCheck ServerState::last_check() const {
  std::lock_guard lock(mu_);
  return last_check_;
}

void ServerState::track_down_locked(TimePoint now) const {
  const bool active_down = active_state_.load(std::memory_order_acquire) == ActiveState::down &&
                           !first_pending_.load(std::memory_order_acquire);
  const bool down = active_down || (health_.state() != PassiveHealth::State::up && !health_.eligible(now));
  if (down == down_) return;
  if (down) {
    down_since_ = now;
    ++down_count_;
  } else {
    // Passive health ends a down period by time alone, perhaps well before
    // this call noticed: count only up to when it let the server back.
    TimePoint end = now;
    if (health_.state() != PassiveHealth::State::up) end = std::clamp(health_.eligible_from(), down_since_, now);
    downtime_ += std::chrono::duration_cast<Duration>(end - down_since_);
  }
  down_ = down;
}

Duration ServerState::downtime(TimePoint now) const {
  std::lock_guard lock(mu_);
  track_down_locked(now);
  return down_ ? downtime_ + std::chrono::duration_cast<Duration>(now - down_since_) : downtime_;
}

std::uint64_t ServerState::down_count() const {
  std::lock_guard lock(mu_);
  return down_count_;
}

}  // namespace sluice

namespace sluice {

ServerState::History ServerState::history(TimePoint now) const {
  History h;
  std::lock_guard lock(mu_);
  track_down_locked(now);
  h.down_count = down_count_;
  h.down = down_;
  h.down_for = down_ ? std::chrono::duration_cast<Duration>(now - down_since_) : Duration{0};
  h.downtime = downtime_ + h.down_for;
  h.active_since_ms = active_since_ms_;
  h.admin_since_ms = admin_since_ms_;
  h.passive_since_ms = passive_since_ms_;
  h.active_reason = active_reason_;
  h.passive_reason = passive_reason_;
  h.last_check = last_check_;
  return h;
}

void ServerState::restore_history(const History& h, TimePoint now) {
  std::lock_guard lock(mu_);
  track_down_locked(now);
  if (down_ && h.down) {
    // The same down period, begun in the old process.
    down_since_ = now - h.down_for;
    downtime_ = h.downtime - h.down_for;
    down_count_ = h.down_count;
  } else {
    downtime_ = h.downtime;
    down_count_ = h.down_count + (down_ ? 1 : 0);
  }
  if (h.active_since_ms != 0) active_since_ms_ = h.active_since_ms;
  if (h.admin_since_ms != 0) admin_since_ms_ = h.admin_since_ms;
  if (h.passive_since_ms != 0) passive_since_ms_ = h.passive_since_ms;
  if (!h.active_reason.empty()) active_reason_ = h.active_reason;
  if (!h.passive_reason.empty()) passive_reason_ = h.passive_reason;
  if (h.last_check.result != CheckResult::none) last_check_ = h.last_check;
}

}  // namespace sluice
