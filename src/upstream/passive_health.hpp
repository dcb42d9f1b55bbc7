// Passive health with nginx semantics (max_fails / fail_timeout), as a pure
// state machine with an injected clock. Not thread-safe: ServerState guards it.
//
//   up --(max_fails failures within fail_timeout)--> down (for fail_timeout)
//   down --(fail_timeout over, next real connection selected)--> trial
//   trial --(connect ok)--> up          trial --(connect fails)--> down
//
// While in trial no other connection is sent to the server (one trial at a time).
// A trial whose outcome is never reported (the attempt was abandoned) expires
// after fail_timeout, so a lost report cannot keep a server out forever.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/config.hpp"
#include "sluice/time.hpp"

namespace sluice {

class PassiveHealth {
 public:
  enum class State { up, down, trial };

  struct Transition {
    bool changed = false;  // state moved between "available" and "unavailable"
    bool now_up = true;
    std::string reason;    // human-readable, for the one log line per transition
    // How long detecting the change took, for that log line: down, from the
    // first failure of the window that took it down; up, from the start of
    // the trial connection that brought it back.
    Duration detect{0};
  };

  PassiveHealth(std::uint32_t max_fails, Duration fail_timeout);

  // A reload may change the parameters; the state is kept.
  void configure(std::uint32_t max_fails, Duration fail_timeout);

  // May a new connection be sent here now? (up, or down with its period over)
  bool eligible(TimePoint now) const { return now >= eligible_from(); }
  // From when eligible() holds, unless a report or a selection changes the
  // state first: the clock's minimum when up, else the end of the down
  // period or of the trial in flight.
  TimePoint eligible_from() const;
  // The balancer chose this server: a down server whose period is over
  // enters trial. `force`: at once, period or not (the upstream's only
  // usable server, which passive failures never keep out).
  void on_selected(TimePoint now, bool force = false);
  // A connect attempt failed (error or timeout); `error` says why, for the log.
  Transition on_failure(TimePoint now, std::string_view error);
  // A connect attempt succeeded.
  Transition on_success(TimePoint now);

  State state() const { return state_; }
  std::uint32_t fails() const { return fails_; }

  // The state as another process can take it over (a binary upgrade): times
  // relative to `now`, since the two processes' steady clocks need not agree.
  // A trial in flight is saved as down with its period over: the trial's
  // connection stays with the old process, so the new one's next pick is
  // the trial.
  struct Saved {
    State state = State::up;
    std::uint32_t fails = 0;
    Duration window_age{0};  // since the first failure of the counting window
    Duration down_left{0};   // until the down period ends
    Duration down_age{0};    // since the server became unavailable
  };
  Saved save(TimePoint now) const;
  void restore(const Saved& saved, TimePoint now);
  // When the server last became unavailable (meaningful while not up).
  TimePoint down_since() const { return down_since_; }

 private:
  std::uint32_t max_fails_;
  Duration fail_timeout_;
  State state_ = State::up;
  std::uint32_t fails_ = 0;
  TimePoint window_start_{};  // first failure of the current counting window
  TimePoint down_until_{};
  TimePoint down_since_{};    // when the server last became unavailable
  TimePoint trial_since_{};   // when the trial in flight was selected
  TimePoint trial_until_{};   // a trial not reported by then is abandoned
};

}  // namespace sluice
