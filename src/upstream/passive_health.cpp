#include "upstream/passive_health.hpp"

#include <string>

namespace sluice {

namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

}  // namespace

std::string format_duration(Duration d) {
  const auto ms = d.count();
  if (ms < 0) {
    // Built by append: GCC 12 at -O3 misreports "-" + std::string as -Wrestrict.
    std::string out = "-";
    out += format_duration(Duration(-ms));
    return out;
  }
  if (ms == 0) return "0s";
  if (ms % 3'600'000 == 0) return std::to_string(ms / 3'600'000) + "h";
  if (ms % 60'000 == 0) return std::to_string(ms / 60'000) + "m";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  if (ms < 1000) return std::to_string(ms) + "ms";
  // Seconds with up to three decimals, trailing zeros dropped: "1.5s", "12.345s".
  std::string frac = std::to_string(1000 + ms % 1000).substr(1);
  while (!frac.empty() && frac.back() == '0') frac.pop_back();
  return std::to_string(ms / 1000) + "." + frac + "s";
}

PassiveHealth::PassiveHealth(std::uint32_t max_fails, Duration fail_timeout)
    : max_fails_(max_fails), fail_timeout_(fail_timeout) {}

bool PassiveHealth::eligible(TimePoint now) const {
  switch (state_) {
    case State::up:
      return true;
    case State::down:
      return now >= down_until_;
    case State::trial:
      return now >= trial_until_;
  }
  return false;
}

void PassiveHealth::on_selected(TimePoint now) {
  // A down server whose period is over, or a trial that was never reported,
  // starts a (new) trial; the server stays unavailable to everyone else.
  if ((state_ == State::down && now >= down_until_) ||
      (state_ == State::trial && now >= trial_until_)) {
    state_ = State::trial;
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
      t.reason = std::to_string(fails_) + (fails_ == 1 ? " failed connect" : " failed connects") +
                 " within " + format_duration(fail_timeout_) + ", last: " + std::string(error);
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
