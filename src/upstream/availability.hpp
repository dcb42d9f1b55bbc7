// How many of an upstream's servers could take a new session now, and why
// the others cannot; and the one warning an operator gets when none can.
//
// Read from the servers' shared state (atomics and the state's small lock),
// never from a pool's pick: the pick is hot and per worker, and a pool that
// takes no traffic has views nobody brings up to date. The control loop asks
// once a second (its tick) and at each /status or /metrics request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/time.hpp"

namespace sluice {

class Upstream;

struct Availability {
  std::size_t servers = 0;   // members of the pool (backups included)
  std::size_t eligible = 0;  // could get a new session now
  // The others, by why not: their state as /status names it ("down",
  // "drained", "disabled", or any state a server may have), or "full" for
  // a server that is up but at its max_conns.
  std::map<std::string, std::size_t> unavailable;
};

// `up`'s servers as they are at `now`.
Availability availability(const Upstream& up, TimePoint now);

// "2 down, 1 standby" (largest count first, then by name); "it has no
// server" for an empty pool (a discovery answer with no record).
std::string describe_unavailable(const Availability& a);

// Turns a series of observations per upstream into log lines: one when an
// upstream's last eligible server goes, one when one comes back, nothing
// while either lasts. Pure (the caller logs and passes the clock).
class OutageTracker {
 public:
  struct Line {
    bool warning = false;  // the start (warning) or the end (info)
    std::string text;
  };
  // What to log for upstream `name` now (nothing when nothing changed).
  // `note`: what happens to its clients meanwhile ("its sessions go to
  // fallback \"b\""), appended to the start line when not empty.
  std::optional<Line> observe(const std::string& name, const Availability& a, TimePoint now,
                              std::string_view note = {});
  // Forgets upstreams the configuration no longer has (without a line: the
  // reload that removed them said so).
  void keep_only(const std::set<std::string>& names);
  // Since when `name` has had no server available; nullopt when it has one.
  std::optional<TimePoint> outage_since(const std::string& name) const;

 private:
  std::map<std::string, TimePoint> open_;  // upstream -> when its outage began
};

}  // namespace sluice
