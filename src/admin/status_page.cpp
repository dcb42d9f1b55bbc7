// The status page (GET /): one HTML document with inline CSS and a small
// inline script, no external asset, rendered from /status's JSON document so
// the two never disagree. Everything from the file or from peers is escaped.
//
// HAProxy's stats page is the model: per server its state and how long it
// has been in it, the last check, current/peak/limit sessions, weights,
// failures and downtime, and per upstream a summary row. Actions (drain,
// disable, enable, weight; close for a removed server's sessions) are
// buttons that ask for a confirmation, then call the same API a script
// would, from the page's own origin: the browser sends whatever
// credentials it loaded the page with.
//
// It fits a laptop (1366 px): text wraps instead of being cut, and what
// belongs together shares a cell (a state and how long; a reason and the
// last check; a weight and the effective one; an address and where it came
// from), so no table is wider than the window. On a phone each table
// scrolls sideways in its own box.
#include <cstdio>
#include <map>
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

// A string member, or "" when absent or not a string (the page takes any
// status document, older or newer).
std::string str(const nlohmann::json& obj, const char* key) {
  const auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// "1.2 MiB" style, for byte counts.
std::string bytes(std::uint64_t n) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  // From 1000 on, the next unit: "1.0 MiB" rather than "1023.9 KiB", so
  // that the column stays narrow.
  while (v >= 1000.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, kUnits[u]);
  return buf;
}

// A count as a narrow column can hold it: exact below 10 000, else "12.3k",
// "456k", "7.8M", "1.2G" (the exact number goes in the cell's title).
std::string short_count(std::uint64_t n) {
  if (n < 10000) return std::to_string(n);
  static constexpr const char* kSuffix[] = {"k", "M", "G", "T"};
  double v = static_cast<double>(n) / 1000.0;
  int u = 0;
  while (v >= 999.95 && u < 3) {
    v /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 99.95 ? "%.1f%s" : "%.0f%s", v, kSuffix[u]);
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

// "7", "0.5", "12.25": a weight without trailing zeros.
std::string weight_text(double w) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", w);
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}


std::string td(const std::string& content, const char* cls = nullptr, const std::string& title = "") {
  std::string out = "<td";
  if (cls != nullptr) out += std::string(" class=\"") + cls + "\"";
  if (!title.empty()) out += " title=\"" + title + "\"";
  out += ">" + content + "</td>";
  return out;
}

// A count's cell (right-aligned, shortened when large; see short_count).
std::string num(std::uint64_t n) {
  const std::string shown = short_count(n);
  return td(shown, "n", shown.size() == std::to_string(n).size() ? "" : std::to_string(n));
}
std::string num(const nlohmann::json& v) { return v.is_number_unsigned() ? num(v.get<std::uint64_t>()) : td(text(v), "n"); }

// A limit's cell: 0 means none.
std::string limit(const nlohmann::json& v) { return v.get<std::uint64_t>() == 0 ? td("&ndash;", "n") : num(v); }

// The role a role check saw, in words: "primary", "replica, 0 s behind".
std::string role_text(const nlohmann::json& sv) {
  const std::string role = str(sv, "role");
  if (role.empty()) return "";
  std::string out = html_escape(role);
  if (const auto lag = sv.find("lag_seconds"); lag != sv.end() && lag->is_number()) {
    const double l = lag->get<double>();
    char buf[48];
    std::snprintf(buf, sizeof buf, l < 10 && l != static_cast<double>(static_cast<long>(l)) ? ", %.1f s behind"
                                                                                            : ", %.0f s behind",
                  l);
    out += buf;
  }
  return out;
}

// Where a server came from: "file", "DNS db.internal:5432" (the name and the
// port it is asked on), "sentinel mymaster".
std::string origin_text(const nlohmann::json& sv) {
  const std::string from = str(sv, "from");
  if (from.empty()) return "file";
  if (from.rfind("sentinel ", 0) == 0) return html_escape(from);
  const std::string addr = str(sv, "address");
  const std::size_t colon = addr.rfind(':');
  return "DNS " + html_escape(from) + (colon == std::string::npos ? "" : html_escape(addr.substr(colon)));
}

// Column widths are CSS classes, so that a wide window can give the actions
// room on one line; the two columns without a width (address, reason)
// share what is left. With `table-layout: fixed` every upstream's table has
// the same widths and they line up one under the other.
struct Column {
  const char* head;
  const char* title;  // the header's tooltip
  const char* cls;    // the <col>'s class (its width), or "" for a share of the rest
};
constexpr Column kServerColumns[] = {
    {"server", "address, with where it came from: the file, a DNS name and port, a sentinel", "c-srv"},
    {"state", "up, standby, down, fenced, drained or disabled (or any other state), for how long, and the role a "
              "role check saw",
     "c-state"},
    {"reason", "why the server is in this state; below it the last active check (result, type, duration, how "
               "long ago; its own words on hover)", ""},
    {"wt", "weight (a runtime override, else the file's); below it the effective weight while slow start lowers it",
     "c-wt"},
    {"cur", "sessions now", "c-n"},
    {"peak", "most sessions at once since start", "c-n"},
    {"max", "max_conns", "c-n"},
    {"sess/s", "sessions per second over the last 10 s", "c-rate"},
    {"total", "times the server was chosen", "c-tot"},
    {"fail", "failed connects (the server's fault)", "c-f"},
    {"chk fail", "failed active checks", "c-f"},
    {"dn", "times the server went down", "c-dn"},
    {"downtime", "total time down (health, not drains)", "c-dur"},
    {"in", "bytes client to server (live sessions' too, every few seconds)", "c-b"},
    {"out", "bytes server to client (live sessions' too, every few seconds)", "c-b"},
    {"actions", "", "c-act"},
};

constexpr Column kListenerColumns[] = {
    {"listener", "name, then its SNI routes", ""},
    {"address", "where it listens", "l-addr"},
    {"upstream", "where its sessions go (red: that upstream has no server available)", "l-up"},
    {"cur", "client connections now", "c-n"},
    {"peak", "most client connections at once since start", "c-n"},
    {"max", "max_connections (this listener)", "l-max"},
    {"accepted", "client connections accepted (routes: sessions routed)", "l-acc"},
    {"conn/s", "connections per second over the last 10 s", "c-rate"},
    {"in", "bytes client to server", "c-b"},
    {"out", "bytes server to client", "c-b"},
    {"closed by cause", "", ""},
};

template <std::size_t N>
std::string table_head(const Column (&cols)[N], const std::string& attributes) {
  std::string h = "<table" + attributes + "><colgroup>";
  for (const Column& c : cols) h += *c.cls != '\0' ? std::string("<col class=\"") + c.cls + "\">" : "<col>";
  h += "</colgroup><thead><tr>";
  for (const Column& c : cols) {
    h += "<th";
    if (*c.title != '\0') h += std::string(" title=\"") + c.title + "\"";
    h += std::string(">") + c.head + "</th>";
  }
  return h + "</tr></thead>";
}

constexpr const char* kStyle = R"(
body{font:14px/1.4 system-ui,sans-serif;margin:0;padding:12px;background:#f6f7f9;color:#1d232b}
h1{font-size:20px;margin:0 0 4px}h1 .host{font-weight:400;color:#445}
h2{font-size:16px;margin:18px 0 6px}h2 small{font-weight:400;color:#566}
.meta{color:#566;margin-bottom:6px;overflow-wrap:anywhere}.meta b{color:#1d232b;font-weight:600}
.bad{color:#b00020}.ok{color:#176b2c}.tools{margin-top:4px}.tools label{cursor:pointer}.tools a{color:#1a56a8}
#msg{overflow-wrap:anywhere}#msg:empty{display:none}
.wrap{overflow-x:auto;background:#fff;border:1px solid #d8dde3;border-radius:6px}
table{border-collapse:collapse;width:100%;min-width:980px;table-layout:fixed;font-size:13px}
table.upstream{min-width:1220px}
th,td{padding:4px 5px;border-bottom:1px solid #e6e9ed;text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{background:#eef1f4;font-weight:600;font-size:12px;cursor:help;vertical-align:bottom;overflow-wrap:normal}
td.n{text-align:right;font-variant-numeric:tabular-nums}th:nth-child(n+4){text-align:right}
table.upstream th:last-child,#listeners th:last-child{text-align:left}
col.c-state{width:116px}col.c-wt{width:48px}col.c-n{width:46px}col.c-rate{width:54px}col.c-tot{width:58px}
col.c-f{width:46px}col.c-dn{width:34px}col.c-dur{width:78px}col.c-b{width:80px}col.c-act{width:150px}
col.c-srv{width:10%}col.l-addr{width:150px}col.l-up{width:170px}col.l-max{width:60px}col.l-acc{width:76px}
@media (min-width:1700px){col.c-act{width:196px}col.c-srv{width:14%}col.l-up{width:250px}}
.sub{font-size:12px;color:#566}.tag{font-size:11px;border:1px solid #99a;border-radius:3px;padding:0 3px;
margin-left:4px;color:#445;white-space:nowrap}
.badge{display:inline-block;padding:0 6px;border-radius:9px;background:#dedede;font-weight:600;font-size:12px}
tr.state-up .badge{background:#d7f5dd;color:#14521f}tr.state-down .badge{background:#ffd0d0;color:#8a0016}
tr.state-drained .badge{background:#fff0b8;color:#6b4e00}tr.state-standby .badge{background:#e6e8eb;color:#4a525c}
tr.state-fenced .badge{background:#e9d7ff;color:#4b1f7a}tr.state-retired .badge{background:#dde7ef;color:#2d4a5e}
tr.state-down{background:#fff5f5}tr.state-fenced{background:#faf5ff}tr.retired{background:#f5f8fa}
tr.route td{color:#445;background:#fafbfc}tr.route td:first-child{padding-left:22px}
tr.no-server,tr.no-server td{background:#ffe3e3}tr.no-server td.up-cell{color:#8a0016;font-weight:600}
.warn{color:#8a0016;font-weight:600}
tfoot td{background:#f1f3f6;border-top:2px solid #d8dde3;font-weight:600}tfoot .sub{font-weight:400}
.chk-pass{color:#176b2c;font-weight:600}.chk-fail{color:#b00020;font-weight:600}.chk-local_error{color:#8a5a00}
button{font:inherit;font-size:12px;padding:0 5px;margin:0 3px 2px 0;border:1px solid #8a94a0;border-radius:4px;
background:#fff;cursor:pointer}button:hover{background:#eef1f4}button:disabled{opacity:.5;cursor:wait}
body.hide-down tr.state-down{display:none}
)";

// The actions: confirm, call the API with the page's own credentials (a
// browser resends HTTP Basic on its own; a Bearer header set for the whole
// origin goes along too), then show the new state. The page reloads every
// 5 s, but never under an open dialog or a request in flight. "hide down"
// is remembered by the browser (localStorage) across those reloads.
constexpr const char* kScript = R"JS(
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
  var hide = document.getElementById("hide-down");
  function hiding() { document.body.classList.toggle("hide-down", hide.checked); }
  try { hide.checked = localStorage.getItem("sluice-hide-down") === "1"; } catch (e) {}
  hide.addEventListener("change", function () {
    try { localStorage.setItem("sluice-hide-down", hide.checked ? "1" : "0"); } catch (e) {}
    hiding();
  });
  hiding();
  document.addEventListener("click", function (e) {
    var b = e.target.closest ? e.target.closest("button[data-action]") : null;
    if (!b) return;
    var tr = b.closest("tr"), up = tr.closest("table").getAttribute("data-upstream");
    var retired = tr.hasAttribute("data-retired");
    var srv = tr.getAttribute(retired ? "data-retired" : "data-server"), act = b.getAttribute("data-action");
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
    fetch("upstreams/" + encodeURIComponent(up) + (retired ? "/retired/" : "/servers/") + encodeURIComponent(srv) +
          "/" + act,
          {method: method, body: body, credentials: "same-origin", cache: "no-store",
           headers: {"Content-Type": "application/json"}})
      .then(function (r) {
        return r.json().then(function (j) {
          if (!r.ok) throw new Error(j.error || ("HTTP " + r.status));
          say(what + ": done" + (j.state ? ", now " + j.state : "") +
              (j.closing !== undefined ? ", closing " + j.closing + " session(s)" : ""), false);
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
)JS";

std::string button(const std::string& action, const std::string& label, const std::string& confirm) {
  return "<button type=\"button\" data-action=\"" + action + "\" data-confirm=\"" + html_escape(confirm) + "\">" +
         label + "</button>";
}

std::string server_row(const nlohmann::json& sv, std::int64_t now_ms, std::int64_t started_ms,
                       const std::string& upstream) {
  const std::string state = sv["state"].get<std::string>();
  const std::string addr = sv["address"].get<std::string>();
  const std::int64_t since = sv["since_ms"].get<std::int64_t>();
  const double in_state = static_cast<double>(now_ms - (since != 0 ? since : started_ms)) / 1000.0;
  const bool backup = sv["backup"].get<bool>();

  std::string check;
  if (const auto& c = sv["last_check"]; c.is_object()) {
    const std::string result = c["result"].get<std::string>();
    const double ago = static_cast<double>(now_ms - c["at_ms"].get<std::int64_t>()) / 1000.0;
    check = "<div class=\"sub chk\" title=\"" + text(c["reason"]) + "\"><span class=\"chk-" + html_escape(result) +
            "\">" + html_escape(result) + "</span> " + text(c["type"]) + " " +
            short_duration(c["seconds"].get<double>()) + ", " + human_duration(ago) + " ago</div>";
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

  std::string where = "<div class=\"sub from\">" + origin_text(sv) + "</div>";
  std::string state_cell = "<span class=\"badge\">" + html_escape(state) + "</span> <span class=\"for\">" +
                           human_duration(in_state) + "</span>";
  if (const std::string role = role_text(sv); !role.empty()) state_cell += "<div class=\"sub role\">" + role + "</div>";

  const double effective = sv["effective_weight"].get<double>();
  std::string weight = text(sv["weight"]);
  if (effective != sv["weight"].get<double>()) {
    weight += "<div class=\"sub eff\" title=\"effective weight (slow start)\">" + weight_text(effective) + "</div>";
  }

  std::string h = "<tr class=\"state-" + html_escape(state) + "\" data-server=\"" + html_escape(addr) +
                  "\" data-weight=\"" + text(sv["weight"]) + "\" data-admin=\"" + html_escape(admin) + "\">";
  const std::string tag = backup ? "<span class=\"tag\">backup</span>" : "";
  h += td("<span class=\"addr\">" + html_escape(addr) + "</span>" + tag + where, "srv");
  h += td(state_cell, "s");
  h += td("<span class=\"reason\">" + text(sv["reason"]) + "</span>" + check, "why");
  h += td(weight, "n");
  h += num(sv["active"]);
  h += num(sv["peak_active"]);
  h += limit(sv["max_conns"]);
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

// A server a reload or DNS removed, whose sessions go on.
std::string retired_row(const nlohmann::json& r, const std::string& upstream) {
  const std::string addr = r["address"].get<std::string>();
  const std::uint64_t n = r["sessions"].get<std::uint64_t>();
  std::string h = "<tr class=\"state-retired retired\" data-retired=\"" + html_escape(addr) + "\">";
  h += td("<span class=\"addr\">" + html_escape(addr) + "</span><span class=\"tag\">retired</span>", "srv");
  h += td("<span class=\"badge\">retired</span> <span class=\"for\">" +
              human_duration(r["age_seconds"].get<double>()) + "</span>",
          "s", "removed this long ago");
  h += td("removed by a reload or DNS; its " + std::to_string(n) +
              " live session(s) go on until they end or its drain_timeout",
          "why");
  h += td("&ndash;", "n") + num(r["sessions"]);
  for (int i = 0; i < 8; ++i) h += td("&ndash;", "n");
  h += td(bytes(r["bytes_in"]), "n") + td(bytes(r["bytes_out"]), "n");
  h += td(button("close", "close",
                 "Close the " + std::to_string(n) + " live session(s) of removed server " + addr + " in upstream " +
                     upstream + "?"),
          "act");
  return h + "</tr>\n";
}

// The upstream's line under its servers, as HAProxy's BACKEND row: how many
// servers are in each state, how many can take a session, and the totals.
std::string summary_row(const nlohmann::json& u) {
  const auto& servers = u["servers"];
  std::map<std::string, int> states;
  for (const auto& sv : servers) ++states[sv["state"].get<std::string>()];
  std::string count;
  // Up first, then the rest by name.
  if (states.count("up")) count = std::to_string(states["up"]) + " up";
  for (const auto& [st, n] : states) {
    if (st == "up") continue;
    count += (count.empty() ? "" : ", ") + std::to_string(n) + " " + html_escape(st);
  }
  count += (count.empty() ? "no server" : " of " + std::to_string(servers.size()));
  const std::size_t retired = u.contains("retired") ? u["retired"].size() : 0;
  if (retired > 0) count += "; " + std::to_string(retired) + " retired";

  const std::uint64_t available = u.value("servers_available", std::uint64_t{0});
  const std::string state = std::string("<span class=\"badge ") + (available > 0 ? "ok" : "warn") + "\">" +
                           std::to_string(available) + " available</span>";
  std::string notes = html_escape(str(u, "balance"));
  if (const auto q = u.find("queue"); q != u.end()) {
    notes += " &middot; queue " + text((*q)["length"]) + " of " + text((*q)["max"]);
  }
  if (u.contains("fallback")) {
    notes += " &middot; fallback &rarr; " + text(u["fallback"]) + ": " + text(u["fallback_sessions"]) + " taken";
  }
  const std::optional<double> rate_sum = servers_rate(servers);
  std::uint64_t active = servers_sum(servers, "active");
  std::uint64_t in = servers_sum(servers, "bytes_in");
  std::uint64_t out = servers_sum(servers, "bytes_out");
  if (u.contains("retired")) {
    for (const auto& r : u["retired"]) {
      active += r["sessions"].get<std::uint64_t>();
      in += r["bytes_in"].get<std::uint64_t>();
      out += r["bytes_out"].get<std::uint64_t>();
    }
  }
  std::string h = "<tr class=\"summary\" data-summary=\"" + text(u["name"]) + "\">";
  h += td("total <div class=\"sub servers\">" + count + "</div>", "srv");
  h += td(state, "s");
  h += td("<span class=\"sub notes\">" + notes + "</span>", "why");
  h += td("", "n") + num(active) + td("", "n") + td("", "n");
  h += td(rate_sum ? rate(nlohmann::json(*rate_sum)) : "&ndash;", "n");
  for (const char* key : {"total_sessions", "failures", "check_failures", "down_count"}) {
    h += num(servers_sum(servers, key));
  }
  h += td("", "n") + td(bytes(in), "n") + td(bytes(out), "n") + td("");
  return h + "</tr>\n";
}

// Upstream name -> whether it has a server available, and its fallback.
struct UpstreamReach {
  bool available = true;
  std::string fallback;
};

std::string no_server_note(const UpstreamReach& r) {
  return "<div class=\"sub warn\">no server available" +
         (r.fallback.empty() ? std::string() : "; fallback " + html_escape(r.fallback) + " takes its sessions") +
         "</div>";
}

std::string listener_rows(const nlohmann::json& l, const std::map<std::string, UpstreamReach>& reach) {
  const std::string name = l["name"].get<std::string>();
  const auto target_of = [&reach](const std::string& upstream) -> const UpstreamReach* {
    const auto it = reach.find(upstream);
    return it != reach.end() && !it->second.available ? &it->second : nullptr;
  };
  std::string closed;
  for (const auto& [cause, n] : l["closed"].items()) {
    if (!closed.empty()) closed += ", ";
    closed += html_escape(cause) + " " + text(n);
  }
  // A preread listener's sessions go to its default upstream when no route matches.
  const bool preread = l.contains("default_route");
  const std::string target = preread ? l["default_route"]["upstream"].get<std::string>() : str(l, "upstream");
  const UpstreamReach* none = target.empty() ? nullptr : target_of(target);
  std::string h = std::string("<tr") + (none != nullptr ? " class=\"no-server\"" : "") + " data-listener=\"" +
                  html_escape(name) + "\">";
  h += td(html_escape(name));
  h += td(text(l["address"]));
  h += td((preread && !target.empty() ? "default " : "") + html_escape(target) +
              (none != nullptr ? no_server_note(*none) : ""),
          "up-cell");
  h += num(l["active"]);
  h += num(l["peak_active"]);
  h += limit(l["max_connections"]);
  h += num(l["accepted"]);
  h += td(rate(l.value("conn_per_s", nlohmann::json())), "n");
  h += td(bytes(l["bytes_in"]), "n");
  h += td(bytes(l["bytes_out"]), "n");
  h += td(closed);
  h += "</tr>\n";
  if (!preread) return h;
  const auto route_row = [&](const nlohmann::json& r, const std::string& label, const std::string& key) {
    const std::string up = r["upstream"].get<std::string>();
    const UpstreamReach* down = up.empty() ? nullptr : target_of(up);
    std::string row = std::string("<tr class=\"route") + (down != nullptr ? " no-server" : "") +
                      "\" data-listener=\"" + html_escape(name) + "\" data-route=\"" + key + "\">";
    row += td("&rarr; " + label) + td("");
    row += td(html_escape(up) + (down != nullptr ? no_server_note(*down) : ""), "up-cell");
    row += td("") + td("") + td("");
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

// One upstream's table: its servers, the retired ones, its summary.
std::string upstream_table(const nlohmann::json& u, std::int64_t now_ms, std::int64_t started) {
  const std::string name = u["name"].get<std::string>();
  std::string h = table_head(kServerColumns, " class=\"upstream\" data-upstream=\"" + html_escape(name) + "\"");
  h += "<tbody>\n";
  // A removed upstream has only retired servers (and no summary).
  const bool configured = u.contains("servers");
  if (configured) {
    for (const auto& sv : u["servers"]) h += server_row(sv, now_ms, started, name);
  }
  if (u.contains("retired")) {
    for (const auto& r : u["retired"]) h += retired_row(r, name);
  }
  h += "</tbody>";
  if (configured) h += "<tfoot>" + summary_row(u) + "</tfoot>";
  return h + "</table>";
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
  h.reserve(32768);
  h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
       "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
       "<noscript><meta http-equiv=\"refresh\" content=\"5\"></noscript><title>sluice status";
  const std::string host = str(s, "hostname");
  if (!host.empty()) h += " &middot; " + html_escape(host);
  h += "</title><style>";
  h += kStyle;
  const double uptime = s["uptime_seconds"].get<double>();
  h += "</style></head><body>\n<h1>sluice " + text(s["version"]);
  if (!host.empty()) h += " <span class=\"host\">on <span id=\"hostname\">" + html_escape(host) + "</span></span>";
  h += "</h1>\n<div class=\"meta\" id=\"header\">";
  if (s.contains("pid")) h += "pid <b id=\"pid\">" + text(s["pid"]) + "</b> &middot; ";
  h += "up <b id=\"uptime\" title=\"" + text(s["uptime_seconds"]) + " s\">" + human_duration(uptime) +
       "</b> &middot; <b id=\"connections\">" + text(s["connections"]) + "</b> open connection(s)";
  if (s.contains("max_connections")) {
    h += " of max_connections <b id=\"max-connections\">" + text(s["max_connections"]) + "</b>";
  }
  h += " &middot; configuration generation " + text(s["config"]["generation"]) + " from <code>" +
       text(s["config"]["file"]) + "</code></div>\n";
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
  std::map<std::string, UpstreamReach> reach;
  std::string outages;
  for (const auto& u : s["upstreams"]) {
    UpstreamReach& r = reach[u["name"].get<std::string>()];
    r.available = u.value("servers_available", std::uint64_t{1}) > 0;
    r.fallback = str(u, "fallback");
    if (!r.available) outages += (outages.empty() ? "" : ", ") + html_escape(u["name"].get<std::string>());
  }
  if (!outages.empty()) {
    h += "<div class=\"meta bad\" id=\"outages\">no server available in upstream(s): " + outages + "</div>\n";
  }
  h += "<div class=\"meta tools\"><label><input type=\"checkbox\" id=\"hide-down\"> hide down servers</label>"
       " &middot; <a href=\"status.csv\" download=\"sluice-status.csv\" id=\"csv\">CSV</a>"
       " &middot; refreshes every 5 s</div>\n";
  h += "<div id=\"msg\" role=\"status\"></div>\n";

  h += "<h2>Listeners</h2><div class=\"wrap\">" + table_head(kListenerColumns, " id=\"listeners\"");
  h += "<tbody>\n";
  for (const auto& l : s["listeners"]) h += listener_rows(l, reach);
  h += "</tbody></table></div>\n";

  const std::int64_t started = s["started_at_ms"].get<std::int64_t>();
  for (const auto& u : s["upstreams"]) {
    const std::string name = u["name"].get<std::string>();
    const bool none = !reach[name].available;
    h += "<h2>Upstream " + html_escape(name) + " <small>" + text(u["balance"]) + "</small>";
    if (none) h += " <span class=\"warn\">no server available</span>";
    h += "</h2>";
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
    h += "<div class=\"wrap\">" + upstream_table(u, now_ms, started) + "</div>\n";
  }
  // Upstreams a reload removed whose servers still have sessions.
  if (const auto removed = s.find("removed_upstreams"); removed != s.end()) {
    for (const auto& u : *removed) {
      h += "<h2>Upstream " + text(u["name"]) + " <small>removed from the configuration</small></h2>";
      h += "<div class=\"wrap\">" + upstream_table(u, now_ms, started) + "</div>\n";
    }
  }
  h += "<script>";
  h += kScript;
  h += "</script>\n</body></html>\n";
  return h;
}

}  // namespace sluice::admin
