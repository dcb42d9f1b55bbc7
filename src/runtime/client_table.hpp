// Per-client-address accounting for one listener: open connections
// (client_max_connections) and a token bucket (client_rate_limit). Shared by
// every worker, so the limits are exact process-wide, and kept across
// reloads (it lives in the Registry with the listener's counters).
//
// Memory is bounded: at most max_clients addresses are tracked. When a
// shard is full, a new address takes the place of the least recently seen
// address that has no open connection (each shard keeps those in a list,
// oldest first), so an accept does a fixed amount of work however full the
// table is, and one-time addresses (a client_rate_limit per hour keeps an
// entry long after its client left) never lock new clients out. Only when
// every slot of the shard holds a client with an open connection is a new
// address refused (cause client_limit). The table is split in shards, each
// with its own lock, so workers rarely contend.
//
// A binary upgrade moves the token buckets to the new process
// (save_buckets / restore_bucket): only those not full, since a full bucket
// is what an unknown address gets anyway. Open counts are reported while
// both processes hold sessions (open_counts / add_open): each process
// counts the other's with its own, and each session handed over counts
// itself in the new process. A bucket restored
// into a full shard takes the place of the least recently seen idle address,
// as a new address does on admit; when every slot holds an open connection
// it is skipped (that client then starts with a full bucket).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <sys/socket.h>

#include "sluice/cause.hpp"

namespace sluice {

class ClientTable {
 public:
  static constexpr std::size_t kShards = 16;
  static constexpr std::size_t kMaxClients = 65536;

  // max_clients: how many addresses the table holds (kMaxClients in
  // production; tests use less), spread over the shards.
  explicit ClientTable(std::size_t max_clients = kMaxClients);

  struct Limits {
    std::uint32_t max_connections = 0;  // 0 = off
    double per_second = 0;              // 0 = off
  };

  // May a new connection from `client` open now? Returns Cause::none and
  // counts it as open (when max_connections is on), or the refusing cause.
  Cause admit(const sockaddr* client, const Limits& limits, std::uint64_t now_ms);
  // A connection admitted with max_connections on has closed.
  void release(const sockaddr* client);

  // One client's token bucket, as a binary upgrade carries it.
  struct SavedBucket {
    std::array<std::uint8_t, 16> addr{};  // IPv6, or IPv4-mapped IPv6
    std::uint64_t tokens_milli = 0;       // thousandths of a token, rounded down
    std::uint64_t age_ms = 0;             // since it was last refilled
  };
  // The buckets that are not full at now_ms for a limit of per_second
  // (none when it is 0). Locks one shard at a time, so workers go on
  // admitting meanwhile; holds at most max_clients entries.
  std::vector<SavedBucket> save_buckets(double per_second, std::uint64_t now_ms) const;
  // Sets the bucket of b.addr as saved (last refilled b.age_ms before
  // now_ms; at most full for a limit of per_second, which may have changed
  // with the binary's configuration), adding the address if it is new. Its
  // open count is left as it is. False when the shard is full of open
  // connections (see above).
  bool restore_bucket(const SavedBucket& b, double per_second, std::uint64_t now_ms);

  // A binary upgrade: the other process's open sessions, counted here
  // like this one's own so that client_max_connections holds for both.
  // `delta` more (or fewer) open connections for `addr` (IPv6, or
  // IPv4-mapped IPv6), never refused. False when the address is new and
  // its shard is full of open connections: it then goes uncounted.
  bool add_open(const std::array<std::uint8_t, 16>& addr, std::int64_t delta);
  // Every address with an open connection, and how many.
  std::vector<std::pair<std::array<std::uint8_t, 16>, std::uint32_t>> open_counts() const;

  std::size_t size() const;
  std::uint64_t refused_full() const { return refused_full_.load(std::memory_order_relaxed); }
  // Idle addresses forgotten to make room for new ones.
  std::uint64_t evicted() const { return evicted_.load(std::memory_order_relaxed); }

 private:
  struct Key {
    std::array<std::uint8_t, 16> addr{};
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const;
  };
  struct Entry;
  using Node = std::pair<const Key, Entry>;  // an unordered_map node: its address never changes
  struct Entry {
    std::uint32_t open = 0;
    double tokens = 0;
    std::uint64_t last_ms = 0;
    // Links in the shard's idle list while open == 0.
    Node* older = nullptr;
    Node* newer = nullptr;
    bool idle = false;
  };
  // Entries without an open connection, least recently seen first.
  struct IdleList {
    Node* oldest = nullptr;
    Node* newest = nullptr;
    void push_newest(Node& n);
    void remove(Node& n);
  };
  struct Shard {
    mutable std::mutex mu;
    std::unordered_map<Key, Entry, KeyHash> clients;
    IdleList idle;
  };

  static Key key_of(const sockaddr* sa);
  static void refill(Entry& e, double per_second, std::uint64_t now_ms);
  Shard& shard_of(const Key& k);
  // The entry of `k` (shard locked), added with `tokens` when new; when
  // the shard is full the oldest idle address makes room. Null when every
  // slot holds an open connection.
  Node* find_or_add(Shard& sh, const Key& k, double tokens, std::uint64_t now_ms);

  std::size_t per_shard_;
  std::array<Shard, kShards> shards_;
  std::atomic<std::uint64_t> refused_full_{0};  // new addresses refused because the table was full
  std::atomic<std::uint64_t> evicted_{0};
};

}  // namespace sluice
