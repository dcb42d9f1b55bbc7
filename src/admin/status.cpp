// GET /status, GET /upstreams/U and GET /upstreams/U/servers/ADDR: the JSON
// documents (the status page, status_page.cpp, renders the first).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "admin/admin_api.hpp"
#include "sluice/address.hpp"
#include "sluice/version.hpp"
#include "upstream/availability.hpp"

namespace sluice::admin {

namespace {

std::string_view balance_name(Balance b) {
  switch (b) {
    case Balance::least_conn: return "least_conn";
    case Balance::round_robin: return "round_robin";
    case Balance::hash: return "hash";
    case Balance::random: return "random";
  }
  return "unknown";
}

std::uint64_t relaxed(const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); }

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

}  // namespace

nlohmann::json server_json(const Upstream& up, std::size_t i, TimePoint now) {
  const ServerState& s = up.server(i);
  const ServerState::Status st = s.status(now);
  const ServerState::LastCheck check = s.last_check();
  nlohmann::json last_check = nullptr;
  if (check.result != CheckResult::none) {
    last_check = {{"type", check.type},
                  {"result", std::string(to_string(check.result))},
                  {"seconds", check.seconds},
                  {"at_ms", check.at_ms},
                  {"reason", check.reason}};
  }
  return {
      {"address", s.address.text},
      {"weight", up.base_weight(i)},
      {"file_weight", up.member(i).config.weight},
      {"effective_weight", up.effective_weight(i, now)},
      {"max_conns", up.member(i).config.max_conns},
      {"backup", up.member(i).config.backup},
      {"from", up.member(i).config.from},
      {"source", server_source(up.member(i).config.from)},
      {"state", st.state},
      {"reason", st.reason},
      {"since_ms", st.since_ms},
      {"admin", std::string(to_string(s.admin()))},
      {"active_check", std::string(to_string(s.active_state()))},
      {"passive", st.passive},
      {"passive_failures", st.passive_fails},
      {"active", s.active.load(std::memory_order_relaxed)},
      {"peak_active", s.peak_active.load(std::memory_order_relaxed)},
      {"total_sessions", relaxed(s.total_sessions)},
      {"failures", relaxed(s.total_failures)},
      {"bytes_in", relaxed(s.bytes_in)},
      {"bytes_out", relaxed(s.bytes_out)},
      {"last_connect_ms", s.last_connect_ms.load(std::memory_order_relaxed)},
      {"last_check", std::move(last_check)},
      {"check_failures", relaxed(s.check_failures)},
      {"down_count", s.down_count()},
      {"downtime_seconds", std::chrono::duration<double>(s.downtime(now)).count()},
      {"role", st.role},
      {"lag_seconds", st.lag_seconds ? nlohmann::json(*st.lag_seconds) : nlohmann::json(nullptr)},
      {"fenced_by", st.fenced_by},
      {"fence_reason", st.fence_reason},
  };
}

nlohmann::json upstream_json(const Upstream& up, TimePoint now) {
  nlohmann::json servers = nlohmann::json::array();
  for (std::size_t i = 0; i < up.size(); ++i) servers.push_back(server_json(up, i, now));
  const Availability a = availability(up, now);
  return {{"name", up.name()},
          {"balance", balance_name(up.config().balance)},
          {"servers_available", a.eligible},
          {"unavailable", a.unavailable},
          {"servers", std::move(servers)}};
}

std::string_view server_source(std::string_view from) {
  if (from.empty()) return "file";
  // A DNS name has no space; the sentinel's entry is "sentinel NAME".
  return from.starts_with("sentinel ") ? "sentinel" : "dns";
}

std::vector<RetiredGroup> retired_servers(Registry& registry) {
  std::map<std::pair<std::string, std::string>, RetiredGroup> groups;
  for (RetiredServer& r : registry.retired()) {
    RetiredGroup& g = groups[{r.upstream, r.state->address.text}];
    if (g.states.empty()) {
      g.upstream = r.upstream;
      g.address = r.state->address.text;
      g.retired_at_ms = r.retired_at_ms;
    }
    g.sessions += r.state->active.load(std::memory_order_relaxed);
    g.bytes_in += relaxed(r.state->bytes_in);
    g.bytes_out += relaxed(r.state->bytes_out);
    g.retired_at_ms = std::min(g.retired_at_ms, r.retired_at_ms);
    g.states.push_back(std::move(r.state));
  }
  std::vector<RetiredGroup> out;
  out.reserve(groups.size());
  for (auto& [key, g] : groups) out.push_back(std::move(g));
  return out;
}

nlohmann::json retired_json(const RetiredGroup& r, std::int64_t now_ms) {
  return {{"address", r.address},
          {"sessions", r.sessions},
          {"bytes_in", r.bytes_in},
          {"bytes_out", r.bytes_out},
          {"retired_at_ms", r.retired_at_ms},
          {"age_seconds", static_cast<double>(std::max<std::int64_t>(now_ms - r.retired_at_ms, 0)) / 1000.0}};
}

// The "discovery" section: the resolver's counters and each entry whose
// servers come from DNS.
nlohmann::json dns_json(const DnsStatus& dns) {
  nlohmann::json entries = nlohmann::json::array();
  for (const DnsEntryStatus& e : dns.entries) {
    entries.push_back({
        {"upstream", e.upstream},
        {"entry", e.entry},
        {"type", e.type},
        {"name", e.name},
        {"addresses", e.servers},
        {"held", e.held},
        {"ttl_seconds", e.ttl_seconds},
        {"next_refresh_ms", e.next_refresh_ms},
        {"last_answer_ms", e.last_answer_ms},
        {"last_error", e.last_error},
        {"last_error_ms", e.last_error_ms},
    });
  }
  return {{"enabled", dns.enabled}, {"nameservers", dns.nameservers}, {"queries", dns.queries},
          {"errors", dns.errors},   {"changes", dns.changes},         {"entries", std::move(entries)}};
}

std::uint64_t servers_sum(const nlohmann::json& servers, const char* key) {
  std::uint64_t n = 0;
  for (const auto& sv : servers) n += sv.value(key, std::uint64_t{0});
  return n;
}

std::optional<double> servers_rate(const nlohmann::json& servers) {
  std::optional<double> total;
  for (const auto& sv : servers) {
    if (const auto r = sv.find("sessions_per_s"); r != sv.end() && r->is_number()) {
      total = total.value_or(0.0) + r->get<double>();
    }
  }
  return total;
}

nlohmann::json status_json(const Snapshot& snapshot, const ProcessInfo& info, TimePoint now,
                           std::int64_t now_ms) {
  nlohmann::json doc;
  doc["version"] = sluice::version();
  doc["hostname"] = host_name();
  doc["pid"] = static_cast<std::int64_t>(::getpid());
  doc["max_connections"] = snapshot.config->global.max_connections;
  doc["upgrade"] = {{"state", info.upgrade_state}, {"message", info.upgrade_message}};
  doc["started_at_ms"] = info.started_at_ms;
  doc["uptime_seconds"] = static_cast<double>(now_ms - info.started_at_ms) / 1000.0;
  // The service's start and uptime above go on across binary upgrades;
  // this process's own beside them.
  doc["process_started_at_ms"] = info.process_started_at_ms;
  doc["process_uptime_seconds"] = static_cast<double>(now_ms - info.process_started_at_ms) / 1000.0;
  doc["config"] = {{"file", info.config_file}, {"generation", info.generation}, {"loaded_at_ms", info.loaded_at_ms}};
  doc["last_reload"] = {{"attempted", info.reload_attempted}, {"ok", info.reload_ok},
                        {"time_ms", info.reload_time_ms},     {"origin", info.reload_origin},
                        {"message", info.reload_message}};
  doc["reloads"] = {{"ok", info.reloads_ok}, {"failed", info.reloads_failed}};
  doc["readiness"] = {{"ready", info.ready}, {"reason", info.not_ready_reason}, {"since_ms", info.ready_since_ms}};
  const ProcessCounters& pc = snapshot.registry->counters();
  doc["connections"] = relaxed(pc.connections);

  nlohmann::json listeners = nlohmann::json::array();
  for (const ListenerView& l : snapshot.listeners) {
    nlohmann::json closed = nlohmann::json::object();
    for (std::size_t c = 0; c < kCauseCount; ++c) {
      const std::uint64_t n = l.stats->closed.get(static_cast<Cause>(c));
      if (n != 0) closed[std::string(to_string(static_cast<Cause>(c)))] = n;
    }
    auto addr = info.listener_addresses.find(l.config->name);
    nlohmann::json listener = {
        {"name", l.config->name},
        {"address", addr != info.listener_addresses.end() ? addr->second : l.config->listen.text},
        {"upstream", l.config->upstream},
        {"active", relaxed(l.stats->active)},
        {"peak_active", relaxed(l.stats->peak_active)},
        {"max_connections", l.config->max_connections},
        {"accepted", relaxed(l.stats->accepted)},
        {"bytes_in", relaxed(l.stats->bytes_in)},
        {"bytes_out", relaxed(l.stats->bytes_out)},
        {"closed", std::move(closed)},
    };
    if (l.default_route_stats) {
      // The configured routes (never the names clients sent), then the default.
      nlohmann::json routes = nlohmann::json::array();
      const auto route = [](std::string_view sni, std::string_view alpn, std::string_view upstream,
                            const RouteStats& rs) {
        return nlohmann::json{{"sni", sni},
                              {"alpn", alpn},
                              {"upstream", upstream},
                              {"sessions", relaxed(rs.sessions)},
                              {"bytes_in", relaxed(rs.bytes_in)},
                              {"bytes_out", relaxed(rs.bytes_out)}};
      };
      for (std::size_t r = 0; r < l.route_stats.size(); ++r) {
        const Route& cr = l.config->routes[r];
        routes.push_back(route(cr.sni, cr.alpn, cr.upstream, *l.route_stats[r]));
      }
      listener["routes"] = std::move(routes);
      listener["default_route"] = route("", "", l.config->default_upstream, *l.default_route_stats);
    }
    listeners.push_back(std::move(listener));
  }
  doc["listeners"] = std::move(listeners);

  // Sessions on servers a reload or DNS removed, by upstream: listed under
  // the upstream when it is still configured, else as one of its own.
  std::map<std::string, nlohmann::json> retired;
  for (const RetiredGroup& r : retired_servers(*snapshot.registry)) {
    nlohmann::json& list = retired[r.upstream];
    if (list.is_null()) list = nlohmann::json::array();
    list.push_back(retired_json(r, now_ms));
  }
  nlohmann::json upstreams = nlohmann::json::array();
  for (const auto& [uname, uc] : snapshot.config->upstreams) {
    const Upstream* up = snapshot.find_upstream(uc.name);
    if (up == nullptr) continue;
    nlohmann::json entry = upstream_json(*up, now);
    const auto r = retired.find(uname);
    entry["retired"] = r != retired.end() ? std::move(r->second) : nlohmann::json::array();
    if (r != retired.end()) retired.erase(r);
    if (const FallbackLink* link = snapshot.fallback_of(up)) {
      entry["fallback"] = link->to->name();
      entry["fallback_sessions"] = link->used->load(std::memory_order_relaxed);
    }
    if (const WaitQueue* q = up->queue()) {
      const auto& h = q->wait_seconds();
      entry["queue"] = {
          {"length", q->length()},
          {"max", uc.queue},
          {"timeout_ms", uc.queue_timeout.count()},
          {"oldest_wait_seconds", q->oldest_wait(now)},
          {"queued", q->queued_total()},
          {"timeouts", q->timeouts()},
          {"refused", q->refused()},
          {"waits", h.count()},
          {"wait_seconds_sum", h.sum_seconds()},
      };
    }
    upstreams.push_back(std::move(entry));
  }
  doc["upstreams"] = std::move(upstreams);
  nlohmann::json removed = nlohmann::json::array();
  for (auto& [uname, list] : retired) removed.push_back({{"name", uname}, {"retired", std::move(list)}});
  doc["removed_upstreams"] = std::move(removed);
  doc["discovery"] = dns_json(info.dns);
  return doc;
}

}  // namespace sluice::admin
