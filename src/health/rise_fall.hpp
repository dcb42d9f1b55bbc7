// Rise/fall hysteresis (HAProxy's `rise`/`fall`): a server changes state only
// after `rise` consecutive passes (down -> up) or `fall` consecutive failures
// (up -> down). A result that agrees with the current state resets the
// opposite count. Pure.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

namespace sluice::health {

class RiseFall {
 public:
  RiseFall(std::uint32_t rise, std::uint32_t fall, bool up)
      : rise_(std::max<std::uint32_t>(rise, 1)), fall_(std::max<std::uint32_t>(fall, 1)), up_(up) {}

  // Records one check's result; returns the new state when it changes.
  std::optional<bool> record(bool ok) {
    if (ok == up_) {
      streak_ = 0;
      return std::nullopt;
    }
    if (++streak_ < (up_ ? fall_ : rise_)) return std::nullopt;
    up_ = ok;
    streak_ = 0;
    return up_;
  }

  // Sets the state outright (a verdict that needs no hysteresis).
  void reset(bool up) {
    up_ = up;
    streak_ = 0;
  }

  bool up() const { return up_; }
  // Consecutive results against the current state so far.
  std::uint32_t streak() const { return streak_; }
  // How many such results change the state (rise when down, fall when up).
  std::uint32_t needed() const { return up_ ? fall_ : rise_; }

 private:
  std::uint32_t rise_;
  std::uint32_t fall_;
  bool up_;
  std::uint32_t streak_ = 0;
};

}  // namespace sluice::health
