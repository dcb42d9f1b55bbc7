// GET /status.csv: the status page's numbers as one table, for those who
// read HAProxy's `;csv` export into a spreadsheet or a script. Rendered from
// /status's document, like the page, so the three never disagree.
//
// RFC 4180: a header line, CRLF line ends, a field quoted when it holds a
// comma, a quote or a line break (quotes doubled). Text that a peer or the
// file controls (names, addresses, reasons, a check's reply) may start with
// what a spreadsheet takes for a formula (= + - @, or a tab or CR before
// one): such a cell gets a leading apostrophe, as OWASP advises, so it is
// shown as text and never run. Numbers are written as numbers.
#include <cstdio>
#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "admin/admin_api.hpp"

namespace sluice::admin {

namespace {

constexpr const char* kColumns[] = {
    "type",          "name",        "address",     "target",           "state",          "reason",
    "role",          "lag_seconds", "source",      "from",             "backup",         "weight",
    "effective_weight", "active",   "peak_active", "max",              "rate_per_s",     "total",
    "failures",      "check_failures", "down_count", "downtime_seconds", "since_ms",     "last_check",
    "bytes_in",      "bytes_out",   "servers",     "servers_available", "queue_length",  "fallback",
    "fallback_sessions", "balance", "age_seconds",
};
constexpr std::size_t kColumnCount = sizeof kColumns / sizeof kColumns[0];

// One text cell: neutralised, then quoted when RFC 4180 needs it.
std::string text_cell(std::string_view v) {
  std::string s;
  if (!v.empty() && (v[0] == '=' || v[0] == '+' || v[0] == '-' || v[0] == '@' || v[0] == '\t' || v[0] == '\r')) {
    s += '\'';
  }
  s += v;
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + '"';
}

// A JSON value as a cell: strings as text, numbers as numbers, null empty.
std::string cell(const nlohmann::json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return text_cell(v.get<std::string>());
  if (v.is_boolean()) return v.get<bool>() ? "1" : "0";
  if (v.is_number_float()) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.3f", v.get<double>());
    return buf;
  }
  if (v.is_number()) return v.dump();
  return text_cell(v.dump());
}

// A row, filled by column name; the rest stays empty.
class Row {
 public:
  Row& set(std::string_view column, const nlohmann::json& v) {
    for (std::size_t i = 0; i < kColumnCount; ++i) {
      if (column == kColumns[i]) cells_[i] = cell(v);
    }
    return *this;
  }
  // A member of `obj` when it has it.
  Row& copy(std::string_view column, const nlohmann::json& obj, const char* key) {
    if (const auto it = obj.find(key); it != obj.end()) set(column, *it);
    return *this;
  }
  void write(std::string& out) const {
    for (std::size_t i = 0; i < kColumnCount; ++i) {
      if (i != 0) out += ',';
      out += cells_[i];
    }
    out += "\r\n";
  }

 private:
  std::string cells_[kColumnCount];
};

// The upstream a listener's sessions go to (a preread listener: its default).
std::string listener_target(const nlohmann::json& l) {
  if (const auto d = l.find("default_route"); d != l.end()) return (*d)["upstream"].get<std::string>();
  return l["upstream"].get<std::string>();
}

}  // namespace

std::string status_csv(const nlohmann::json& s) {
  std::string out;
  for (std::size_t i = 0; i < kColumnCount; ++i) {
    if (i != 0) out += ',';
    out += kColumns[i];
  }
  out += "\r\n";

  std::map<std::string, std::uint64_t> available;  // upstream -> servers_available
  for (const auto& u : s["upstreams"]) available[u["name"].get<std::string>()] = u.value("servers_available", 0U);

  for (const auto& l : s["listeners"]) {
    const std::string target = listener_target(l);
    const auto a = available.find(target);
    const bool none = a != available.end() && a->second == 0;
    Row r;
    r.set("type", "listener").copy("name", l, "name").copy("address", l, "address").set("target", target);
    r.set("state", none ? "no_server" : "open");
    if (none) r.set("reason", "upstream \"" + target + "\" has no server available");
    r.copy("active", l, "active").copy("peak_active", l, "peak_active").copy("max", l, "max_connections");
    r.copy("rate_per_s", l, "conn_per_s").copy("total", l, "accepted");
    r.copy("bytes_in", l, "bytes_in").copy("bytes_out", l, "bytes_out");
    r.write(out);
  }

  const auto retired_rows = [&out](const std::string& upstream, const nlohmann::json& list) {
    for (const auto& rt : list) {
      Row r;
      r.set("type", "retired").set("name", upstream).copy("address", rt, "address").set("state", "retired");
      r.set("reason", "removed by a reload or DNS; its sessions go on");
      r.copy("active", rt, "sessions").copy("bytes_in", rt, "bytes_in").copy("bytes_out", rt, "bytes_out");
      r.copy("age_seconds", rt, "age_seconds");
      r.write(out);
    }
  };

  for (const auto& u : s["upstreams"]) {
    const std::string name = u["name"].get<std::string>();
    const auto& servers = u["servers"];
    Row sum_row;
    const std::uint64_t avail = u.value("servers_available", 0U);
    std::string why;
    const nlohmann::json unavailable = u.value("unavailable", nlohmann::json::object());
    for (const auto& [state, n] : unavailable.items()) {
      if (!why.empty()) why += ", ";
      why += std::to_string(n.get<std::uint64_t>()) + " " + state;
    }
    sum_row.set("type", "upstream").set("name", name).set("state", avail > 0 ? "up" : "no_server");
    sum_row.set("reason", why).copy("balance", u, "balance");
    sum_row.set("servers", servers.size()).set("servers_available", avail);
    sum_row.set("active", servers_sum(servers, "active")).set("total", servers_sum(servers, "total_sessions"));
    sum_row.set("failures", servers_sum(servers, "failures"));
    sum_row.set("bytes_in", servers_sum(servers, "bytes_in")).set("bytes_out", servers_sum(servers, "bytes_out"));
    if (const std::optional<double> rate = servers_rate(servers)) sum_row.set("rate_per_s", *rate);
    if (const auto q = u.find("queue"); q != u.end()) sum_row.copy("queue_length", *q, "length");
    sum_row.copy("fallback", u, "fallback").copy("fallback_sessions", u, "fallback_sessions");
    sum_row.write(out);

    for (const auto& sv : servers) {
      Row r;
      r.set("type", "server").set("name", name).copy("address", sv, "address").copy("state", sv, "state");
      r.copy("reason", sv, "reason").copy("role", sv, "role").copy("lag_seconds", sv, "lag_seconds");
      r.copy("source", sv, "source").copy("from", sv, "from").copy("backup", sv, "backup");
      r.copy("weight", sv, "weight").copy("effective_weight", sv, "effective_weight");
      r.copy("active", sv, "active").copy("peak_active", sv, "peak_active").copy("max", sv, "max_conns");
      r.copy("rate_per_s", sv, "sessions_per_s").copy("total", sv, "total_sessions");
      r.copy("failures", sv, "failures").copy("check_failures", sv, "check_failures");
      r.copy("down_count", sv, "down_count").copy("downtime_seconds", sv, "downtime_seconds");
      r.copy("since_ms", sv, "since_ms").copy("bytes_in", sv, "bytes_in").copy("bytes_out", sv, "bytes_out");
      if (const auto c = sv.find("last_check"); c != sv.end() && c->is_object()) {
        r.set("last_check", (*c)["result"].get<std::string>() + " " + (*c)["type"].get<std::string>() + ": " +
                                (*c)["reason"].get<std::string>());
      }
      r.write(out);
    }
    if (const auto rt = u.find("retired"); rt != u.end()) retired_rows(name, *rt);
  }
  if (const auto removed = s.find("removed_upstreams"); removed != s.end()) {
    for (const auto& u : *removed) retired_rows(u["name"].get<std::string>(), u["retired"]);
  }
  return out;
}

}  // namespace sluice::admin
