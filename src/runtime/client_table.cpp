#include "runtime/client_table.hpp"

#include <algorithm>
#include <cstring>
#include <iterator>

#include <netinet/in.h>

namespace sluice {

std::size_t ClientTable::KeyHash::operator()(const Key& k) const {
  // FNV-1a: keys are addresses, not attacker-chosen hash-flooding material
  // beyond what the bounded table tolerates.
  std::uint64_t h = 1469598103934665603ull;
  for (std::uint8_t b : k.addr) {
    h ^= b;
    h *= 1099511628211ull;
  }
  return static_cast<std::size_t>(h);
}

// IPv4 addresses are keyed in their IPv4-mapped IPv6 form, so a client is
// one entry whichever way it arrives.
ClientTable::Key ClientTable::key_of(const sockaddr* sa) {
  Key k;
  if (sa->sa_family == AF_INET) {
    k.addr[10] = 0xff;
    k.addr[11] = 0xff;
    std::memcpy(k.addr.data() + 12, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, 4);
  } else if (sa->sa_family == AF_INET6) {
    std::memcpy(k.addr.data(), &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, 16);
  }
  return k;
}

void ClientTable::refill(Entry& e, double per_second, std::uint64_t now_ms) {
  const double burst = std::max(1.0, per_second);
  if (now_ms > e.last_ms) e.tokens = std::min(burst, e.tokens + per_second * static_cast<double>(now_ms - e.last_ms) / 1000.0);
  e.last_ms = now_ms;
}

Cause ClientTable::admit(const sockaddr* client, const Limits& limits, std::uint64_t now_ms) {
  const Key k = key_of(client);
  Shard& sh = shards_[KeyHash{}(k) % kShards];
  std::lock_guard lock(sh.mu);
  auto it = sh.clients.find(k);
  if (it == sh.clients.end()) {
    if (sh.clients.size() >= kMaxClients / kShards) {
      // Reclaim entries that carry nothing: no connection open, bucket full.
      for (auto i = sh.clients.begin(); i != sh.clients.end();) {
        Entry& e = i->second;
        bool idle = e.open == 0;
        if (idle && limits.per_second > 0) {
          refill(e, limits.per_second, now_ms);
          idle = e.tokens >= std::max(1.0, limits.per_second);
        }
        i = idle ? sh.clients.erase(i) : std::next(i);
      }
      if (sh.clients.size() >= kMaxClients / kShards) {
        refused_full_.fetch_add(1, std::memory_order_relaxed);
        return Cause::client_limit;
      }
    }
    Entry fresh;
    fresh.tokens = std::max(1.0, limits.per_second);
    fresh.last_ms = now_ms;
    it = sh.clients.emplace(k, fresh).first;
  }
  Entry& e = it->second;
  if (limits.max_connections > 0 && e.open >= limits.max_connections) return Cause::client_limit;
  if (limits.per_second > 0) {
    refill(e, limits.per_second, now_ms);
    if (e.tokens < 1.0) return Cause::rate_limited;
    e.tokens -= 1.0;
  }
  if (limits.max_connections > 0) ++e.open;
  return Cause::none;
}

void ClientTable::release(const sockaddr* client) {
  const Key k = key_of(client);
  Shard& sh = shards_[KeyHash{}(k) % kShards];
  std::lock_guard lock(sh.mu);
  auto it = sh.clients.find(k);
  if (it != sh.clients.end() && it->second.open > 0) --it->second.open;
}

std::size_t ClientTable::size() const {
  std::size_t n = 0;
  for (const Shard& sh : shards_) {
    std::lock_guard lock(sh.mu);
    n += sh.clients.size();
  }
  return n;
}

}  // namespace sluice
