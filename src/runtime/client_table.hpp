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

  std::size_t per_shard_;
  std::array<Shard, kShards> shards_;
  std::atomic<std::uint64_t> refused_full_{0};  // new addresses refused because the table was full
  std::atomic<std::uint64_t> evicted_{0};
};

}  // namespace sluice
