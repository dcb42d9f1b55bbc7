#include "net/runtime.hpp"

#include "log/access_log.hpp"

namespace sluice {

Runtime::Runtime(std::shared_ptr<const Config> cfg) : config(std::move(cfg)) {
  access_log = std::make_unique<AccessLog>(config->global.access_log, config->global.access_log_format);
  // Any upstream may be reached from any TLS listener (routes, default), so
  // one upstream hashing on the client IP makes every listener need it.
  bool needs_client_address = access_log->enabled();
  for (const auto& [name, up] : config->upstreams) {
    upstreams.emplace(name, std::make_unique<Upstream>(up));
    if (up.balance == Balance::hash && up.hash_key != HashKey::sni) needs_client_address = true;
  }
  for (const ListenerConfig& l : config->listeners) {
    ListenerRuntime lr;
    lr.config = &l;
    if (!l.upstream.empty()) lr.upstream = find_upstream(l.upstream);
    if (!l.default_upstream.empty()) lr.default_upstream = find_upstream(l.default_upstream);
    if (l.preread == Preread::tls) lr.router = std::make_unique<preread::SniRouter>(l.routes);
    lr.needs_client_address = needs_client_address;
    listeners.push_back(std::move(lr));
  }
}

Runtime::~Runtime() = default;

Upstream* Runtime::find_upstream(const std::string& name) const {
  auto it = upstreams.find(name);
  return it == upstreams.end() ? nullptr : it->second.get();
}

}  // namespace sluice
