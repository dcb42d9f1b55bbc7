// Per-client-address accounting for one listener: open connections
// (client_max_connections) and a token bucket (client_rate_limit). Shared by
// every worker, so the limits are exact process-wide, and kept across
// reloads (it lives in the Registry with the listener's counters).
//
// Memory is bounded: at most kMaxClients addresses are tracked. An entry
// that has no open connection and a full bucket carries no information and
// is reclaimed when room is needed; when every slot holds a client that is
// connected or recently active, a new address is refused (cause
// client_limit) rather than letting a flood of source addresses grow the
// table. The table is split in shards, each with its own lock, so workers
// rarely contend.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include <sys/socket.h>

#include "sluice/cause.hpp"

namespace sluice {

class ClientTable {
 public:
  static constexpr std::size_t kShards = 16;
  static constexpr std::size_t kMaxClients = 65536;

  struct Limits {
    std::uint32_t max_connections = 0;  // 0 = off
    double per_second = 0;              // 0 = off
  };

  // May a new connection from `client` open now? Returns Cause::none and
  // counts it as open (when max_connections is on), or the refusing cause.
  Cause admit(const sockaddr* client, const Limits& limits, std::uint64_t now_ms);
  // A connection admitted with max_connections on has closed.
  void release(const sockaddr* client);

  std::size_t size() const;
  std::uint64_t refused_full() const { return refused_full_.load(std::memory_order_relaxed); }

 private:
  struct Key {
    std::array<std::uint8_t, 16> addr{};
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const;
  };
  struct Entry {
    std::uint32_t open = 0;
    double tokens = 0;
    std::uint64_t last_ms = 0;
  };
  struct Shard {
    mutable std::mutex mu;
    std::unordered_map<Key, Entry, KeyHash> clients;
  };

  static Key key_of(const sockaddr* sa);
  static void refill(Entry& e, double per_second, std::uint64_t now_ms);

  std::array<Shard, kShards> shards_;
  std::atomic<std::uint64_t> refused_full_{0};  // new addresses refused because the table was full
};

}  // namespace sluice
