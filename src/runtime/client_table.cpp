#include "runtime/client_table.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

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

ClientTable::ClientTable(std::size_t max_clients) : per_shard_(std::max<std::size_t>(1, max_clients / kShards)) {}

void ClientTable::IdleList::push_newest(Node& n) {
  Entry& e = n.second;
  e.idle = true;
  e.older = newest;
  e.newer = nullptr;
  if (newest != nullptr) newest->second.newer = &n;
  newest = &n;
  if (oldest == nullptr) oldest = &n;
}

void ClientTable::IdleList::remove(Node& n) {
  Entry& e = n.second;
  if (!e.idle) return;
  (e.older != nullptr ? e.older->second.newer : oldest) = e.newer;
  (e.newer != nullptr ? e.newer->second.older : newest) = e.older;
  e.older = e.newer = nullptr;
  e.idle = false;
}

ClientTable::Shard& ClientTable::shard_of(const Key& k) { return shards_[KeyHash{}(k) % kShards]; }

ClientTable::Node* ClientTable::find_or_add(Shard& sh, const Key& k, double tokens, std::uint64_t now_ms) {
  auto it = sh.clients.find(k);
  if (it != sh.clients.end()) return &*it;
  if (sh.clients.size() >= per_shard_) {
    // Forget the address seen least recently among those with nothing
    // open: constant work, whatever its bucket still holds (a client that
    // keeps coming back stays near the new end and keeps its bucket).
    Node* victim = sh.idle.oldest;
    if (victim == nullptr) return nullptr;
    const Key old = victim->first;  // erase() must not read a key from the node it frees
    sh.idle.remove(*victim);
    sh.clients.erase(old);
    evicted_.fetch_add(1, std::memory_order_relaxed);
  }
  Entry fresh;
  fresh.tokens = tokens;
  fresh.last_ms = now_ms;
  return &*sh.clients.emplace(k, fresh).first;
}

Cause ClientTable::admit(const sockaddr* client, const Limits& limits, std::uint64_t now_ms) {
  const Key k = key_of(client);
  Shard& sh = shard_of(k);
  std::lock_guard lock(sh.mu);
  Node* found = find_or_add(sh, k, std::max(1.0, limits.per_second), now_ms);
  if (found == nullptr) {
    refused_full_.fetch_add(1, std::memory_order_relaxed);
    return Cause::client_limit;
  }
  Node& node = *found;
  sh.idle.remove(node);
  Entry& e = node.second;
  Cause cause = Cause::none;
  if (limits.max_connections > 0 && e.open >= limits.max_connections) {
    cause = Cause::client_limit;
  } else if (limits.per_second > 0) {
    refill(e, limits.per_second, now_ms);
    if (e.tokens < 1.0) {
      cause = Cause::rate_limited;
    } else {
      e.tokens -= 1.0;
    }
  }
  if (cause == Cause::none && limits.max_connections > 0) ++e.open;
  if (e.open == 0) sh.idle.push_newest(node);  // seen just now: the last to be forgotten
  return cause;
}

void ClientTable::release(const sockaddr* client) {
  const Key k = key_of(client);
  Shard& sh = shard_of(k);
  std::lock_guard lock(sh.mu);
  auto it = sh.clients.find(k);
  if (it == sh.clients.end() || it->second.open == 0) return;
  if (--it->second.open == 0) sh.idle.push_newest(*it);
}

std::vector<ClientTable::SavedBucket> ClientTable::save_buckets(double per_second, std::uint64_t now_ms) const {
  std::vector<SavedBucket> out;
  if (per_second <= 0) return out;
  const double burst = std::max(1.0, per_second);
  for (const Shard& sh : shards_) {
    std::lock_guard lock(sh.mu);
    for (const auto& [key, e] : sh.clients) {
      const std::uint64_t age = now_ms > e.last_ms ? now_ms - e.last_ms : 0;
      if (e.tokens + per_second * static_cast<double>(age) / 1000.0 >= burst) continue;
      SavedBucket b;
      b.addr = key.addr;
      // Rounded down, so the new process never grants more than was left
      // (the epsilon keeps a value restored from thousandths as it came).
      b.tokens_milli = e.tokens > 0 ? static_cast<std::uint64_t>(std::floor(e.tokens * 1000.0 + 1e-6)) : 0;
      b.age_ms = age;
      out.push_back(b);
    }
  }
  return out;
}

bool ClientTable::restore_bucket(const SavedBucket& b, double per_second, std::uint64_t now_ms) {
  Key k;
  k.addr = b.addr;
  Shard& sh = shard_of(k);
  std::lock_guard lock(sh.mu);
  Node* node = find_or_add(sh, k, 0, now_ms);
  if (node == nullptr) return false;
  Entry& e = node->second;
  e.tokens = std::min(std::max(1.0, per_second), static_cast<double>(b.tokens_milli) / 1000.0);
  e.last_ms = now_ms > b.age_ms ? now_ms - b.age_ms : 0;
  if (e.open == 0) {
    // Seen as of its last refill: the newest, like an address just seen.
    sh.idle.remove(*node);
    sh.idle.push_newest(*node);
  }
  return true;
}

bool ClientTable::add_open(const std::array<std::uint8_t, 16>& addr, std::int64_t delta) {
  if (delta == 0) return true;
  Key k;
  k.addr = addr;
  Shard& sh = shard_of(k);
  std::lock_guard lock(sh.mu);
  Node* node = nullptr;
  if (delta > 0) {
    node = find_or_add(sh, k, 1.0, 0);
  } else if (auto it = sh.clients.find(k); it != sh.clients.end()) {
    node = &*it;
  }
  if (node == nullptr) return false;
  Entry& e = node->second;
  const std::uint32_t was = e.open;
  if (delta > 0) {
    e.open += static_cast<std::uint32_t>(delta);
  } else {
    e.open -= std::min(e.open, static_cast<std::uint32_t>(-delta));
  }
  if (was == 0 && e.open > 0) sh.idle.remove(*node);
  if (was > 0 && e.open == 0) sh.idle.push_newest(*node);
  return true;
}

std::vector<std::pair<std::array<std::uint8_t, 16>, std::uint32_t>> ClientTable::open_counts() const {
  std::vector<std::pair<std::array<std::uint8_t, 16>, std::uint32_t>> out;
  for (const Shard& sh : shards_) {
    std::lock_guard lock(sh.mu);
    for (const auto& [key, e] : sh.clients) {
      if (e.open > 0) out.emplace_back(key.addr, e.open);
    }
  }
  return out;
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
