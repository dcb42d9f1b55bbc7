// Active health checks for every server of every upstream that has a
// [upstream.NAME.health] table. Owned by the control loop and run on it: one
// check in flight per server, whatever the number of workers. Results move
// the server's active state (ServerState::set_active, which logs each
// transition once) after `rise` consecutive passes or `fall` consecutive
// failures.
#pragma once

#include <uv.h>

#include <cstddef>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <random>

#include "sluice/config.hpp"
#include "upstream/server_state.hpp"

namespace sluice {

class Snapshot;

namespace health {
class Target;
}

class HealthChecker {
 public:
  // What happens to a server's live sessions when checks mark it down, or
  // when one writer fences it (close them with cause `fenced`).
  enum class SessionAction { close, drain, fence };
  // Called when active checks mark a server down and its health table says
  // its sessions end: on_down = "close_sessions" (close) or "drain" (close
  // after the upstream's drain_timeout), or on_role_change =
  // "close_sessions" when the server reported another role (close). The
  // control loop closes them through the worker mailboxes.
  using DownCallback = std::function<void(std::shared_ptr<ServerState>, const HealthConfig&, SessionAction)>;

  explicit HealthChecker(uv_loop_t* loop, DownCallback on_down = {});
  HealthChecker(const HealthChecker&) = delete;
  HealthChecker& operator=(const HealthChecker&) = delete;
  // stop() must have completed (or never started anything) before this.
  ~HealthChecker();

  void set_on_down(DownCallback on_down) { on_down_ = std::move(on_down); }
  // Called when a server may take sessions again (its check brought it up,
  // or its fence was lifted): clients waiting in its upstream's queue may
  // go there now.
  using UpCallback = std::function<void(const std::shared_ptr<ServerState>&)>;
  void set_on_up(UpCallback on_up) { on_up_ = std::move(on_up); }

  // Makes the running checks match `snapshot`: a server that stays (the same
  // ServerState: the same resolved address) with the same health settings
  // and the same address text keeps its check, counters and schedule; a new
  // server, or one whose settings or spelling changed (the HTTP Host header
  // and PostgreSQL's TLS name come from the text), gets a new check (keeping
  // its current up/down state); a server that left, or whose upstream lost
  // its health table, is no longer checked and its active state returns to
  // "unchecked". `initial` applies only to a server never checked before.
  // Checks probe the address the Snapshot's member has, the one sessions
  // connect to.
  void update(const Snapshot& snapshot);

  // Stops every check and closes every handle; `done` runs (from the loop)
  // once all are closed. update() is ignored afterwards.
  void stop(std::function<void()> done);

  // Servers being checked now.
  std::size_t size() const { return targets_.size(); }
  // Servers that start down and whose first check has not answered yet, and
  // the longest timeout among their checks (how long they may still take).
  std::size_t waiting_first() const;
  Duration longest_first_wait() const;

 private:
  friend class health::Target;
  void retire(std::unique_ptr<health::Target> target);
  void maybe_stopped();
  double uniform();  // [0, 1)
  // The next reading's number (RoleFacts::reading): increasing.
  std::uint64_t next_reading() { return ++readings_; }
  // `role_changed`: the server answered with another role than it had.
  void reported_down(health::Target& target, bool role_changed);
  // One writer, after `target`'s check read its role: lifts the fences that
  // no longer hold and, when `target` says it is a primary beside another,
  // decides which serves and fences the other (docs/health.md). Returns
  // true when `target` took over from the one serving (it serves at once).
  bool arbitrate(health::Target& target);
  void serves_again(const std::shared_ptr<ServerState>& state);
  void fence(health::Target& loser, FenceKind kind, const health::Target& winner, const std::string& why);

  uv_loop_t* loop_;
  DownCallback on_down_;
  UpCallback on_up_;
  std::map<const ServerState*, std::unique_ptr<health::Target>> targets_;
  std::list<std::unique_ptr<health::Target>> retiring_;  // closing their handles
  std::function<void()> stopped_;
  bool stopping_ = false;
  std::mt19937_64 rng_;
  std::uint64_t readings_ = 0;
};

}  // namespace sluice
