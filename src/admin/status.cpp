// GET /status (JSON) and the status page (GET /), both from the same data.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "admin/admin_api.hpp"
#include "sluice/address.hpp"
#include "sluice_version.hpp"

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

}  // namespace

nlohmann::json server_json(const Upstream& up, std::size_t i, TimePoint now) {
  const ServerState& s = up.server(i);
  const ServerState::Status st = s.status(now);
  return {
      {"address", s.address.text},
      {"weight", up.base_weight(i)},
      {"file_weight", up.member(i).config.weight},
      {"effective_weight", up.effective_weight(i, now)},
      {"max_conns", up.member(i).config.max_conns},
      {"backup", up.member(i).config.backup},
      {"state", st.state},
      {"reason", st.reason},
      {"since_ms", st.since_ms},
      {"admin", std::string(to_string(s.admin()))},
      {"active_check", std::string(to_string(s.active_state()))},
      {"passive", st.passive},
      {"passive_failures", st.passive_fails},
      {"active", s.active.load(std::memory_order_relaxed)},
      {"total_sessions", relaxed(s.total_sessions)},
      {"failures", relaxed(s.total_failures)},
      {"bytes_in", relaxed(s.bytes_in)},
      {"bytes_out", relaxed(s.bytes_out)},
      {"last_connect_ms", s.last_connect_ms.load(std::memory_order_relaxed)},
  };
}

nlohmann::json status_json(const Snapshot& snapshot, const ProcessInfo& info, TimePoint now,
                           std::int64_t now_ms) {
  nlohmann::json doc;
  doc["version"] = SLUICE_VERSION;
  doc["started_at_ms"] = info.started_at_ms;
  doc["uptime_seconds"] = static_cast<double>(now_ms - info.started_at_ms) / 1000.0;
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
    listeners.push_back({
        {"name", l.config->name},
        {"address", addr != info.listener_addresses.end() ? addr->second : l.config->listen.text},
        {"upstream", l.config->upstream},
        {"active", relaxed(l.stats->active)},
        {"accepted", relaxed(l.stats->accepted)},
        {"bytes_in", relaxed(l.stats->bytes_in)},
        {"bytes_out", relaxed(l.stats->bytes_out)},
        {"closed", std::move(closed)},
    });
  }
  doc["listeners"] = std::move(listeners);

  nlohmann::json upstreams = nlohmann::json::array();
  for (const auto& [uname, uc] : snapshot.config->upstreams) {
    const Upstream* up = snapshot.find_upstream(uc.name);
    if (up == nullptr) continue;
    nlohmann::json servers = nlohmann::json::array();
    for (std::size_t i = 0; i < up->size(); ++i) servers.push_back(server_json(*up, i, now));
    nlohmann::json entry = {{"name", uc.name}, {"balance", balance_name(uc.balance)}, {"servers", std::move(servers)}};
    if (const FallbackLink* link = snapshot.fallback_of(up)) {
      entry["fallback"] = link->to->name();
      entry["fallback_sessions"] = link->used->load(std::memory_order_relaxed);
    }
    upstreams.push_back(std::move(entry));
  }
  doc["upstreams"] = std::move(upstreams);
  return doc;
}

namespace {

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string text(const nlohmann::json& v) {
  if (v.is_string()) return html_escape(v.get<std::string>());
  if (v.is_number_float()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", v.get<double>());
    return buf;
  }
  return html_escape(v.dump());
}

// "1.2 MB" style, for byte counts.
std::string bytes(std::uint64_t n) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, kUnits[u]);
  return buf;
}

constexpr const char* kStyle = R"(
body{font:14px/1.4 system-ui,sans-serif;margin:0;padding:12px;background:#f6f7f9;color:#1d232b}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:18px 0 6px}
.meta{color:#566;margin-bottom:8px;overflow-wrap:anywhere}.bad{color:#b00020}
.wrap{overflow-x:auto;background:#fff;border:1px solid #d8dde3;border-radius:6px}
table{border-collapse:collapse;width:100%;white-space:nowrap}
th,td{padding:5px 8px;border-bottom:1px solid #e6e9ed;text-align:left}
th{background:#eef1f4;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.state-up td.s{background:#d7f5dd}tr.state-down td.s{background:#ffd6d6}
tr.state-drained td.s{background:#fff2c2}tr.state-disabled td.s{background:#dedede}
tr.state-down{background:#fff5f5}
)";

}  // namespace

std::string status_page(const nlohmann::json& s, const std::map<std::string, double>& rates) {
  std::string h;
  h.reserve(8192);
  h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
       "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
       "<meta http-equiv=\"refresh\" content=\"5\"><title>sluice status</title><style>";
  h += kStyle;
  h += "</style></head><body>\n<h1>sluice " + text(s["version"]) + "</h1>\n";
  h += "<div class=\"meta\">up " + text(s["uptime_seconds"]) + " s &middot; configuration generation " +
       text(s["config"]["generation"]) + " from <code>" + text(s["config"]["file"]) + "</code> &middot; " +
       text(s["connections"]) + " open connection(s)</div>\n";
  const auto& lr = s["last_reload"];
  if (lr["attempted"].get<bool>()) {
    const bool ok = lr["ok"].get<bool>();
    h += std::string("<div class=\"meta") + (ok ? "" : " bad") + "\" id=\"last-reload\">last reload (" +
         text(lr["origin"]) + "): " + (ok ? "succeeded" : "FAILED") + ": " + text(lr["message"]) + "</div>\n";
  } else {
    h += "<div class=\"meta\" id=\"last-reload\">no reload since start</div>\n";
  }
  // Absent from a document without it (the renderer takes any status JSON).
  if (const auto rd = s.find("readiness"); rd != s.end() && !(*rd)["ready"].get<bool>()) {
    h += "<div class=\"meta bad\" id=\"readiness\">not ready (GET /ready answers 503): " + text((*rd)["reason"]) +
         "</div>\n";
  }

  h += "<h2>Listeners</h2><div class=\"wrap\"><table id=\"listeners\"><tr><th>name</th><th>address</th>"
       "<th>upstream</th><th>active</th><th>accepted</th><th>conn/s</th><th>in</th><th>out</th><th>closed by cause</th></tr>\n";
  for (const auto& l : s["listeners"]) {
    const std::string name = l["name"].get<std::string>();
    auto r = rates.find(name);
    std::string closed;
    for (const auto& [cause, n] : l["closed"].items()) {
      if (!closed.empty()) closed += ", ";
      closed += html_escape(cause) + " " + text(n);
    }
    char rate[32] = "&ndash;";
    if (r != rates.end()) std::snprintf(rate, sizeof rate, "%.1f", r->second);
    h += "<tr data-listener=\"" + html_escape(name) + "\"><td>" + html_escape(name) + "</td><td>" +
         text(l["address"]) + "</td><td>" + text(l["upstream"]) + "</td><td class=\"n\">" + text(l["active"]) +
         "</td><td class=\"n\">" + text(l["accepted"]) + "</td><td class=\"n\">" + rate + "</td><td class=\"n\">" +
         bytes(l["bytes_in"].get<std::uint64_t>()) + "</td><td class=\"n\">" +
         bytes(l["bytes_out"].get<std::uint64_t>()) + "</td><td>" + closed + "</td></tr>\n";
  }
  h += "</table></div>\n";

  for (const auto& u : s["upstreams"]) {
    h += "<h2>Upstream " + text(u["name"]) + " <small>(" + text(u["balance"]) + ")</small></h2>"
         "<div class=\"wrap\"><table class=\"upstream\" data-upstream=\"" + text(u["name"]) + "\"><tr><th>server</th>"
         "<th>state</th><th>reason</th><th>weight</th><th>effective</th><th>active</th><th>sessions</th>"
         "<th>failures</th><th>in</th><th>out</th></tr>\n";
    for (const auto& sv : u["servers"]) {
      const std::string state = sv["state"].get<std::string>();
      h += "<tr class=\"state-" + html_escape(state) + "\" data-server=\"" + text(sv["address"]) + "\"><td>" +
           text(sv["address"]) + (sv["backup"].get<bool>() ? " (backup)" : "") + "</td><td class=\"s\">" +
           html_escape(state) + "</td><td>" + text(sv["reason"]) + "</td><td class=\"n\">" + text(sv["weight"]) +
           "</td><td class=\"n\">" + text(sv["effective_weight"]) + "</td><td class=\"n\">" + text(sv["active"]) +
           "</td><td class=\"n\">" + text(sv["total_sessions"]) + "</td><td class=\"n\">" + text(sv["failures"]) +
           "</td><td class=\"n\">" + bytes(sv["bytes_in"].get<std::uint64_t>()) + "</td><td class=\"n\">" +
           bytes(sv["bytes_out"].get<std::uint64_t>()) + "</td></tr>\n";
    }
    h += "</table></div>\n";
  }
  h += "</body></html>\n";
  return h;
}

}  // namespace sluice::admin
