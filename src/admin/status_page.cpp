// The status page (GET /): one HTML document with inline CSS and a small
// inline script, no external asset, rendered from /status's JSON document so
// the two never disagree. Everything from the file or from peers is escaped.
//
// HAProxy's stats page is the model: per server its state and how long it
// has been in it, the last check, current/peak/limit sessions, weights,
// failures and downtime. Actions (drain, disable, enable, weight) are
// buttons that ask for a confirmation, then call the same API a script
// would, from the page's own origin: the browser sends whatever
// credentials it loaded the page with.
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "admin/admin_api.hpp"

namespace sluice::admin {

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

// "1.2 MiB" style, for byte counts.
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

std::string bytes(const nlohmann::json& v) { return bytes(v.get<std::uint64_t>()); }

// A rate from the JSON (null: not measured yet).
std::string rate(const nlohmann::json& v) {
  if (!v.is_number()) return "&ndash;";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v.get<double>());
  return buf;
}

// "2 ms", "1.25 s": a check's duration.
std::string short_duration(double seconds) {
  char buf[32];
  if (seconds < 0.01) {
    std::snprintf(buf, sizeof buf, "%.1f ms", seconds * 1000.0);
  } else if (seconds < 1.0) {
    std::snprintf(buf, sizeof buf, "%.0f ms", seconds * 1000.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f s", seconds);
  }
  return buf;
}

// A limit of 0 means none.
std::string limit(const nlohmann::json& v) { return v.get<std::uint64_t>() == 0 ? "&ndash;" : text(v); }

std::string td(const std::string& content, const char* cls = nullptr, const std::string& title = "") {
  std::string out = "<td";
  if (cls != nullptr) out += std::string(" class=\"") + cls + "\"";
  if (!title.empty()) out += " title=\"" + title + "\"";
  out += ">" + content + "</td>";
  return out;
}

std::string num(const nlohmann::json& v) { return td(text(v), "n"); }

// The same columns, in the same widths, for every upstream's table: with
// `table-layout: fixed` the widths below are the widths, whatever the cells
// hold, so the tables line up one under the other.
struct Column {
  const char* head;
  const char* title;  // the header's tooltip
  int width;          // px; 0 = the rest
};
constexpr Column kServerColumns[] = {
    {"server", "address (backup servers are marked)", 0},
    {"state", "up, standby, down, fenced, drained or disabled", 76},
    {"for", "time in the current state", 86},
    {"reason", "why the server is in this state", 190},
    {"last check", "the last active check: result, type, duration, how long ago", 190},
    {"bck", "backup server: used only when no primary server is eligible", 40},
    {"wt", "weight (a runtime override, else the file's)", 44},
    {"eff", "effective weight the balancer uses now (slow start)", 48},
    {"cur", "sessions now", 50},
    {"peak", "most sessions at once since start", 56},
    {"max", "max_conns", 50},
    {"sess/s", "sessions per second over the last 10 s", 60},
    {"total", "times the server was chosen", 76},
    {"fail", "failed connects (the server's fault)", 48},
    {"chk fail", "failed active checks", 74},
    {"dn", "times the server went down", 62},
    {"downtime", "total time down (health, not drains)", 92},
    {"in", "bytes client to server", 80},
    {"out", "bytes server to client", 80},
    {"actions", "", 250},
};

constexpr Column kListenerColumns[] = {
    {"listener", "name, then its SNI routes", 0},
    {"address", "where it listens", 190},
    {"upstream", "where its sessions go", 130},
    {"cur", "client connections now", 56},
    {"peak", "most client connections at once since start", 56},
    {"max", "max_connections (this listener)", 64},
    {"accepted", "client connections accepted (routes: sessions routed)", 84},
    {"conn/s", "connections per second over the last 10 s", 64},
    {"in", "bytes client to server", 84},
    {"out", "bytes server to client", 84},
    {"closed by cause", "", 300},
};

template <std::size_t N>
std::string table_head(const Column (&cols)[N]) {
  int total = 240;  // the flexible column's least
  std::string h = "<colgroup>";
  for (const Column& c : cols) {
    total += c.width;
    h += c.width == 0 ? std::string("<col>") : "<col style=\"width:" + std::to_string(c.width) + "px\">";
  }
  h += "</colgroup><thead><tr>";
  for (const Column& c : cols) {
    h += "<th";
    if (*c.title != '\0') h += std::string(" title=\"") + c.title + "\"";
    h += std::string(">") + c.head + "</th>";
  }
  h += "</tr></thead>";
  return "<table style=\"min-width:" + std::to_string(total) + "px\">" + h;
}

constexpr const char* kStyle = R"(
body{font:14px/1.4 system-ui,sans-serif;margin:0;padding:12px;background:#f6f7f9;color:#1d232b}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:18px 0 6px}
.meta{color:#566;margin-bottom:8px;overflow-wrap:anywhere}.bad{color:#b00020}.ok{color:#176b2c}
#msg{min-height:1.4em;overflow-wrap:anywhere}
.wrap{overflow-x:auto;background:#fff;border:1px solid #d8dde3;border-radius:6px}
table{border-collapse:collapse;width:100%;table-layout:fixed;white-space:nowrap}
th,td{padding:5px 6px;border-bottom:1px solid #e6e9ed;text-align:left;overflow:hidden;text-overflow:ellipsis}
th{background:#eef1f4;font-weight:600;cursor:help}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.state-up td.s{background:#d7f5dd}tr.state-down td.s{background:#ffd6d6}
tr.state-drained td.s{background:#fff2c2}tr.state-disabled td.s{background:#dedede}
tr.state-standby td.s{background:#e6e8eb;color:#4a525c}tr.state-fenced td.s{background:#e9d7ff}
td.s .role{display:block;font-size:11px;color:#4a525c}
tr.state-down{background:#fff5f5}tr.route td{color:#445;background:#fafbfc}tr.route td:first-child{padding-left:22px}
.chk-pass{color:#176b2c;font-weight:600}.chk-fail{color:#b00020;font-weight:600}.chk-local_error{color:#8a5a00}
.tag{font-size:11px;border:1px solid #99a;border-radius:3px;padding:0 3px;margin-left:4px;color:#445}
button{font:inherit;font-size:12px;padding:1px 6px;margin-right:3px;border:1px solid #8a94a0;border-radius:4px;
background:#fff;cursor:pointer}button:hover{background:#eef1f4}button:disabled{opacity:.5;cursor:wait}
)";

// The actions: confirm, call the API with the page's own credentials (a
// browser resends HTTP Basic on its own; a Bearer header set for the whole
// origin goes along too), then show the new state. The page reloads every
// 5 s, but never under an open dialog or a request in flight.
constexpr const char* kScript = R"(
(function () {
  var busy = false, timer = null;
  function later() {
    clearTimeout(timer);
    timer = setTimeout(function () { if (busy) later(); else location.reload(); }, 5000);
  }
  function say(t, bad) {
    var m = document.getElementById("msg");
    m.textContent = t;
    m.className = bad ? "bad" : "ok";
  }
  document.addEventListener("click", function (e) {
    var b = e.target.closest ? e.target.closest("button[data-action]") : null;
    if (!b) return;
    var tr = b.closest("tr"), up = tr.closest("table").getAttribute("data-upstream");
    var srv = tr.getAttribute("data-server"), act = b.getAttribute("data-action");
    var method = "POST", body = null, what = act + " " + srv + " in upstream " + up;
    busy = true;
    if (act === "weight") {
      var w = prompt("New weight for " + srv + " in upstream " + up + " (1 to 1000):", tr.getAttribute("data-weight"));
      if (w === null) { busy = false; return; }
      method = "PUT";
      body = JSON.stringify({weight: Number(w.trim())});
      what = "weight " + w.trim() + " for " + srv + " in upstream " + up;
    } else if (!confirm(b.getAttribute("data-confirm"))) {
      busy = false;
      return;
    }
    b.disabled = true;
    say(what + "\u2026", false);
    fetch("upstreams/" + encodeURIComponent(up) + "/servers/" + encodeURIComponent(srv) + "/" + act,
          {method: method, body: body, credentials: "same-origin", cache: "no-store",
           headers: {"Content-Type": "application/json"}})
      .then(function (r) {
        return r.json().then(function (j) {
          if (!r.ok) throw new Error(j.error || ("HTTP " + r.status));
          say(what + ": done, now " + j.state, false);
          location.reload();
        });
      })
      .catch(function (err) {
        busy = false;
        b.disabled = false;
        say(what + " failed: " + err.message, true);
        later();
      });
  });
  later();
})();
)";

std::string button(const std::string& action, const std::string& label, const std::string& confirm) {
  return "<button type=\"button\" data-action=\"" + action + "\" data-confirm=\"" + html_escape(confirm) + "\">" +
         label + "</button>";
}

// The role a standby or fenced server plays, in plain words: "replica, 0 s
// behind"; nothing for a server that is up or has no role check.
std::string role_words(const nlohmann::json& sv) {
  const std::string state = sv["state"].get<std::string>();
  const std::string role = sv.value("role", std::string());
  if (role.empty() || (state != "standby" && state != "fenced")) return {};
  std::string words = role;
  if (const auto& lag = sv["lag_seconds"]; lag.is_number()) {
    words += ", " + std::to_string(static_cast<long long>(lag.get<double>() + 0.5)) + " s behind";
  }
  return "<span class=\"role\">" + html_escape(words) + "</span>";
}

std::string server_row(const nlohmann::json& sv, std::int64_t now_ms, std::int64_t started_ms,
                       const std::string& upstream) {
  const std::string state = sv["state"].get<std::string>();
  const std::string addr = sv["address"].get<std::string>();
  const std::int64_t since = sv["since_ms"].get<std::int64_t>();
  const double in_state = static_cast<double>(now_ms - (since != 0 ? since : started_ms)) / 1000.0;

  std::string check = "&ndash;";
  std::string check_title;
  if (const auto& c = sv["last_check"]; c.is_object()) {
    const std::string result = c["result"].get<std::string>();
    const double ago = static_cast<double>(now_ms - c["at_ms"].get<std::int64_t>()) / 1000.0;
    check = "<span class=\"chk-" + html_escape(result) + "\">" + html_escape(result) + "</span> " + text(c["type"]) +
            " " + short_duration(c["seconds"].get<double>()) + ", " + human_duration(ago) + " ago";
    check_title = text(c["reason"]);
  }

  const std::string admin = sv["admin"].get<std::string>();
  const std::string who = addr + " in upstream " + upstream;
  std::string actions;
  if (admin != "drain") actions += button("drain", "drain", "Drain " + who + "? No new sessions; live ones stay.");
  if (admin != "disabled") {
    actions += button("disable", "disable", "Disable " + who + "? No new sessions, and its live sessions are closed.");
  }
  if (admin != "enabled") actions += button("enable", "enable", "Enable " + who + "?");
  actions += button("weight", "weight", "");

  std::string h = "<tr class=\"state-" + html_escape(state) + "\" data-server=\"" + html_escape(addr) +
                  "\" data-weight=\"" + text(sv["weight"]) + "\" data-admin=\"" + html_escape(admin) + "\">";
  h += td(html_escape(addr) + (sv["backup"].get<bool>() ? "<span class=\"tag\">backup</span>" : ""), nullptr,
          html_escape(addr));
  h += td(html_escape(state) + role_words(sv), "s");
  h += td(human_duration(in_state), "n");
  h += td(text(sv["reason"]), nullptr, text(sv["reason"]));
  h += td(check, "chk", check_title);
  h += td(sv["backup"].get<bool>() ? "Y" : "&ndash;");
  h += num(sv["weight"]);
  h += num(sv["effective_weight"]);
  h += num(sv["active"]);
  h += num(sv["peak_active"]);
  h += td(limit(sv["max_conns"]), "n");
  h += td(rate(sv.value("sessions_per_s", nlohmann::json())), "n");
  h += num(sv["total_sessions"]);
  h += num(sv["failures"]);
  h += num(sv["check_failures"]);
  h += num(sv["down_count"]);
  h += td(human_duration(sv["downtime_seconds"].get<double>()), "n");
  h += td(bytes(sv["bytes_in"]), "n");
  h += td(bytes(sv["bytes_out"]), "n");
  h += td(actions, "act");
  h += "</tr>\n";
  return h;
}

std::string listener_rows(const nlohmann::json& l) {
  const std::string name = l["name"].get<std::string>();
  std::string closed;
  for (const auto& [cause, n] : l["closed"].items()) {
    if (!closed.empty()) closed += ", ";
    closed += html_escape(cause) + " " + text(n);
  }
  std::string h = "<tr data-listener=\"" + html_escape(name) + "\">";
  h += td(html_escape(name));
  h += td(text(l["address"]));
  h += td(text(l["upstream"]));
  h += num(l["active"]);
  h += num(l["peak_active"]);
  h += td(limit(l["max_connections"]), "n");
  h += num(l["accepted"]);
  h += td(rate(l.value("conn_per_s", nlohmann::json())), "n");
  h += td(bytes(l["bytes_in"]), "n");
  h += td(bytes(l["bytes_out"]), "n");
  h += td(closed, nullptr, closed);
  h += "</tr>\n";
  if (!l.contains("routes")) return h;
  const auto route_row = [&](const nlohmann::json& r, const std::string& label, const std::string& key) {
    std::string row = "<tr class=\"route\" data-listener=\"" + html_escape(name) + "\" data-route=\"" + key + "\">";
    row += td("&rarr; " + label) + td("") + td(text(r["upstream"])) + td("") + td("") + td("");
    row += num(r["sessions"]) + td("") + td(bytes(r["bytes_in"]), "n") + td(bytes(r["bytes_out"]), "n") + td("");
    return row + "</tr>\n";
  };
  for (const auto& r : l["routes"]) {
    const std::string sni = text(r["sni"]);
    const std::string alpn = r.contains("alpn") ? text(r["alpn"]) : "";
    if (alpn.empty()) {
      h += route_row(r, "SNI " + sni, sni);
    } else {
      // The same key as the metrics' route label.
      h += route_row(r, (sni.empty() ? "" : "SNI " + sni + " ") + "ALPN " + alpn,
                     (sni.empty() ? "" : sni + " ") + "alpn=" + alpn);
    }
  }
  const auto& d = l["default_route"];
  h += route_row(d, d["upstream"].get<std::string>().empty() ? "default (none: closed)" : "default", "");
  return h;
}

}  // namespace

std::string human_duration(double seconds) {
  if (!(seconds > 0)) return "0s";
  auto s = static_cast<std::uint64_t>(seconds);
  const std::uint64_t d = s / 86400, hr = s / 3600 % 24, m = s / 60 % 60;
  s %= 60;
  char buf[64];
  if (d > 0) {
    std::snprintf(buf, sizeof buf, "%llud %lluh %llum", static_cast<unsigned long long>(d),
                  static_cast<unsigned long long>(hr), static_cast<unsigned long long>(m));
  } else if (hr > 0) {
    std::snprintf(buf, sizeof buf, "%lluh %llum", static_cast<unsigned long long>(hr),
                  static_cast<unsigned long long>(m));
  } else if (m > 0) {
    std::snprintf(buf, sizeof buf, "%llum %llus", static_cast<unsigned long long>(m),
                  static_cast<unsigned long long>(s));
  } else {
    std::snprintf(buf, sizeof buf, "%llus", static_cast<unsigned long long>(s));
  }
  return buf;
}

std::string status_page(const nlohmann::json& s, std::int64_t now_ms) {
  std::string h;
  h.reserve(16384);
  h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
       "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
       "<noscript><meta http-equiv=\"refresh\" content=\"5\"></noscript><title>sluice status</title><style>";
  h += kStyle;
  const double uptime = s["uptime_seconds"].get<double>();
  h += "</style></head><body>\n<h1>sluice " + text(s["version"]) + "</h1>\n";
  h += "<div class=\"meta\">up <span id=\"uptime\" title=\"" + text(s["uptime_seconds"]) + " s\">" +
       human_duration(uptime) + "</span> &middot; configuration generation " + text(s["config"]["generation"]) +
       " from <code>" + text(s["config"]["file"]) + "</code> &middot; " + text(s["connections"]) +
       " open connection(s)</div>\n";
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
  h += "<div id=\"msg\" role=\"status\"></div>\n";

  h += "<h2>Listeners</h2><div class=\"wrap\">" + table_head(kListenerColumns);
  h.insert(h.rfind("<table") + 6, " id=\"listeners\"");
  h += "<tbody>\n";
  for (const auto& l : s["listeners"]) h += listener_rows(l);
  h += "</tbody></table></div>\n";

  const std::int64_t started = s["started_at_ms"].get<std::int64_t>();
  for (const auto& u : s["upstreams"]) {
    const std::string name = u["name"].get<std::string>();
    h += "<h2>Upstream " + html_escape(name) + " <small>(" + text(u["balance"]) + ")</small></h2>";
    if (const auto q = u.find("queue"); q != u.end()) {
      const auto waits = (*q)["waits"].get<std::uint64_t>();
      const double mean = waits > 0 ? (*q)["wait_seconds_sum"].get<double>() / static_cast<double>(waits) : 0.0;
      char times[96];
      std::snprintf(times, sizeof times, "longest wait now %.2f s; mean wait %.3f s",
                    (*q)["oldest_wait_seconds"].get<double>(), mean);
      h += "<div class=\"meta\" data-queue=\"" + html_escape(name) + "\">queue: " + text((*q)["length"]) +
           " waiting of " + text((*q)["max"]) + " at most; " + times + "; " + text((*q)["queued"]) +
           " queued, " + text((*q)["timeouts"]) + " timed out, " + text((*q)["refused"]) + " refused</div>";
    }
    h += "<div class=\"wrap\">";
    std::string table = table_head(kServerColumns);
    table.insert(6, " class=\"upstream\" data-upstream=\"" + html_escape(name) + "\"");
    h += table + "<tbody>\n";
    for (const auto& sv : u["servers"]) h += server_row(sv, now_ms, started, name);
    h += "</tbody></table></div>\n";
  }
  h += "<script>";
  h += kScript;
  h += "</script>\n</body></html>\n";
  return h;
}

}  // namespace sluice::admin
