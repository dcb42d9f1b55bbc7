// One checked server: its probe, the pause between checks, and the rise/fall
// counter. Internal to HealthChecker.
#pragma once

#include <uv.h>

#include <functional>
#include <memory>
#include <string>

#include "health/checker.hpp"
#include "health/handles.hpp"
#include "health/probe.hpp"
#include "health/rise_fall.hpp"
#include "sluice/time.hpp"

namespace sluice::health {

// Do two health tables ask for the same check?
bool same_check(const HealthConfig& a, const HealthConfig& b);
// Do two server addresses make the same probe (text and resolved address)?
bool same_target(const Endpoint& a, const Endpoint& b);

class Target {
 public:
  // `address` is the server's address as the configuration has it now.
  Target(HealthChecker& owner, std::shared_ptr<ServerState> state, const HealthConfig& config,
         const Endpoint& address);
  Target(const Target&) = delete;
  Target& operator=(const Target&) = delete;

  // Applies `initial` when the server was never checked and schedules the
  // first check: at once for a server that starts down (it takes no
  // traffic until a check answers), else within the jitter.
  void start();
  // Stops checking; `closed` runs once every handle is closed.
  void close(std::function<void()> closed);

  const std::shared_ptr<ServerState>& state() const { return state_; }
  const HealthConfig& config() const { return config_; }
  const Endpoint& address() const { return address_; }
  // Started down and no check has answered yet.
  bool waiting_first() const { return waiting_first_; }
  // What the last check read of the server's role and history.
  const RoleFacts& facts() const { return facts_; }
  // It says it is the primary: its last answer said so, and it has not
  // been marked down since (a check that does not answer changes nothing
  // until `fall` of them take it down).
  bool says_primary() const {
    return facts_.answered && facts_.primary && (answered_ || state_->active_state() != ActiveState::down);
  }

 private:
  using Timer = Handle<uv_timer_t, Target>;
  static void on_timer(uv_timer_t* t);
  void check();
  void on_result(Probe::Verdict verdict, std::string reason);
  void schedule(Duration delay);
  void part_closed();

  HealthChecker& owner_;
  std::shared_ptr<ServerState> state_;
  HealthConfig config_;
  Endpoint address_;
  std::unique_ptr<Probe> probe_;
  HandleTracker handles_;
  Timer* timer_ = nullptr;
  RiseFall counter_;
  TimePoint check_started_{};
  TimePoint streak_started_{};  // start of the first check that disagreed with the state
  bool waiting_first_ = false;   // started down (initial = "down") and no result yet
  // The last result (not a local error) was a pass. Before the first, as
  // the server stands: one that serves already (initial = "up", or up as a
  // reload's earlier check or an old process's left it) has passed as far
  // as its sessions know, so a first answer with another role is a role
  // change and on_role_change decides for them.
  bool last_passed_ = false;
  std::uint32_t standby_failures_ = 0;  // failures in a row that were not a role answer
  RoleFacts facts_;       // the last answer's
  bool answered_ = false;  // the last check answered
  int parts_open_ = 0;
  std::function<void()> closed_;
};

}  // namespace sluice::health
