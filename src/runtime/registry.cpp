#include "runtime/registry.hpp"

#include <unordered_set>

#include "log/access_log.hpp"

namespace sluice {

Registry::Registry() = default;
Registry::~Registry() = default;

std::shared_ptr<ServerState> Registry::server(const UpstreamConfig& upstream, const ServerConfig& server) {
  std::lock_guard lock(mu_);
  auto key = std::make_pair(upstream.name, server.address.text);
  std::weak_ptr<ServerState>& slot = servers_[key];
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
  return state;
}

void Registry::forget_servers_except(const std::vector<const ServerState*>& kept) {
  std::lock_guard lock(mu_);
  std::unordered_set<const ServerState*> keep(kept.begin(), kept.end());
  for (auto it = servers_.begin(); it != servers_.end();) {
    const std::shared_ptr<ServerState> s = it->second.lock();
    it = s && keep.count(s.get()) ? std::next(it) : servers_.erase(it);
  }
}

std::vector<std::shared_ptr<ServerState>> Registry::servers() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<ServerState>> out;
  for (const auto& [key, weak] : servers_) {
    if (auto s = weak.lock()) out.push_back(std::move(s));
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
