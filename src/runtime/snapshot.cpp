#include "runtime/snapshot.hpp"

#include <random>

#include "log/access_log.hpp"

namespace sluice {

Snapshot::~Snapshot() = default;

std::shared_ptr<const Snapshot> Snapshot::build(std::shared_ptr<const Config> cfg, Registry& registry,
                                                std::uint64_t generation) {
  auto snap = std::make_shared<Snapshot>();
  snap->config = std::move(cfg);
  snap->generation = generation;
  snap->registry = &registry;
  const Config& config = *snap->config;
  snap->access_log = registry.access_log(config.global);

  std::random_device rd;
  std::vector<const ServerState*> kept;
  for (const auto& [name, up] : config.upstreams) {
    std::vector<std::shared_ptr<ServerState>> states;
    states.reserve(up.servers.size());
    for (const ServerConfig& s : up.servers) {
      states.push_back(registry.server(up, s));
      kept.push_back(states.back().get());
    }
    const std::uint64_t seed = (std::uint64_t{rd()} << 32) ^ rd();
    auto pool = std::make_unique<Upstream>(up, std::move(states), seed);
    if (up.queue > 0) pool->set_queue(registry.queue(name));
    snap->upstreams.emplace(name, std::move(pool));
  }
  link_fallbacks(*snap);
  for (const ListenerConfig& l : config.listeners) {
    ListenerView v;
    v.config = &l;
    if (!l.upstream.empty()) v.upstream = snap->find_upstream(l.upstream);
    if (!l.default_upstream.empty()) v.default_upstream = snap->find_upstream(l.default_upstream);
    if (l.preread != Preread::none) v.router = std::make_unique<preread::SniRouter>(l.routes);
    v.stats = registry.listener(l.name);
    if (l.preread != Preread::none) {
      for (const Route& r : l.routes) v.route_stats.push_back(v.stats->route(route_name(r)));
      v.default_route_stats = v.stats->route("");
    }
    snap->listeners.push_back(std::move(v));
  }
  registry.forget_servers_except(kept);
  return snap;
}

// The config loader has checked every name and that no chain loops.
void Snapshot::link_fallbacks(Snapshot& snap) {
  for (const auto& [name, up] : snap.upstreams) {
    const std::string& to = up->config().fallback;
    if (to.empty()) continue;
    Upstream* target = snap.find_upstream(to);
    if (target == nullptr) continue;
    snap.fallbacks.emplace(up.get(), FallbackLink{target, snap.registry->fallback_counter(name, to)});
  }
}

const FallbackLink* Snapshot::fallback_of(const Upstream* from) const {
  if (fallbacks.empty()) return nullptr;
  auto it = fallbacks.find(from);
  return it == fallbacks.end() ? nullptr : &it->second;
}

void Snapshot::make_current(const std::shared_ptr<const Snapshot>& snap) {
  for (const auto& [name, up] : snap->upstreams) {
    if (WaitQueue* q = up->queue()) q->set_current(std::shared_ptr<Upstream>(snap, up.get()));
  }
}

Upstream* Snapshot::find_upstream(const std::string& name) const {
  auto it = upstreams.find(name);
  return it == upstreams.end() ? nullptr : it->second.get();
}

long Snapshot::find_listener(const std::string& name) const {
  for (std::size_t i = 0; i < listeners.size(); ++i) {
    if (listeners[i].config->name == name) return static_cast<long>(i);
  }
  return -1;
}

}  // namespace sluice
