// Redis Sentinel, on the control loop: an upstream with `sentinel = {...}`
// has one server, the master its sentinels name. Per upstream:
//
// - A subscription to every listed sentinel: each asks `SENTINEL
//   get-master-addr-by-name` and then subscribes to `+switch-master` and to
//   the two first signs of a failover, `+failover-state-send-slaveof-noone`
//   and `+promoted-slave`. A dropped one is opened again with backoff (0.1 s
//   doubling to 5 s).
// - A poll every few seconds of every sentinel at once, a safety net for a
//   message lost while a subscription was down; it also reads the master's
//   replication id (INFO replication), which tells a real promotion from a
//   lie.
// - Each sentinel's latest word (the master it named last). The master
//   changes when a majority of the listed sentinels name another one, or
//   when a sentinel announced a failover and the candidate it named shows,
//   in its own INFO replication, that it took over from the master (its
//   master_replid2 is the master's master_replid).
// - The first sign of a failover from any one sentinel fences the master at
//   once (on_fence): no new session, live ones closed. The fence lasts
//   until the candidate is confirmed (then the master changes), or is
//   lifted when the candidate has not taken over within kPromotionWait, or
//   is a master that did not descend from this one: one sentinel alone can
//   hold the master back that long, and no longer.
//
// Every connection is non-blocking libuv TCP with a deadline; replies are
// parsed by resp.hpp with its caps. No worker ever waits for a sentinel.
// When a master changes, `on_change` runs (once per loop turn) and the
// control loop builds a new Snapshot as it does for DNS; the replaced
// addresses are taken with take_replaced() so their sessions can be closed.
#pragma once

#include <uv.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

#include "sluice/config.hpp"
#include "sluice/dns_status.hpp"
#include "sluice/time.hpp"

namespace sluice::discovery {

// How long one connection may take to connect and answer.
inline constexpr Duration kSentinelTimeout = std::chrono::seconds(1);
// The safety-net poll's interval.
inline constexpr Duration kSentinelPoll = std::chrono::seconds(5);

// A master address from a sentinel's reply ("10.0.0.7", "6379"), numeric
// and canonical ("10.0.0.7:6379", "[2001:db8::7]:6379"), or "" when the
// reply is not a numeric address and port.
std::string sentinel_address(const std::string& ip, const std::string& port);

// A +switch-master message's text, "<name> <old-ip> <old-port> <new-ip>
// <new-port>": the new address when it is about `master`, else "".
std::string switched_to(const std::string& message, const std::string& master);

// How long a failover announced by one sentinel may hold the master back
// before its candidate has taken over.
inline constexpr Duration kPromotionWait = std::chrono::seconds(3);

// A sign that a failover of `master` has begun, from one sentinel's message
// on `channel`: the master it moves away from and the candidate, both
// canonical. +switch-master: "<name> <old-ip> <old-port> <new-ip>
// <new-port>"; +failover-state-send-slaveof-noone and +promoted-slave:
// "slave <ip>:<port> <ip> <port> @ <name> <master-ip> <master-port>".
struct FailoverSign {
  std::string from;
  std::string to;
};
std::optional<FailoverSign> failover_sign(std::string_view channel, const std::string& message,
                                          const std::string& master);

// The address most of `words` name (a word per listed sentinel, "" when it
// named none), when more than half of them name it; else "".
std::string majority(const std::vector<std::string>& words);

class Sentinels {
 public:
  using ChangeCallback = std::function<void()>;
  // Fences (`fence` true) or lifts the fence of the master `address` of
  // `upstream`; `by` is the candidate, `reason` why.
  using FenceCallback = std::function<void(const std::string& upstream, const std::string& address, bool fence,
                                           const std::string& by, const std::string& reason)>;

  Sentinels(uv_loop_t* loop, ChangeCallback on_change, FenceCallback on_fence = {});
  ~Sentinels();
  Sentinels(const Sentinels&) = delete;
  Sentinels& operator=(const Sentinels&) = delete;

  // Follows the upstreams of `config` that have a sentinel table: new ones
  // start asking now, those whose table is unchanged keep their master and
  // connections, the others stop.
  void configure(const Config& config);

  // `config` with each sentinel upstream's master (when known) as its one
  // server, `from` "sentinel <master>".
  std::shared_ptr<const Config> expand(const std::shared_ptr<const Config>& config) const;

  // (upstream, old master address) of each master replaced since the last
  // call.
  std::vector<std::pair<std::string, std::string>> take_replaced();

  bool active() const { return !watches_.empty(); }
  // Every upstream has a master, or has asked all of its sentinels once.
  bool settled() const;
  // Runs the loop until settled() or `max` has passed (start-up only).
  void wait_settled(Duration max);
  // At most how long wait_settled should wait for `config`.
  static Duration settle_limit(const Config& config);

  // Appends one entry per sentinel upstream (type "sentinel") to `dns`.
  void add_status(DnsStatus& dns) const;

  // A binary upgrade: the previous process had fenced master `from` of
  // `upstream` for a failover to `candidate`; this process goes on from
  // there (proves or refutes it as if a sentinel had just announced it).
  void resume_failover(const std::string& upstream, const std::string& from, const std::string& candidate);

  // Ends every connection and timer.
  void stop();

 private:
  class Watch;
  friend class Watch;
  void changed();

  uv_loop_t* loop_;
  ChangeCallback on_change_;
  FenceCallback on_fence_;
  std::map<std::string, std::unique_ptr<Watch>> watches_;  // by upstream
  std::vector<std::pair<std::string, std::string>> replaced_;
  uv_timer_t* notify_timer_ = nullptr;  // runs on_change once per loop turn
  bool stopping_ = false;
  std::uint64_t queries_ = 0;
  std::uint64_t errors_ = 0;
  std::uint64_t changes_ = 0;
};

}  // namespace sluice::discovery
