#include "upstream/passive_health.hpp"

#include <algorithm>
#include <string>

namespace sluice {

namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

}  // namespace

PassiveHealth::PassiveHealth(std::uint32_t max_fails, Duration fail_timeout)
    : max_fails_(max_fails), fail_timeout_(fail_timeout) {}

void PassiveHealth::configure(std::uint32_t max_fails, Duration fail_timeout) {
  max_fails_ = max_fails;
  fail_timeout_ = fail_timeout;
  if (max_fails_ == 0 && state_ != State::up) {
    // Passive health switched off: nothing may keep the server out any more.
    state_ = State::up;
    fails_ = 0;
  }
}

PassiveHealth::Saved PassiveHealth::save(TimePoint now) const {
  Saved s;
  s.state = state_ == State::up ? State::up : State::down;
  s.fails = fails_;
  if (fails_ > 0) s.window_age = std::max(Duration{0}, duration_cast<Duration>(now - window_start_));
  if (state_ != State::up) {
    if (state_ == State::down) s.down_left = std::max(Duration{0}, duration_cast<Duration>(down_until_ - now));
    s.down_age = std::max(Duration{0}, duration_cast<Duration>(now - down_since_));
  }
  return s;
}

void PassiveHealth::restore(const Saved& saved, TimePoint now) {
  if (max_fails_ == 0) return;  // switched off here: nothing to keep the server out
  state_ = saved.state == State::up ? State::up : State::down;
  fails_ = saved.fails;
  window_start_ = now - std::min(saved.window_age, fail_timeout_);
  // Never longer than this configuration's period (the new one's file may
  // have shortened fail_timeout).
  down_until_ = now + std::min(saved.down_left, fail_timeout_);
  down_since_ = now - saved.down_age;
}

TimePoint PassiveHealth::eligible_from() const {
  switch (state_) {
    case State::up:
      return TimePoint::min();
    case State::down:
      return down_until_;
    case State::trial:
      return trial_until_;
  }
  return TimePoint::max();
}

void PassiveHealth::on_selected(TimePoint now, bool force) {
  // A down server whose period is over, or a trial that was never reported,
  // starts a (new) trial; the server stays unavailable to everyone else.
  if ((state_ == State::down && (force || now >= down_until_)) ||
      (state_ == State::trial && (force || now >= trial_until_))) {
    state_ = State::trial;
    trial_since_ = now;
    trial_until_ = now + fail_timeout_;
  }
}

PassiveHealth::Transition PassiveHealth::on_failure(TimePoint now, std::string_view error) {
  Transition t;
  if (max_fails_ == 0) return t;  // passive health disabled: nothing counts

  switch (state_) {
    case State::up: {
      if (fails_ == 0 || now - window_start_ >= fail_timeout_) {
        fails_ = 1;
        window_start_ = now;
      } else {
        ++fails_;
      }
      if (fails_ < max_fails_) return t;
      state_ = State::down;
      down_since_ = now;
      down_until_ = now + fail_timeout_;
      t.changed = true;
      t.now_up = false;
      t.reason = std::to_string(fails_) + (fails_ == 1 ? " passive failure" : " passive failures") +
                 " (failed connects) within " + format_duration(fail_timeout_) + ", last: " + std::string(error);
      t.detect = duration_cast<Duration>(now - window_start_);
      return t;
    }
    case State::trial:
      // Still unavailable, so not a transition; the period starts again.
      state_ = State::down;
      down_until_ = now + fail_timeout_;
      t.now_up = false;
      t.reason = "trial connection failed: " + std::string(error);
      return t;
    case State::down:
      // An attempt that started before the server was marked down: the same
      // evidence, so the period is not extended. Reported after the period
      // ended, it is fresh evidence and starts a new period.
      if (now >= down_until_) down_until_ = now + fail_timeout_;
      t.now_up = false;
      t.reason = "connect failed while down: " + std::string(error);
      return t;
  }
  return t;
}

PassiveHealth::Transition PassiveHealth::on_success(TimePoint now) {
  Transition t;
  switch (state_) {
    case State::up:
      fails_ = 0;  // nginx forgets earlier failures after a success
      return t;
    case State::trial:
      state_ = State::up;
      fails_ = 0;
      t.changed = true;
      t.now_up = true;
      t.reason = "trial connection succeeded after being down for " +
                 format_duration(duration_cast<milliseconds>(now - down_since_));
      t.detect = duration_cast<Duration>(now - trial_since_);
      return t;
    case State::down:
      // An attempt that started before the server was marked down; only a
      // trial brings it back.
      t.now_up = false;
      return t;
  }
  return t;
}

}  // namespace sluice
