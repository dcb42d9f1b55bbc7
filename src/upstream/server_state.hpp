// One server's long-lived state, shared by every worker and kept across
// reloads (the Registry hands out one per upstream name + resolved socket
// address; `address` is as the file wrote it when the state was made). What the
// file says about the server (weight, max_conns, backup) is not here: that is
// per configuration, in the Snapshot's membership (upstream/upstream.hpp).
//
// Hot counters are atomics written with relaxed ordering. Passive health sits
// behind a small mutex taken only on the rare paths (failure, trial,
// recovery); active health and the admin state are single atomics read on
// every pick.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/cause.hpp"
#include "sluice/config.hpp"
#include "sluice/histogram.hpp"
#include "sluice/peak.hpp"
#include "sluice/time.hpp"
#include "upstream/passive_health.hpp"

namespace sluice {

// Typed result of one connect attempt, reported by the data path. Only the
// server's own failures count against its health; `local_error` (our fds,
// ports or memory ran out) never does.
enum class ConnectResult { connected, failed, timed_out, local_error };

// What an operator set through the admin API.
enum class AdminState : std::uint8_t {
  enabled,   // normal
  drain,     // no new sessions; live ones stay
  disabled,  // no new sessions; live ones were closed (cause server_drained)
};

// What active checks say. `unchecked`: the upstream has no [health] table.
// `standby`: the server answers its check, with another role than the one
// wanted (a replica in a primary pool): it takes no session, and it is not
// down either (no downtime, no warning).
enum class ActiveState : std::uint8_t { unchecked, up, down, standby };

// Why a server that says it is the primary takes no session: at most one
// server of a primary pool may (docs/health.md, "One writer").
enum class FenceKind : std::uint8_t {
  none,
  lost,      // another primary took over from it: until it stops saying it is the primary
  waiting,   // its rival serves, or neither does: until it or its rival stops saying so
  failover,  // a sentinel announced a failover away from it: until it is confirmed or refuted
};

std::string_view to_string(AdminState s);
std::string_view to_string(ActiveState s);
std::string_view to_string(FenceKind k);

// Connect-latency histogram buckets (upper bounds, seconds), Prometheus style.
inline constexpr std::array<double, 12> kConnectBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                           0.05,   0.1,   0.25,   0.5,   1.0,  2.5};
// Active-check duration buckets (seconds): a check ends by its timeout at the latest.
inline constexpr std::array<double, 13> kCheckBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                         0.25,  0.5,    1.0,   2.5,  5.0,   10.0};

// How an active check ended, as the status page and /metrics show it.
// `local_error`: sluice's own resources failed; it says nothing about the server.
enum class CheckResult : std::uint8_t { none, pass, fail, local_error };
std::string_view to_string(CheckResult r);

// Told when something that can change a pick changes on a server: its admin
// or active-check state, its passive health, its weight override, the start
// of its slow start, or its active count when another pool moved it (each
// Upstream of a configuration is one watcher; during a reload two share a
// server). Called on any thread, possibly while the caller holds the
// watcher's pick lock: it must be quick and take only locks of its own that
// it never holds while calling out.
class ServerWatcher {
 public:
  // `index` is the one the watcher registered with.
  virtual void server_changed(std::size_t index) = 0;

 protected:
  ~ServerWatcher() = default;
};

class ServerState {
 public:
  ServerState(std::string upstream_name, Endpoint address, std::uint32_t max_fails, Duration fail_timeout);

  const std::string upstream;  // owning upstream's name (for logs)
  const Endpoint address;

  // ---- counters ----
  std::atomic<std::uint32_t> active{0};          // sessions in CONNECTING or PROXYING here
  std::atomic<std::uint64_t> total_sessions{0};  // times chosen
  std::atomic<std::uint64_t> total_failures{0};  // failed connect attempts (the server's fault)
  std::atomic<std::uint64_t> bytes_in{0};        // client -> server, delivered (at session end)
  std::atomic<std::uint64_t> bytes_out{0};       // server -> client, delivered (at session end)
  std::atomic<std::int64_t> last_connect_ms{0};  // wall clock (ms since epoch) of the last connect; 0 = never
  std::array<std::atomic<std::uint64_t>, kConnectBuckets.size() + 1> connect_buckets{};  // last = +Inf
  std::atomic<std::uint64_t> connect_sum_us{0};
  std::atomic<std::uint64_t> connect_count{0};

  // Records one successful connect that took `seconds`.
  void observe_connect(double seconds);

  // ---- eligibility ----
  // Health and admin state (max_conns is the membership's business): may a
  // new connection be sent here now?
  bool eligible(TimePoint now) const;
  // Called (under the upstream's pick lock) when the balancer chose this
  // server. `lone`: chosen as its upstream's only usable server, which
  // passive health does not keep out (the connect is a trial at once).
  void on_selected(TimePoint now, bool lone = false);
  // The data path reports each connect attempt's outcome. Logs every up/down
  // transition once, with the reason and how long detection took. `error` is
  // e.g. "connection refused".
  void report(ConnectResult result, std::string_view error, TimePoint now);
  // A reload may change passive health's parameters.
  void configure_passive(std::uint32_t max_fails, Duration fail_timeout);
  // From when passive health lets the server be picked (see
  // PassiveHealth::eligible_from); the clock's minimum while it is up.
  TimePoint passive_eligible_from() const;
  // Passive health as the process that hands the server over knew it, and
  // its taking over in the new process (a binary upgrade).
  PassiveHealth::Saved save_passive(TimePoint now) const;
  void restore_passive(const PassiveHealth::Saved& saved, TimePoint now);

  // ---- watchers ----
  void watch(ServerWatcher* watcher, std::size_t index);
  void unwatch(const ServerWatcher* watcher);
  // Tells every watcher except `except` that this server changed. Costs one
  // atomic read when `except` is the only watcher.
  void notify(const ServerWatcher* except = nullptr);

  // ---- active health (written by the control loop) ----
  // Sets the active state; logs the transition with `reason` when it changes.
  // `detect` is how long detection took (for the log line). From
  // "unchecked" the state is `initial`'s guess, not a check's verdict; a
  // later down -> up starts slow start only when a check had failed (an
  // `initial = "down"` server that passes its first checks has not
  // recovered from anything).
  void set_active(ActiveState s, std::string_view reason, Duration detect = Duration{0});
  // A check's result that changes no state, for the status: the reason
  // shown is always the last check's. `failed`: a failing check, which ends
  // the initial guess (see set_active).
  void note_check(std::string_view reason, bool failed);
  ActiveState active_state() const { return active_state_.load(std::memory_order_acquire); }
  // The role the last check saw ("" when it did not answer, or has no
  // role) and, for a replica, how far behind it is.
  void set_role(std::string role, std::optional<double> lag_seconds);
  std::string role() const;
  std::optional<double> lag_seconds() const;
  // A server that starts down waits for its first check's answer: clients
  // may wait for it (an upstream's queue holds them) rather than be refused.
  void set_first_pending(bool pending);

  // ---- one writer (written by the control loop) ----
  // Fences the server: no new session goes there (the caller closes its
  // live ones). `by` is the server that serves instead ("" when none),
  // `reason` why. Logs a warning when the fence is new.
  void fence(FenceKind kind, std::string by, std::string reason);
  // Lifts the fence, saying why (info).
  void unfence(std::string_view why);
  FenceKind fence_kind() const { return fence_.load(std::memory_order_acquire); }
  bool fenced() const { return fence_kind() != FenceKind::none; }
  std::string fenced_by() const;
  // Clients may wait for this server: a failover away from it is under
  // way, or its first check is still to answer.
  bool awaited() const {
    return fence_kind() == FenceKind::failover || first_pending_.load(std::memory_order_acquire);
  }
  // When health last brought the server back up after it was down (for slow
  // start); the epoch when never.
  TimePoint up_since() const;

  // ---- sessions ended all at once (written by the control loop) ----
  // The control loop ended this server's live sessions at `at_ms` (the
  // workers' monotonic clock, uv_hrtime's milliseconds) for `cause`. A
  // session that was on its way from an old process then (an upgrade's
  // hand-over) was in no worker's list: it ends as it arrives.
  void mark_sessions_ended(std::uint64_t at_ms, Cause cause) const;
  // The cause, when a session that began at `started_ms` (same clock) has
  // outlived such an end; Cause::none otherwise.
  Cause ended_since(std::uint64_t started_ms) const;

  // ---- admin (written by the control loop) ----
  void set_admin(AdminState s);
  AdminState admin() const { return admin_.load(std::memory_order_acquire); }
  // A weight set at run time overrides the file's until the file changes that
  // server's weight. `file_weight` is the weight the file said when it was set.
  void set_weight_override(std::uint32_t weight, std::uint32_t file_weight);
  void clear_weight_override();
  // The override, or 0 when none.
  std::uint32_t weight_override() const { return weight_override_.load(std::memory_order_relaxed); }
  std::uint32_t weight_override_base() const { return weight_override_base_.load(std::memory_order_relaxed); }

  // ---- for status ----
  struct Status {
    std::string state;   // up | standby | down | fenced | drained | disabled
    std::string reason;
    std::int64_t since_ms = 0;  // wall clock, 0 = since start
    std::string passive; // up | down | trial
    std::uint32_t passive_fails = 0;
    std::string active_reason;
    std::int64_t active_since_ms = 0;
    std::string role;                   // what the last check saw; "" unknown
    std::optional<double> lag_seconds;  // a replica's lag, when known
    std::string fenced_by;              // while fenced: the server that serves instead
    std::string fence_reason;           // while fenced: why
  };
  // Takes new sessions now: what sluice_server_up says.
  bool takes_sessions(TimePoint now) const { return eligible(now); }
  Status status(TimePoint now) const;
  bool passive_up() const;

  // ---- for the status page and /metrics ----
  // The highest `active` since start, raised where `active` grows (under the
  // pick lock): a relaxed load per pick, a compare-exchange only for a new peak.
  std::atomic<std::uint32_t> peak_active{0};
  // The active checks' latest word (written by the control loop).
  struct LastCheck {
    std::string type;  // tcp, http, ...; empty: never checked
    CheckResult result = CheckResult::none;
    double seconds = 0;      // how long it took
    std::int64_t at_ms = 0;  // wall clock when it ended
    std::string reason;
  };
  // An active check ended. A local error is shown but kept out of the
  // duration histogram and the failure count: it says nothing of the server.
  void record_check(std::string_view type, CheckResult result, double seconds, std::string_view reason);
  LastCheck last_check() const;
  Histogram<kCheckBuckets.size()> check_seconds{kCheckBuckets};
  std::atomic<std::uint64_t> check_failures{0};
  // Time spent down by health (an active check said down, or passive health
  // keeps it out) up to `now`, and how many times it went down. Draining or
  // disabling is an operator's choice, not downtime.
  Duration downtime(TimePoint now) const;
  std::uint64_t down_count() const;

  // What an operator reads about the server's past, as a binary upgrade
  // carries it to the new process (whose checks and passive health start
  // from the old one's state, see restore_passive): how often and how long
  // it was down, since when its active and admin states hold, the last
  // check.
  struct History {
    std::uint64_t down_count = 0;
    Duration downtime{0};   // every down period, the current one up to now
    bool down = false;      // down now
    Duration down_for{0};   // the current down period so far
    std::int64_t active_since_ms = 0;  // wall clock; 0 = since start
    std::int64_t admin_since_ms = 0;
    std::int64_t passive_since_ms = 0;
    std::string active_reason;
    std::string passive_reason;
    LastCheck last_check;
  };
  History history(TimePoint now) const;
  // After the state itself is restored: a down period the old process saw
  // goes on here if the server is still down.
  void restore_history(const History& h, TimePoint now);

 private:
  // A record of what was done to the server, not of its state: written
  // through the const handles that close_sessions is given.
  mutable std::atomic<std::uint64_t> ended_at_ms_{0};  // 0: never
  mutable std::atomic<Cause> ended_cause_{Cause::none};
  mutable std::mutex mu_;
  PassiveHealth health_;
  std::string passive_reason_;       // under mu_
  std::int64_t passive_since_ms_ = 0;  // under mu_
  std::string active_reason_;        // under mu_
  std::int64_t active_since_ms_ = 0;   // under mu_
  bool active_guess_ = false;        // under mu_: the active state is still initial's guess
  TimePoint up_since_{};             // under mu_
  std::int64_t admin_since_ms_ = 0;    // under mu_
  // Fast path: true while passive health is up with no recent failure, so
  // eligible() need not lock on the common path.
  std::atomic<bool> clean_{true};
  std::atomic<ActiveState> active_state_{ActiveState::unchecked};
  std::atomic<FenceKind> fence_{FenceKind::none};
  std::atomic<bool> first_pending_{false};
  std::string role_;                     // under mu_
  std::optional<double> lag_seconds_;    // under mu_
  std::string fenced_by_;                // under mu_
  std::string fence_reason_;             // under mu_
  std::int64_t fence_since_ms_ = 0;      // under mu_
  std::atomic<AdminState> admin_{AdminState::enabled};
  std::atomic<std::uint32_t> weight_override_{0};
  std::atomic<std::uint32_t> weight_override_base_{0};
  std::mutex watch_mu_;  // taken after mu_ if both; never held while taking mu_
  std::vector<std::pair<ServerWatcher*, std::size_t>> watchers_;  // under watch_mu_
  std::atomic<std::size_t> watcher_count_{0};
  // Downtime bookkeeping, under mu_: brought up to date at each health change
  // and each read (passive health ends a down period by time alone).
  void track_down_locked(TimePoint now) const;
  mutable bool down_ = false;
  mutable TimePoint down_since_{};
  mutable Duration downtime_{0};
  mutable std::uint64_t down_count_ = 0;
  LastCheck last_check_;  // under mu_
};

// Wall-clock milliseconds since the epoch (for status "since" fields).
std::int64_t wall_ms();

}  // namespace sluice
