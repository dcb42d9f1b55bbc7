// The admin API's routes: status (JSON and the HTML page), Prometheus
// metrics, reload, PUT /config, and per-server drain/disable/enable/weight.
// It reads the Snapshot and the Registry (atomics, at request time) and asks
// its host (the control loop) for anything that changes the configuration or
// reaches a worker, through AdminHooks: admin/ never includes control/.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "admin/http_server.hpp"
#include "runtime/snapshot.hpp"
#include "sluice/cause.hpp"
#include "sluice/dns_status.hpp"
#include "sluice/time.hpp"

namespace sluice::admin {

// The outcome of a reload or PUT /config.
struct Outcome {
  bool ok = false;
  std::string message;  // what changed, or the error (FILE:LINE:COLUMN: ...)
};

// What the host knows and the Snapshot does not.
struct ProcessInfo {
  std::int64_t started_at_ms = 0;   // wall clock
  std::int64_t loaded_at_ms = 0;    // when the running configuration was applied
  std::uint64_t generation = 0;
  std::string config_file;
  bool reload_attempted = false;
  bool reload_ok = false;
  std::int64_t reload_time_ms = 0;
  std::string reload_origin;
  std::string reload_message;
  std::uint64_t reloads_ok = 0;
  std::uint64_t reloads_failed = 0;
  std::map<std::string, std::string> listener_addresses;  // listener name -> bound address
  DnsStatus dns;  // servers from DNS: entries, counters
};

struct AdminHooks {
  std::function<std::shared_ptr<const Snapshot>()> snapshot;
  std::function<ProcessInfo()> info;
  std::function<Outcome()> reload;                         // re-read the file
  std::function<Outcome(std::string_view toml)> put_config;  // validate, write, apply
  // Close the live sessions on `server` with `cause` (every worker).
  std::function<void(std::shared_ptr<const ServerState>, Cause)> close_sessions;
};

class AdminApi {
 public:
  explicit AdminApi(AdminHooks hooks);

  // The token every request must carry (`Authorization: Bearer TOKEN`);
  // empty = no authentication.
  void set_token(std::string token) { token_ = std::move(token); }

  Response handle(const Request& request);

 private:
  Response server_action(const Request& request, std::string_view upstream, std::string_view server,
                         std::string_view action);
  Response page();

  AdminHooks hooks_;
  std::string token_;
  // The status page shows rates since its previous view.
  std::map<std::string, std::uint64_t> last_accepted_;
  TimePoint last_view_{};
};

// ---- pure renderers (unit-tested) ----

// One server of `up` as /status shows it (also the answer to server actions).
nlohmann::json server_json(const Upstream& up, std::size_t index, TimePoint now);
// GET /status as JSON.
nlohmann::json status_json(const Snapshot& snapshot, const ProcessInfo& info, TimePoint now, std::int64_t now_ms);
// The status page from status_json's document; `rates` maps listener name to
// connections per second since the previous view (absent: unknown).
std::string status_page(const nlohmann::json& status, const std::map<std::string, double>& rates);
// GET /metrics: Prometheus text exposition format 0.0.4.
std::string metrics_text(const Snapshot& snapshot, const ProcessInfo& info, TimePoint now);

}  // namespace sluice::admin
