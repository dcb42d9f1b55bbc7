// The admin API's routes: status (JSON and the HTML page), Prometheus
// metrics, reload, PUT /config, and per-server drain/disable/enable/weight.
// It reads the Snapshot and the Registry (atomics, at request time) and asks
// its host (the control loop) for anything that changes the configuration or
// reaches a worker, through AdminHooks: admin/ never includes control/.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "admin/allowed_hosts.hpp"
#include "admin/http_server.hpp"
#include "admin/token.hpp"
#include "runtime/snapshot.hpp"
#include "sluice/cause.hpp"
#include "sluice/dns_status.hpp"
#include "sluice/time.hpp"

namespace sluice::admin {

// The outcome of a reload or PUT /config.
struct Outcome {
  Outcome() = default;
  Outcome(bool ok_, std::string message_, std::vector<std::string> restart_required_ = {})
      : ok(ok_), message(std::move(message_)), restart_required(std::move(restart_required_)) {}

  bool ok = false;
  std::string message;  // what changed, or the error (FILE:LINE:COLUMN: ...)
  // Settings that wait for a restart (the answer's "restart_required").
  std::vector<std::string> restart_required;
};

// What the host knows and the Snapshot does not.
struct ProcessInfo {
  std::int64_t started_at_ms = 0;   // wall clock: the service's start (a binary upgrade carries it over)
  std::int64_t process_started_at_ms = 0;  // wall clock: this process's start
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
  // Readiness for a front tier (GET /ready): false from POST
  // /healthcheck/fail until POST /healthcheck/ok, and from SIGTERM on.
  bool ready = true;
  std::string not_ready_reason;   // why not, when not ready
  std::int64_t ready_since_ms = 0;  // wall clock of the last change (or the start)
  DnsStatus dns;  // servers from DNS: entries, counters
  // Binary upgrade (control/upgrade_state.hpp): none, starting,
  // handing_over, finishing, handed_over, failed, receiving, took_over.
  std::string upgrade_state;
  std::string upgrade_message;
};

struct AdminHooks {
  std::function<std::shared_ptr<const Snapshot>()> snapshot;
  std::function<ProcessInfo()> info;
  std::function<Outcome()> reload;                         // re-read the file
  // POST /upgrade: start the binary upgrade (it goes on after the answer).
  std::function<Outcome()> upgrade;
  std::function<Outcome(std::string_view toml)> put_config;  // validate, write, apply
  // Close the live sessions on `server` with `cause` (every worker).
  std::function<void(std::shared_ptr<const ServerState>, Cause)> close_sessions;
  // POST /healthcheck/fail (false) and /healthcheck/ok (true): readiness by
  // hand. Refused (ok = false) when the host is stopping and `ready` is true.
  std::function<Outcome(bool ready, const std::string& by)> set_ready;
};

// Per-second samples of counters, to tell their rate over the last
// kWindow seconds (the status page's conn/s). Fed by a timer on the control
// loop, never by a viewer.
class RateWindow {
 public:
  static constexpr int kWindow = 10;  // seconds
  void add(TimePoint at, std::map<std::string, std::uint64_t> counts);
  // Per second, between the oldest and the newest sample holding `key`
  // (at least a second apart), or nothing yet.
  std::optional<double> rate(const std::string& key) const;

 private:
  struct Sample {
    TimePoint at;
    std::map<std::string, std::uint64_t> counts;
  };
  std::deque<Sample> samples_;
};

// The keys of RateWindow for a listener's accepted connections and a server's sessions.
std::string listener_rate_key(std::string_view listener);
std::string server_rate_key(std::string_view upstream, std::string_view server);

class AdminApi {
 public:
  explicit AdminApi(AdminHooks hooks);

  // The token every request must carry (`Authorization: Bearer TOKEN`, or
  // HTTP Basic with the token as the password); empty = no authentication.
  void set_token(std::string_view token) { token_ = Token(token); }

  // The names a request that changes something may give in Host (see
  // allowed_hosts.hpp). Until set: localhost and literal IPs only.
  void set_allowed_hosts(AllowedHosts hosts) { hosts_ = std::move(hosts); }

  // nullopt when `request` may go on; otherwise the answer that refuses
  // it: 401 without the token (when one is set), and for a change (any
  // method but GET and HEAD) 421 when Host is not one of this API's names,
  // 403 when Origin is another site. Needs only the headers: the HTTP
  // server calls it before it reads a body or sends `100 Continue`.
  std::optional<Response> authorize(const Request& request) const;

  // Answers a request (authorize() first).
  Response handle(const Request& request);

  // Called by the host once a second: samples the counters that rates are
  // measured from, so a rate covers the same fixed window whoever looks and
  // however often.
  void tick(TimePoint now);

 private:
  // The 401 for a request without the token, when one is set.
  std::optional<Response> authenticate(const Request& request) const;
  Response server_action(const Request& request, std::string_view upstream, std::string_view server,
                         std::string_view action);
  Response retired_action(const Request& request, std::string_view upstream, std::string_view server,
                          std::string_view action);
  Response upstream_get(const Request& request, std::string_view upstream, std::string_view server);
  Response page();
  Response readiness(const Request& request, std::string_view action);
  // status_json with the rates added (listeners' conn_per_s, servers' sessions_per_s).
  nlohmann::json status_with_rates();

  AdminHooks hooks_;
  Token token_;
  AllowedHosts hosts_;
  RateWindow rates_;
};

// ---- pure functions (unit-tested) ----

// What an Authorization header value presents: `Bearer TOKEN`, or
// `Basic BASE64(USER:TOKEN)` with any user name (what a browser sends). The
// scheme is case-insensitive. nullopt for any other scheme or a malformed value.
struct Credentials {
  std::string user;  // Basic's user name; empty for Bearer (or an empty name)
  std::string token;
};
std::optional<Credentials> presented_credentials(std::string_view authorization);
std::optional<std::string> presented_token(std::string_view authorization);

// Who asked, for the log: "127.0.0.1:51234", or with an HTTP Basic user name
// `127.0.0.1:51234 as user "ops"` (the name escaped: it is the client's bytes).
std::string requester(const Request& request);

// The hint for a PUT /config body that failed and has no line break at all:
// what `curl -d @FILE` sends (it drops them). Empty when there is none to give.
std::string put_config_hint(std::string_view body);

// One server of `up` as /status shows it (also the answer to server actions).
nlohmann::json server_json(const Upstream& up, std::size_t index, TimePoint now);
// One upstream as /status shows it (GET /upstreams/U).
nlohmann::json upstream_json(const Upstream& up, TimePoint now);
// Where a server came from, by its `from`: "file", "dns" or "sentinel".
std::string_view server_source(std::string_view from);
// The servers that a reload or a DNS change removed and that still have
// live sessions, one per upstream and address (a server removed, added back
// and removed again is two states, shown as one), in upstream then address
// order.
struct RetiredGroup {
  std::string upstream;
  std::string address;
  std::uint64_t sessions = 0;
  std::uint64_t bytes_in = 0;   // the servers' totals: what they moved before and since their removal
  std::uint64_t bytes_out = 0;
  std::int64_t retired_at_ms = 0;  // the earliest removal
  std::vector<std::shared_ptr<const ServerState>> states;
};
std::vector<RetiredGroup> retired_servers(Registry& registry);
// One of them as /status lists it.
nlohmann::json retired_json(const RetiredGroup& retired, std::int64_t now_ms);
// GET /status as JSON.
nlohmann::json status_json(const Snapshot& snapshot, const ProcessInfo& info, TimePoint now, std::int64_t now_ms);
// The status page from status_json's document (with the rates, when known).
std::string status_page(const nlohmann::json& status, std::int64_t now_ms);
// Over an upstream's "servers" in a status document (the page's and the
// CSV's summary): the sum of the number `key`, and of their rates (nullopt
// while none is measured yet).
std::uint64_t servers_sum(const nlohmann::json& servers, const char* key);
std::optional<double> servers_rate(const nlohmann::json& servers);
// GET /status.csv from status_json's document (with the rates, when known).
std::string status_csv(const nlohmann::json& status);
// "3d 4h 12m", "5m 7s", "42s": a duration as people read it.
std::string human_duration(double seconds);
// GET /metrics: Prometheus text exposition format 0.0.4.
std::string metrics_text(const Snapshot& snapshot, const ProcessInfo& info, TimePoint now);

}  // namespace sluice::admin
