// Redis Sentinel, on the control loop: an upstream with `sentinel = {...}`
// has one server, the master its sentinels name. Per upstream:
//
// - A subscription: one connection to the first sentinel that answers (in
//   the written order) that asks `SENTINEL get-master-addr-by-name` and then
//   `SUBSCRIBE +switch-master`, so a failover is known the moment the
//   sentinels announce it. When it drops, it is opened again with backoff
//   (0.1 s doubling to 5 s), from the first address.
// - A poll every few seconds, a safety net for a message lost while the
//   subscription was down: the sentinels in order (from the subscribed one,
//   when there is one), the first that names the master wins.
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

class Sentinels {
 public:
  using ChangeCallback = std::function<void()>;

  Sentinels(uv_loop_t* loop, ChangeCallback on_change);
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

  // Ends every connection and timer.
  void stop();

 private:
  class Watch;
  friend class Watch;
  void changed();

  uv_loop_t* loop_;
  ChangeCallback on_change_;
  std::map<std::string, std::unique_ptr<Watch>> watches_;  // by upstream
  std::vector<std::pair<std::string, std::string>> replaced_;
  uv_timer_t* notify_timer_ = nullptr;  // runs on_change once per loop turn
  bool stopping_ = false;
  std::uint64_t queries_ = 0;
  std::uint64_t errors_ = 0;
  std::uint64_t changes_ = 0;
};

}  // namespace sluice::discovery
