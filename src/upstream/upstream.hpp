// An upstream pool as one configuration describes it: its members (each
// pointing at the server's long-lived state in the Registry), its balancer
// and the lock that serialises picks. Immutable membership: a reload builds a
// new Upstream that shares the same ServerStates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "balance/balancer.hpp"
#include "sluice/config.hpp"
#include "sluice/time.hpp"
#include "upstream/server_state.hpp"
#include "upstream/tried_set.hpp"

namespace sluice {

struct Member {
  std::shared_ptr<ServerState> state;
  ServerConfig config;      // weight, max_conns, backup as the file says
  std::uint64_t seed = 0;   // rendezvous seed of the address text
};

class Upstream {
 public:
  // `states[i]` is the shared state of config.servers[i].
  Upstream(const UpstreamConfig& config, std::vector<std::shared_ptr<ServerState>> states,
           std::uint64_t random_seed);

  const std::string& name() const { return config_.name; }
  const UpstreamConfig& config() const { return config_; }
  std::size_t size() const { return members_.size(); }
  const Member& member(std::size_t i) const { return members_[i]; }
  ServerState& server(std::size_t i) const { return *members_[i].state; }

  // Picks an eligible server not in `tried`. Primaries first; backups only
  // when no primary is eligible; with all_down = "fail_open" and every server
  // down, health is ignored. On success the chosen server's `active` and
  // `total_sessions` are incremented (under the lock, so least_conn is exact
  // across workers) and its index is returned; otherwise -1. `key` is the hash
  // key (ignored by other algorithms). Thread-safe.
  long pick(const TriedSet& tried, std::string_view key, TimePoint now);

  // Undo of pick's accounting when the session leaves that server.
  void release(std::size_t index) const {
    members_[index].state->active.fetch_sub(1, std::memory_order_relaxed);
  }

  // The weight the balancer uses now: the admin override or the file's,
  // ramped by slow start (in hundredths, so that a ramp of weight 1 is
  // still visible to the algorithms).
  std::uint32_t effective_weight_centi(std::size_t index, TimePoint now) const;
  // The same, in the file's units (for status), rounded.
  double effective_weight(std::size_t index, TimePoint now) const {
    return effective_weight_centi(index, now) / 100.0;
  }
  // The admin override or the file's weight, without slow start.
  std::uint32_t base_weight(std::size_t index) const;

 private:
  bool fill(bool backup_tier, bool ignore_health, const TriedSet& tried, TimePoint now);

  UpstreamConfig config_;
  std::vector<Member> members_;
  Duration slow_start_{0};
  std::unique_ptr<Balancer> balancer_;
  std::mutex mu_;
  std::vector<Candidate> candidates_;  // scratch, under mu_
};

}  // namespace sluice
