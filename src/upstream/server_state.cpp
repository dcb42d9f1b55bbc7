#include "upstream/server_state.hpp"

#include <spdlog/spdlog.h>

namespace sluice {

ServerState::ServerState(const std::string& upstream_name, const ServerConfig& server,
                         std::uint32_t max_fails, Duration fail_timeout)
    : upstream(upstream_name),
      address(server.address),
      weight(server.weight),
      max_conns(server.max_conns),
      backup(server.backup),
      health_(max_fails, fail_timeout) {}

bool ServerState::eligible(TimePoint now) const {
  if (max_conns != 0 && active.load(std::memory_order_relaxed) >= max_conns) return false;
  if (clean_.load(std::memory_order_acquire)) return true;
  std::lock_guard lock(mu_);
  return health_.eligible(now);
}

void ServerState::on_selected(TimePoint now) {
  // A clean server is up: selection changes nothing in its health.
  if (clean_.load(std::memory_order_acquire)) return;
  std::lock_guard lock(mu_);
  health_.on_selected(now);
}

void ServerState::report(ConnectResult result, std::string_view error, TimePoint now) {
  // The common case: a healthy server connected. Nothing to record, no lock.
  if (result == ConnectResult::connected && clean_.load(std::memory_order_acquire)) return;
  PassiveHealth::Transition t;
  {
    std::lock_guard lock(mu_);
    if (result == ConnectResult::connected) {
      t = health_.on_success(now);
    } else {
      total_failures.fetch_add(1, std::memory_order_relaxed);
      if (error.empty()) {
        error = result == ConnectResult::timed_out ? "connect timed out" : "connect failed";
      }
      t = health_.on_failure(now, error);
    }
    clean_.store(health_.state() == PassiveHealth::State::up && health_.fails() == 0,
                 std::memory_order_release);
  }
  // Log outside the lock; each transition is seen by exactly one report() call.
  if (t.changed) {
    if (t.now_up) {
      spdlog::info("upstream \"{}\" server {} is up again: {}", upstream, address.text, t.reason);
    } else {
      spdlog::warn("upstream \"{}\" server {} marked down: {}", upstream, address.text, t.reason);
    }
  } else if (!t.reason.empty()) {
    spdlog::debug("upstream \"{}\" server {} still down: {}", upstream, address.text, t.reason);
  }
}

bool ServerState::passive_up() const {
  std::lock_guard lock(mu_);
  return health_.state() == PassiveHealth::State::up;
}

}  // namespace sluice
