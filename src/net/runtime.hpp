// Everything the data path needs from one configuration: the validated
// Config, the shared upstream pools and, per listener, its resolved routing.
// Built once on the control thread; shared read-only by every worker (the
// upstreams' own state is thread-safe).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "preread/sni_router.hpp"
#include "sluice/cause.hpp"
#include "sluice/config.hpp"
#include "upstream/upstream.hpp"

namespace sluice {

class AccessLog;

struct ListenerRuntime {
  const ListenerConfig* config = nullptr;
  Upstream* upstream = nullptr;          // plain listeners
  Upstream* default_upstream = nullptr;  // TLS preread listeners, may be null
  std::unique_ptr<preread::SniRouter> router;  // TLS preread listeners
  // The client's address is read at accept only when something uses it: the
  // access log, or a hash on the client IP. (Debug logging is checked per
  // session, as its level is a property of the logger.)
  bool needs_client_address = false;
};

struct Runtime {
  explicit Runtime(std::shared_ptr<const Config> cfg);

  std::shared_ptr<const Config> config;
  std::map<std::string, std::unique_ptr<Upstream>> upstreams;
  std::vector<ListenerRuntime> listeners;
  std::unique_ptr<AccessLog> access_log;

  // Process-wide counters.
  std::atomic<std::uint64_t> connections{0};  // open client connections
  std::array<std::atomic<std::uint64_t>, kCauseCount> causes{};

  Upstream* find_upstream(const std::string& name) const;
  ~Runtime();
};

}  // namespace sluice
