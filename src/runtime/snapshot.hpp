// The immutable half of the runtime: everything one configuration says,
// resolved for the data path. Built on the control loop, validated
// completely, then handed to every worker through its mailbox. New sessions
// use the newest Snapshot; a live session keeps the one it started with (it
// holds a shared_ptr), so a reload never changes a session under its feet.
// Members point at the Registry's long-lived ServerStates, so counts and
// health carry over by identity (upstream name + resolved socket address).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "preread/sni_router.hpp"
#include "runtime/registry.hpp"
#include "sluice/config.hpp"
#include "upstream/upstream.hpp"

namespace sluice {

class AccessLog;

struct ListenerView {
  const ListenerConfig* config = nullptr;
  Upstream* upstream = nullptr;          // plain listeners
  Upstream* default_upstream = nullptr;  // preread listeners, may be null
  std::unique_ptr<preread::SniRouter> router;  // preread listeners
  std::shared_ptr<ListenerStats> stats;
  // Preread listeners: the counters of each configured route, in the
  // file's order (the router's indexes), and of the default route.
  std::vector<std::shared_ptr<RouteStats>> route_stats;
  std::shared_ptr<RouteStats> default_route_stats;
};

// An upstream's `fallback`, resolved.
struct FallbackLink {
  Upstream* to = nullptr;
  std::shared_ptr<std::atomic<std::uint64_t>> used;  // sessions sent on to `to`
};

class Snapshot {
 public:
  // Builds the runtime view of `config`, sharing server state with `registry`.
  // Throws std::runtime_error (e.g. an access log file that cannot be opened).
  static std::shared_ptr<const Snapshot> build(std::shared_ptr<const Config> config, Registry& registry,
                                               std::uint64_t generation);

  std::shared_ptr<const Config> config;
  std::uint64_t generation = 0;
  Registry* registry = nullptr;  // outlives every Snapshot
  std::shared_ptr<AccessLog> access_log;
  std::map<std::string, std::unique_ptr<Upstream>> upstreams;
  std::vector<ListenerView> listeners;  // in config order
  std::map<const Upstream*, FallbackLink> fallbacks;  // upstreams with a fallback

  // Where `from` sends sessions when none of its servers is eligible; null if nowhere.
  const FallbackLink* fallback_of(const Upstream* from) const;

  Upstream* find_upstream(const std::string& name) const;

  // `snap` is the configuration the workers use from now on: each wait
  // queue serves from its pools the waiters whose own pool has no server
  // left for them.
  static void make_current(const std::shared_ptr<const Snapshot>& snap);
  // Index into `listeners`, or -1.
  long find_listener(const std::string& name) const;

  ~Snapshot();

 private:
  static void link_fallbacks(Snapshot& snap);
};

}  // namespace sluice
