// Where a binary upgrade stands in this process: one type naming every state
// and the moves allowed between them. The control loop changes it only
// through transition(); the workers and sessions see nothing of it but the
// commands the control loop sends them in each state.
//
//   old process (hands over)                  new process (takes over)
//
//   idle ──SIGUSR2──► starting ──ready──► handing_over      idle ──hand-over──► receiving
//                        │                 │      │                                │
//                        ▼                 │      ▼ upgrade_finish_timeout         │ the old
//                      failed ◄──new dies──┤   finishing                           │ process
//                        │                 │      │                                ▼ is gone
//                        └──SIGUSR2──►     ▼      ▼                             took_over
//                        (starting)      handed_over (exits)                  ──SIGUSR2──► starting
//
// A process that is receiving refuses an upgrade: a third process would
// take the listening sockets while sessions are still on their way to this
// one, and those would be lost.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sluice {

enum class UpgradeState : std::uint8_t {
  idle,          // serving; no upgrade has run in this process ("none" in /status)
  starting,      // old: the new binary runs and has not taken over yet; this process serves
  handing_over,  // old: the new process serves; this one accepts no more and hands its sessions over
  finishing,     // old: upgrade_finish_timeout passed; what did not move is closed (cause upgrade)
  handed_over,   // old: no session left here; the process exits
  failed,        // the last upgrade failed; this process serves (the message says why)
  receiving,     // new: serving; the previous process still hands sessions (and its counts) over
  took_over,     // new: the previous process has gone; serving
};

// The name /status shows.
std::string_view to_string(UpgradeState s);

// Whether `from` -> `to` is a move the upgrade may make.
bool upgrade_move_allowed(UpgradeState from, UpgradeState to);

// The state and what an operator reads about it (/status upgrade.message).
class UpgradeMachine {
 public:
  UpgradeState state() const { return state_; }
  const std::string& message() const { return message_; }

  // Moves to `to` with `message`. False, and nothing changes, when the move
  // is not allowed.
  bool transition(UpgradeState to, std::string message);
  // The message alone (the state stays).
  void set_message(std::string message) { message_ = std::move(message); }

  // Whether an upgrade may start now: empty when it may, else why not.
  std::string refusal() const;
  // An upgrade is under way and this is its old process: from the start of
  // the new binary until this process exits (or the upgrade fails).
  bool old_side() const;

 private:
  UpgradeState state_ = UpgradeState::idle;
  std::string message_;
};

}  // namespace sluice
