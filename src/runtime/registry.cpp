#include "runtime/registry.hpp"

#include <cstring>
#include <unordered_set>

#include <spdlog/spdlog.h>

#include "log/access_log.hpp"
#include "sluice/address.hpp"

namespace sluice {

std::string server_identity(const Endpoint& address) {
  const sockaddr_storage& ss = address.addr;
  std::string id(1, static_cast<char>(ss.ss_family));
  const auto append = [&id](const void* p, std::size_t n) { id.append(static_cast<const char*>(p), n); };
  if (ss.ss_family == AF_INET) {
    sockaddr_in sin{};
    std::memcpy(&sin, &ss, sizeof sin);
    append(&sin.sin_port, sizeof sin.sin_port);
    append(&sin.sin_addr, sizeof sin.sin_addr);
  } else if (ss.ss_family == AF_INET6) {
    sockaddr_in6 sin6{};
    std::memcpy(&sin6, &ss, sizeof sin6);
    append(&sin6.sin6_port, sizeof sin6.sin6_port);
    append(&sin6.sin6_addr, sizeof sin6.sin6_addr);
    append(&sin6.sin6_scope_id, sizeof sin6.sin6_scope_id);
  } else {
    id += address.text;
  }
  return id;
}

Registry::Registry() = default;
Registry::~Registry() = default;

std::shared_ptr<ServerState> Registry::server(const UpstreamConfig& upstream, const ServerConfig& server) {
  std::lock_guard lock(mu_);
  std::weak_ptr<ServerState>& slot = servers_[ServerKey(upstream.name, server_identity(server.address))];
  std::shared_ptr<ServerState> state = slot.lock();
  if (state) {
    state->configure_passive(upstream.max_fails, upstream.fail_timeout);
    // A weight set at run time lasts until the file changes that server's weight.
    if (state->weight_override() != 0 && state->weight_override_base() != server.weight) {
      state->clear_weight_override();
    }
  } else {
    state = std::make_shared<ServerState>(upstream.name, server.address, upstream.max_fails, upstream.fail_timeout);
    slot = state;
  }
  std::weak_ptr<ServerState>& named = by_text_[std::make_pair(upstream.name, server.address.text)];
  if (const auto before = named.lock(); before && before != state) {
    // The same name, another address: a new server to check and count. The
    // old address's sessions go on as a removed server's do.
    spdlog::info("upstream \"{}\" server {} now resolves to {} (was {}): a new server from now on", upstream.name,
                 server.address.text, format_sockaddr(reinterpret_cast<const sockaddr*>(&server.address.addr)),
                 format_sockaddr(reinterpret_cast<const sockaddr*>(&before->address.addr)));
  }
  named = state;
  return state;
}

void Registry::forget_servers_except(const std::vector<const ServerState*>& kept) {
  std::lock_guard lock(mu_);
  std::unordered_set<const ServerState*> keep(kept.begin(), kept.end());
  const auto forget = [&keep](auto& map) {
    for (auto it = map.begin(); it != map.end();) {
      const std::shared_ptr<ServerState> s = it->second.lock();
      it = s && keep.count(s.get()) ? std::next(it) : map.erase(it);
    }
  };
  forget(servers_);
  forget(by_text_);
}

std::vector<std::shared_ptr<ServerState>> Registry::servers() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<ServerState>> out;
  for (const auto& [key, weak] : servers_) {
    if (auto s = weak.lock()) out.push_back(std::move(s));
  }
  return out;
}

void Registry::retire(const std::string& upstream, const std::shared_ptr<ServerState>& state) {
  std::lock_guard lock(mu_);
  for (const Retired& r : retired_) {
    if (r.upstream == upstream && r.state.lock() == state) return;
  }
  retired_.push_back({upstream, state, wall_ms()});
}

std::vector<RetiredServer> Registry::retired() {
  std::lock_guard lock(mu_);
  std::erase_if(retired_, [](const Retired& r) { return r.state.expired(); });
  std::vector<RetiredServer> out;
  for (const Retired& r : retired_) {
    // A session of an old Snapshot may still be about to pick it: one with
    // no session now stays listed here, and shows again if one comes.
    std::shared_ptr<ServerState> s = r.state.lock();
    if (s && s->active.load(std::memory_order_relaxed) > 0) out.push_back({r.upstream, std::move(s), r.at_ms});
  }
  return out;
}

std::shared_ptr<RouteStats> ListenerStats::route(const std::string& sni) {
  std::lock_guard lock(routes_mu_);
  std::shared_ptr<RouteStats>& slot = routes_[sni];
  if (!slot) slot = std::make_shared<RouteStats>();
  return slot;
}

std::shared_ptr<ListenerStats> Registry::listener(const std::string& name) {
  std::lock_guard lock(mu_);
  std::shared_ptr<ListenerStats>& slot = listeners_[name];
  if (!slot) slot = std::make_shared<ListenerStats>();
  return slot;
}

std::shared_ptr<std::atomic<std::uint64_t>> Registry::fallback_counter(const std::string& from,
                                                                      const std::string& to) {
  std::lock_guard lock(mu_);
  auto& slot = fallbacks_[{from, to}];
  if (!slot) slot = std::make_shared<std::atomic<std::uint64_t>>(0);
  return slot;
}

std::shared_ptr<WaitQueue> Registry::queue(const std::string& name) {
  std::lock_guard lock(mu_);
  std::shared_ptr<WaitQueue>& slot = queues_[name];
  if (!slot) slot = std::make_shared<WaitQueue>();
  return slot;
}

std::map<std::string, std::shared_ptr<WaitQueue>> Registry::queues() const {
  std::lock_guard lock(mu_);
  return queues_;
}

std::shared_ptr<AccessLog> Registry::access_log(const GlobalConfig& global) {
  std::lock_guard lock(mu_);
  const std::string key = global.access_log + '\n' + global.access_log_format;
  if (!access_log_ || key != access_log_key_) {
    access_log_ = std::make_shared<AccessLog>(global.access_log, global.access_log_format);
    access_log_key_ = key;
  }
  return access_log_;
}

}  // namespace sluice
