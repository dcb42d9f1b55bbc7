// An upstream pool as one configuration describes it: its members (each
// pointing at the server's long-lived state in the Registry), its balancers
// and the lock that serialises picks. Immutable membership: a reload builds a
// new Upstream that shares the same ServerStates.
//
// A pick does not read every server. The pool keeps a view of each member
// (up or not, weight) and its balancers keep their indexes (least_conn's
// heap, hash's Maglev table) current from it; the view changes only when
// something happens: this pool's own picks and releases, a server's watcher
// notice (health, admin state, weight, another pool's counts), the end of a
// passive down period or trial, a slow-start ramp. Retries (servers already
// tried) and fail_open's panic mode scan the views instead.
#pragma once

#include <array>
#include <atomic>
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
#include "upstream/wait_queue.hpp"

namespace sluice {

struct Member {
  std::shared_ptr<ServerState> state;
  ServerConfig config;      // weight, max_conns, backup as the file says
  std::uint64_t seed = 0;   // rendezvous seed of the address text
};

class Upstream final : public ServerWatcher {
 public:
  // `states[i]` is the shared state of config.servers[i].
  Upstream(const UpstreamConfig& config, std::vector<std::shared_ptr<ServerState>> states,
           std::uint64_t random_seed);
  ~Upstream();
  Upstream(const Upstream&) = delete;
  Upstream& operator=(const Upstream&) = delete;

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
  // key (ignored by other algorithms). `now` never goes back between calls
  // (Clock is steady). `panic` false: no fail_open now (a fallback upstream
  // is asked first). Thread-safe.
  // `full`, when given, is set on failure: true when some server not in
  // `tried` is up but at its max_conns (a slot may free: worth waiting for),
  // or is awaited (ServerState::awaited: a failover is under way, or its
  // first check is to come).
  long pick(const TriedSet& tried, std::string_view key, TimePoint now, bool panic = true, bool* full = nullptr);

  // Undo of pick's accounting when the session leaves that server (under the
  // pick lock, so the next pick sees it); with a queue, the slot goes to its
  // oldest waiter. Thread-safe.
  void release(std::size_t index);
  // A session a binary upgrade handed over, already on server `index`:
  // counted in `active` as pick() counts one (its total_sessions was the
  // old process's). Thread-safe.
  void adopt(std::size_t index);

  // The wait queue (`queue` > 0), shared with the other configurations'
  // pools of the same name; null without one. Set once, before any pick.
  void set_queue(std::shared_ptr<WaitQueue> queue) { queue_ = std::move(queue); }
  WaitQueue* queue() const { return queue_.get(); }

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

  // ServerWatcher: a member's state changed; the next pick reads it again.
  void server_changed(std::size_t index) override;

 private:
  // What this pool last read from a member's state (under mu_), and what
  // the file says that a pick needs, so that a scan reads only views.
  struct View {
    std::uint64_t seed = 0;
    std::uint32_t max_conns = 0;
    bool backup = false;
    bool enabled = false;  // admin state "enabled"
    bool up = false;       // enabled, not down by active checks, let in by passive health
    bool usable = false;   // enabled, not down or standby by active checks, not fenced (passive health aside)
    bool fenced = false;   // never used, not even by fail_open
    bool awaited = false;  // a failover away from it, or its first check, may soon make one usable
    bool timed = false;    // in timed_
    bool ramping = false;  // in ramping_
    TimePoint recheck_at = TimePoint::max();  // passive health lets it in from then
    TimePoint up_since{};                     // slow start's start; the epoch: none
    std::uint32_t base_weight = 1;
    std::uint32_t weight = 1;  // what the balancers see: hundredths, ramped (hash: the base weight)
    std::uint32_t active = 0;  // the server's count when last published
  };

  // Reads member i's state into its view (not its active count).
  void read(std::size_t i, TimePoint now);
  static bool has_room(const View& v) { return v.max_conns == 0 || v.active < v.max_conns; }
  // Writes member i as its tier's balancer sees it into `c` (in place: a
  // returned Candidate costs a store-forwarding stall per member in a scan).
  void describe(std::size_t i, Candidate& c) const {
    const View& v = views_[i];
    c.seed = v.seed;
    c.weight = v.weight;
    c.active = v.active;
    c.up = v.up;
    c.eligible = v.up && has_room(v);
  }
  // Reads member i's active count and tells its tier's balancer about it.
  void publish(std::size_t i);
  std::size_t tier_of(std::size_t i) const { return views_[i].backup ? 1 : 0; }
  std::uint32_t weight_at(const View& v, TimePoint now) const;
  // Brings views and balancers up to `now`: notices, ended periods, ramps.
  void catch_up(TimePoint now);
  // The one member that only passive health keeps out, when no other is
  // enabled and not down by active checks; kNoCandidate otherwise.
  std::size_t lone_server(const TriedSet& tried) const;
  // The scan: every member of each tier in turn, as candidates built now.
  std::size_t scan(bool ignore_health, const TriedSet& tried, std::string_view key);

  UpstreamConfig config_;
  std::vector<Member> members_;
  std::shared_ptr<WaitQueue> queue_;
  Duration slow_start_{0};
  bool hashing_ = false;
  std::mutex mu_;  // the pick lock; everything below it is under it
  std::array<std::unique_ptr<Balancer>, 2> tiers_;  // primaries, backups (null when there are none)
  std::vector<View> views_;
  std::vector<std::size_t> timed_;    // members whose recheck_at is set
  TimePoint next_recheck_ = TimePoint::max();
  std::vector<std::size_t> ramping_;  // members in slow start
  std::size_t up_count_ = 0;          // members whose view is up
  std::vector<Candidate> candidates_;  // scratch for scan()
  std::vector<std::size_t> noticed_;   // scratch for catch_up()

  // Notices from server_changed(), taken by the next pick.
  std::mutex news_mu_;  // a leaf: nothing is locked while it is held
  std::vector<std::size_t> news_;
  std::vector<bool> in_news_;
  std::atomic<bool> have_news_{false};
};

}  // namespace sluice
