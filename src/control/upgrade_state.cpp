#include "control/upgrade_state.hpp"

namespace sluice {

std::string_view to_string(UpgradeState s) {
  switch (s) {
    case UpgradeState::idle: return "none";
    case UpgradeState::starting: return "starting";
    case UpgradeState::handing_over: return "handing_over";
    case UpgradeState::finishing: return "finishing";
    case UpgradeState::handed_over: return "handed_over";
    case UpgradeState::failed: return "failed";
    case UpgradeState::receiving: return "receiving";
    case UpgradeState::took_over: return "took_over";
  }
  return "none";
}

bool upgrade_move_allowed(UpgradeState from, UpgradeState to) {
  using S = UpgradeState;
  switch (from) {
    case S::idle: return to == S::starting || to == S::receiving;
    // A new binary either takes over or fails; nothing else ends a start.
    case S::starting: return to == S::handing_over || to == S::failed;
    // The new process may die while sessions are still on their way: those
    // it did not acknowledge stay here, and this process serves again.
    case S::handing_over: return to == S::finishing || to == S::handed_over || to == S::failed;
    case S::finishing: return to == S::handed_over || to == S::failed;
    case S::handed_over: return false;  // the process exits
    case S::failed: return to == S::starting;
    // Only the end of the hand-over: no upgrade starts meanwhile.
    case S::receiving: return to == S::took_over;
    case S::took_over: return to == S::starting;
  }
  return false;
}

bool UpgradeMachine::transition(UpgradeState to, std::string message) {
  if (!upgrade_move_allowed(state_, to)) return false;
  state_ = to;
  message_ = std::move(message);
  return true;
}

std::string UpgradeMachine::refusal() const {
  switch (state_) {
    case UpgradeState::idle:
    case UpgradeState::failed:
    case UpgradeState::took_over:
      return {};
    case UpgradeState::starting:
      return "an upgrade is already under way (" + message_ + ")";
    case UpgradeState::handing_over:
    case UpgradeState::finishing:
    case UpgradeState::handed_over:
      return "this process has handed over to a new one (" + message_ + ")";
    case UpgradeState::receiving:
      return "this process is still receiving sessions from the previous one (" + message_ +
             "); upgrade again once it has finished";
  }
  return "upgrade state unknown";
}

bool UpgradeMachine::old_side() const {
  return state_ == UpgradeState::starting || state_ == UpgradeState::handing_over ||
         state_ == UpgradeState::finishing || state_ == UpgradeState::handed_over;
}

}  // namespace sluice
