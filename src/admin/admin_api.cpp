#include "admin/admin_api.hpp"

#include <charconv>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "config/values.hpp"
#include "log/escape.hpp"
#include "sluice/address.hpp"
#include "log/rate_limited_warning.hpp"

namespace sluice::admin {

namespace {

Response json_response(int status, const nlohmann::json& body) {
  Response r;
  r.status = status;
  // Replace, not throw, on invalid UTF-8 (a configuration error may quote the file).
  r.body = body.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  return r;
}

// Client-controlled text (a path) made safe for a log line.
std::string escape_text(std::string_view v) {
  std::string out;
  append_text_escaped(out, v);
  return out;
}

Response error(int status, std::string_view message) {
  return json_response(status, {{"error", std::string(message)}});
}

Response method_not_allowed(std::string_view allow) {
  Response r = error(405, "method not allowed; use " + std::string(allow));
  r.headers.emplace_back("Allow", std::string(allow));
  return r;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "%5B%3A%3A1%5D%3A80" -> "[::1]:80". Malformed escapes stay as they are.
std::string percent_decode(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      const int hi = hex_value(s[i + 1]);
      const int lo = hex_value(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> parts;
  std::size_t i = 0;
  while (i < path.size()) {
    if (path[i] == '/') {
      ++i;
      continue;
    }
    const std::size_t j = path.find('/', i);
    const std::size_t end = j == std::string_view::npos ? path.size() : j;
    parts.push_back(path.substr(i, end - i));
    i = end;
  }
  return parts;
}

// The body of PUT .../weight: `5` or {"weight": 5}.
std::optional<long> parse_weight(std::string_view body) {
  try {
    const nlohmann::json j = nlohmann::json::parse(body);
    const nlohmann::json& v = j.is_object() && j.contains("weight") ? j["weight"] : j;
    if (v.is_number_integer()) return v.get<long>();
  } catch (const nlohmann::json::exception&) {
  }
  return std::nullopt;
}

// ASCII case-insensitive equality with `lower` (already lower case).
bool same_ascii_lower(std::string_view s, std::string_view lower) {
  if (s.size() != lower.size()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i] >= 'A' && s[i] <= 'Z' ? static_cast<char>(s[i] - 'A' + 'a') : s[i];
    if (c != lower[i]) return false;
  }
  return true;
}

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 (RFC 4648), padding optional. nullopt when malformed.
std::optional<std::string> base64_decode(std::string_view in) {
  while (!in.empty() && in.back() == '=') in.remove_suffix(1);
  if (in.size() % 4 == 1) return std::nullopt;
  std::string out;
  std::uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    const int v = base64_value(c);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  return out;
}

RateLimitedWarning g_unauthorized;
RateLimitedWarning g_no_credentials;
RateLimitedWarning g_foreign_host;

// Whether `text` names `address`: as the file writes it, or any text that
// parses to the same address (`parsed`, when it parses).
bool names_address(const Endpoint& address, const std::string& text, const std::optional<Endpoint>& parsed) {
  if (address.text == text) return true;
  return parsed && address.port == parsed->port && same_ip(address.addr, parsed->addr);
}

std::optional<Endpoint> parse_server_text(const std::string& text) {
  std::string perr;
  return parse_address(text, false, perr);
}

// The index in `up` of the server `text` names: by the address as the file
// writes it, or by any text that parses to the same address; -1 when none.
long find_server(const Upstream& up, const std::string& text) {
  for (std::size_t i = 0; i < up.size(); ++i) {
    if (up.server(i).address.text == text) return static_cast<long>(i);
  }
  const std::optional<Endpoint> ep = parse_server_text(text);
  for (std::size_t i = 0; i < up.size(); ++i) {
    if (names_address(up.server(i).address, text, ep)) return static_cast<long>(i);
  }
  return -1;
}

// The retired server of `upstream` that `text` names, if it has live sessions.
std::optional<RetiredGroup> find_retired(Registry& registry, const std::string& upstream, const std::string& text) {
  const std::optional<Endpoint> ep = parse_server_text(text);
  for (RetiredGroup& g : retired_servers(registry)) {
    if (g.upstream == upstream && names_address(g.states.front()->address, text, ep)) return std::move(g);
  }
  return std::nullopt;
}

// A browser that sends a request on behalf of another site says so in
// `Origin`. A change asked for by a page that is not ours is refused: the
// browser may be sending the operator's credentials along (HTTP Basic is
// resent on its own), and a form on any site can POST here. Scripts send
// no Origin and are not affected.
bool foreign_origin(const Request& req) {
  auto origin = req.headers.find("origin");
  if (origin == req.headers.end()) return false;
  auto host = req.headers.find("host");
  if (host == req.headers.end()) return true;
  return origin->second != "http://" + host->second && origin->second != "https://" + host->second;
}

bool changes_something(const Request& req) { return req.method != "GET" && req.method != "HEAD"; }

}  // namespace

std::string listener_rate_key(std::string_view listener) { return "listener\n" + std::string(listener); }

std::string server_rate_key(std::string_view upstream, std::string_view server) {
  return "server\n" + std::string(upstream) + "\n" + std::string(server);
}

void RateWindow::add(TimePoint at, std::map<std::string, std::uint64_t> counts) {
  samples_.push_back({at, std::move(counts)});
  // kWindow seconds between the oldest and the newest sample.
  while (samples_.size() > static_cast<std::size_t>(kWindow) + 1) samples_.pop_front();
}

std::optional<double> RateWindow::rate(const std::string& key) const {
  if (samples_.empty()) return std::nullopt;
  const Sample& last = samples_.back();
  auto now_it = last.counts.find(key);
  if (now_it == last.counts.end()) return std::nullopt;
  for (const Sample& first : samples_) {
    auto then_it = first.counts.find(key);
    if (then_it == first.counts.end()) continue;
    const double dt = std::chrono::duration<double>(last.at - first.at).count();
    // A reload may have replaced the counter's owner: no rate across that.
    if (dt < 0.999 || now_it->second < then_it->second) return std::nullopt;
    return static_cast<double>(now_it->second - then_it->second) / dt;
  }
  return std::nullopt;
}

AdminApi::AdminApi(AdminHooks hooks) : hooks_(std::move(hooks)) {}

std::optional<Credentials> presented_credentials(std::string_view value) {
  auto blank = [](char c) { return c == ' ' || c == '\t'; };
  while (!value.empty() && blank(value.back())) value.remove_suffix(1);
  const std::size_t sp = value.find_first_of(" \t");
  if (sp == std::string_view::npos) return std::nullopt;
  const std::string_view scheme = value.substr(0, sp);
  std::string_view credentials = value.substr(sp);
  while (!credentials.empty() && blank(credentials.front())) credentials.remove_prefix(1);
  if (credentials.empty()) return std::nullopt;
  if (same_ascii_lower(scheme, "bearer")) return Credentials{{}, std::string(credentials)};
  if (!same_ascii_lower(scheme, "basic")) return std::nullopt;
  const std::optional<std::string> user_pass = base64_decode(credentials);
  if (!user_pass) return std::nullopt;
  // RFC 7617: the user name cannot hold a colon; the password may.
  const std::size_t colon = user_pass->find(':');
  if (colon == std::string::npos) return std::nullopt;
  return Credentials{user_pass->substr(0, colon), user_pass->substr(colon + 1)};
}

std::optional<std::string> presented_token(std::string_view value) {
  std::optional<Credentials> c = presented_credentials(value);
  if (!c) return std::nullopt;
  return std::move(c->token);
}

std::string requester(const Request& req) {
  auto it = req.headers.find("authorization");
  if (it == req.headers.end()) return req.peer;
  const std::optional<Credentials> c = presented_credentials(it->second);
  if (!c || c->user.empty()) return req.peer;
  return req.peer + " as user \"" + escape_text(c->user) + "\"";
}

std::string put_config_hint(std::string_view body) {
  if (body.empty() || body.find('\n') != std::string_view::npos) return {};
  return "the body has no line break: curl -d (--data) drops them; send the file with "
         "curl --data-binary @FILE -X PUT .../config";
}

std::optional<Response> AdminApi::authorize(const Request& req) const {
  if (std::optional<Response> r = authenticate(req)) return r;
  if (!changes_something(req)) return std::nullopt;
  // DNS rebinding: a page whose name now points here sends its own name in
  // both Host and Origin. Only a name that is ours may change anything.
  auto host = req.headers.find("host");
  if (host == req.headers.end() || !host_allowed(host->second, hosts_)) {
    const std::string named =
        host == req.headers.end() ? std::string("no Host") : "Host \"" + escape_text(host->second) + "\"";
    g_foreign_host.warn("admin: refused " + req.method + " " + escape_text(req.path) + " from " + requester(req) +
                        ": " + named + " is not a name of this admin API (a page that points its DNS name here looks "
                        "like this; list the name in [admin] allowed_hosts if it is yours)");
    return error(421, named + " is not a name of this admin API: a change must be sent to its address, to "
                      "localhost, to a literal IP, or to a name listed in [admin] allowed_hosts");
  }
  if (foreign_origin(req)) {
    return error(403, "a request from another site's page is refused (Origin does not match Host)");
  }
  return std::nullopt;
}

std::optional<Response> AdminApi::authenticate(const Request& req) const {
  if (token_.empty()) return std::nullopt;
  // GET /ready needs no token: a front tier's probe (keepalived's curl, a
  // kubelet) learns one bit and should not have to carry the secret, as
  // with HAProxy's monitor-uri. POST /healthcheck/* needs it like any change.
  if (const auto p = split_path(req.path); p.size() == 1 && p[0] == "ready" && !changes_something(req)) {
    return std::nullopt;
  }
  auto it = req.headers.find("authorization");
  if (it != req.headers.end()) {
    const std::optional<std::string> presented = presented_token(it->second);
    if (presented && token_.matches(*presented)) return std::nullopt;
  }
  // The method is one http-parser knows; the path is the client's bytes.
  const std::string what = req.method + " " + escape_text(req.path);
  if (it == req.headers.end()) {
    // What every browser sends first, before it shows its login: routine.
    g_no_credentials.info("admin: a request without credentials from " + req.peer + " (" + what +
                          "): answered 401 (a browser asks for the login next)");
  } else {
    g_unauthorized.warn("admin: unauthorized request from " + requester(req) + " (" + what + ")");
  }
  Response r = error(401, "unauthorized: send Authorization: Bearer TOKEN, or log in with the token as the password");
  // Basic first: a browser then asks for a user name and password (the token);
  // scripts send the Bearer token.
  r.headers.emplace_back("WWW-Authenticate", "Basic realm=\"sluice\"");
  r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"sluice\"");
  return r;
}

Response AdminApi::handle(const Request& req) {
  if (std::optional<Response> refused = authorize(req)) return std::move(*refused);

  const std::vector<std::string_view> parts = split_path(req.path);
  const std::string& m = req.method;
  if (parts.empty()) {
    if (m != "GET" && m != "HEAD") return method_not_allowed("GET");
    return page();
  }
  if (parts.size() == 1 && parts[0] == "status") {
    if (m != "GET" && m != "HEAD") return method_not_allowed("GET");
    return json_response(200, status_with_rates());
  }
  if (parts.size() == 1 && parts[0] == "metrics") {
    if (m != "GET" && m != "HEAD") return method_not_allowed("GET");
    Response r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = metrics_text(*hooks_.snapshot(), hooks_.info(), Clock::now());
    return r;
  }
  if (parts.size() == 1 && parts[0] == "reload") {
    if (m != "POST") return method_not_allowed("POST");
    spdlog::info("admin: POST /reload from {}", requester(req));
    const Outcome o = hooks_.reload();
    if (!o.ok) return json_response(400, {{"ok", false}, {"error", o.message}});
    return json_response(200, {{"ok", true},
                               {"message", o.message},
                               {"generation", hooks_.info().generation},
                               {"restart_required", o.restart_required}});
  }
  if (parts.size() == 1 && parts[0] == "upgrade") {
    if (m != "POST") return method_not_allowed("POST");
    if (!hooks_.upgrade) return json_response(404, {{"ok", false}, {"error", "no upgrade here"}});
    spdlog::info("admin: POST /upgrade from {}", requester(req));
    const Outcome o = hooks_.upgrade();
    // 202: the new process takes over after this answer; the pid_file and
    // GET /status say when it has.
    if (!o.ok) return json_response(409, {{"ok", false}, {"error", o.message}});
    return json_response(202, {{"ok", true}, {"message", o.message}});
  }
  if (parts.size() == 1 && parts[0] == "config") {
    if (m != "PUT") return method_not_allowed("PUT");
    spdlog::info("admin: PUT /config from {}", requester(req));
    const Outcome o = hooks_.put_config(req.body);
    if (!o.ok) {
      nlohmann::json doc = {{"ok", false}, {"error", o.message}};
      if (std::string hint = put_config_hint(req.body); !hint.empty()) doc["hint"] = std::move(hint);
      return json_response(400, doc);
    }
    return json_response(200, {{"ok", true},
                               {"message", o.message},
                               {"generation", hooks_.info().generation},
                               {"restart_required", o.restart_required}});
  }
  // Readiness for a front tier: GET /ready, POST /healthcheck/{fail,ok}.
  if (parts.size() == 1 && parts[0] == "ready") return readiness(req, "");
  if (parts.size() == 2 && parts[0] == "healthcheck") return readiness(req, parts[1]);
  if (parts.size() == 5 && parts[0] == "upstreams" && parts[2] == "servers") {
    return server_action(req, parts[1], parts[3], parts[4]);
  }
  if (parts.size() == 5 && parts[0] == "upstreams" && parts[2] == "retired") {
    return retired_action(req, parts[1], parts[3], parts[4]);
  }
  if (parts.size() == 1 && parts[0] == "status.csv") {
    if (m != "GET" && m != "HEAD") return method_not_allowed("GET");
    Response r;
    r.content_type = "text/csv; charset=utf-8; header=present";
    r.body = status_csv(status_with_rates());
    return r;
  }
  // Reading one upstream or one server: GET /upstreams/U, GET /upstreams/U/servers/ADDR.
  if (parts.size() == 2 && parts[0] == "upstreams") return upstream_get(req, parts[1], {});
  if (parts.size() == 4 && parts[0] == "upstreams" && parts[2] == "servers") {
    return upstream_get(req, parts[1], parts[3]);
  }
  return error(404, "no such endpoint: " + escape_text(req.path));
}

Response AdminApi::server_action(const Request& req, std::string_view upstream_part, std::string_view server_part,
                                 std::string_view action) {
  const bool is_weight = action == "weight";
  if (!is_weight && action != "drain" && action != "disable" && action != "enable") {
    return error(404, "unknown server action \"" + escape_text(std::string(action)) +
                          "\" (drain, disable, enable, weight)");
  }
  if (is_weight ? req.method != "PUT" : req.method != "POST") return method_not_allowed(is_weight ? "PUT" : "POST");

  const std::string upstream = percent_decode(upstream_part);
  const std::string server = percent_decode(server_part);
  std::shared_ptr<const Snapshot> snap = hooks_.snapshot();
  const Upstream* up = snap->find_upstream(upstream);
  if (up == nullptr) return error(404, "no upstream \"" + escape_text(upstream) + "\"");
  const long index = find_server(*up, server);
  if (index < 0) {
    std::string hint;
    if (const std::optional<RetiredGroup> g = find_retired(*snap->registry, upstream, server)) {
      hint = " (it was removed; its " + std::to_string(g->sessions) +
             " live session(s) are retired: POST /upstreams/" + escape_text(upstream) + "/retired/" +
             escape_text(g->address) + "/close closes them)";
    }
    return error(404, "upstream \"" + escape_text(upstream) + "\" has no server " + escape_text(server) + hint);
  }
  const auto i = static_cast<std::size_t>(index);
  std::shared_ptr<ServerState> state = up->member(i).state;
  const std::string who = "upstream \"" + upstream + "\" server " + state->address.text;

  if (is_weight) {
    const std::optional<long> w = parse_weight(req.body);
    if (!w || *w < 1 || *w > 1000) {
      return error(400, "the body must be a weight from 1 to 1000, as `5` or {\"weight\": 5}");
    }
    state->set_weight_override(static_cast<std::uint32_t>(*w), up->member(i).config.weight);
    spdlog::info("admin: {} weight set to {} (the file says {}) by {}", who, *w, up->member(i).config.weight,
                 requester(req));
  } else if (action == "drain") {
    state->set_admin(AdminState::drain);
    spdlog::info("admin: {} draining: no new sessions, {} live one(s) stay (by {})", who,
                 state->active.load(std::memory_order_relaxed), requester(req));
  } else if (action == "disable") {
    state->set_admin(AdminState::disabled);
    spdlog::info("admin: {} disabled: no new sessions, closing {} live one(s) (by {})", who,
                 state->active.load(std::memory_order_relaxed), requester(req));
    hooks_.close_sessions(state, Cause::server_drained);
  } else {
    state->set_admin(AdminState::enabled);
    spdlog::info("admin: {} enabled (by {})", who, requester(req));
  }
  return json_response(200, server_json(*up, i, Clock::now()));
}

// POST /upstreams/U/retired/ADDR/close: the live sessions of a server that
// a reload or DNS removed end now (cause admin), whatever its drain_timeout.
Response AdminApi::retired_action(const Request& req, std::string_view upstream_part, std::string_view server_part,
                                  std::string_view action) {
  if (action != "close") {
    return error(404, "unknown retired server action \"" + escape_text(std::string(action)) + "\" (close)");
  }
  if (req.method != "POST") return method_not_allowed("POST");
  const std::string upstream = percent_decode(upstream_part);
  const std::string server = percent_decode(server_part);
  std::shared_ptr<const Snapshot> snap = hooks_.snapshot();
  const std::optional<RetiredGroup> g = find_retired(*snap->registry, upstream, server);
  if (!g) {
    return error(404, "upstream \"" + escape_text(upstream) + "\" has no retired server " + escape_text(server) +
                          " with live sessions");
  }
  spdlog::info("admin: upstream \"{}\" retired server {}: closing its {} live session(s) (by {})",
               escape_text(upstream), g->address, g->sessions, req.peer);
  for (const auto& state : g->states) hooks_.close_sessions(state, Cause::admin);
  return json_response(200, {{"ok", true}, {"upstream", upstream}, {"address", g->address}, {"closing", g->sessions}});
}

// GET /ready (`action` empty): 200 while sluice takes traffic, 503 with the
// reason while it is being taken out. POST /healthcheck/fail and
// /healthcheck/ok (Envoy's names) set that by hand; neither touches a
// listener or a live session.
Response AdminApi::readiness(const Request& req, std::string_view action) {
  if (action.empty()) {
    if (req.method != "GET" && req.method != "HEAD") return method_not_allowed("GET");
    const ProcessInfo info = hooks_.info();
    if (info.ready) return json_response(200, {{"ready", true}, {"since_ms", info.ready_since_ms}});
    return json_response(503, {{"ready", false},
                               {"since_ms", info.ready_since_ms},
                               {"error", "not ready: " + info.not_ready_reason}});
  }
  if (action != "fail" && action != "ok") {
    return error(404, "unknown healthcheck action \"" + escape_text(std::string(action)) + "\" (fail, ok)");
  }
  if (req.method != "POST") return method_not_allowed("POST");
  const Outcome o = hooks_.set_ready(action == "ok", requester(req));
  const ProcessInfo info = hooks_.info();
  if (!o.ok) return json_response(409, {{"ok", false}, {"ready", info.ready}, {"error", o.message}});
  return json_response(200, {{"ok", true}, {"ready", info.ready}, {"message", o.message}});
}

Response AdminApi::upstream_get(const Request& req, std::string_view upstream_part,
                               std::string_view server_part) {
  if (req.method != "GET" && req.method != "HEAD") return method_not_allowed("GET");
  const std::string upstream = percent_decode(upstream_part);
  std::shared_ptr<const Snapshot> snap = hooks_.snapshot();
  const Upstream* up = snap->find_upstream(upstream);
  if (up == nullptr) return error(404, "no upstream \"" + escape_text(upstream) + "\"");
  const TimePoint now = Clock::now();
  if (server_part.empty()) {
    nlohmann::json doc = upstream_json(*up, now);
    for (auto& sv : doc["servers"]) {
      const std::optional<double> r = rates_.rate(server_rate_key(upstream, sv["address"].get<std::string>()));
      sv["sessions_per_s"] = r ? nlohmann::json(*r) : nlohmann::json(nullptr);
    }
    doc["retired"] = nlohmann::json::array();
    for (const RetiredGroup& g : retired_servers(*snap->registry)) {
      if (g.upstream == upstream) doc["retired"].push_back(retired_json(g, wall_ms()));
    }
    return json_response(200, doc);
  }
  const std::string server = percent_decode(server_part);
  const long index = find_server(*up, server);
  if (index < 0) {
    return error(404, "upstream \"" + escape_text(upstream) + "\" has no server " + escape_text(server));
  }
  nlohmann::json doc = server_json(*up, static_cast<std::size_t>(index), now);
  const std::optional<double> r = rates_.rate(server_rate_key(upstream, doc["address"].get<std::string>()));
  doc["sessions_per_s"] = r ? nlohmann::json(*r) : nlohmann::json(nullptr);
  return json_response(200, doc);
}

void AdminApi::tick(TimePoint now) {
  std::shared_ptr<const Snapshot> snap = hooks_.snapshot();
  if (!snap) return;
  std::map<std::string, std::uint64_t> counts;
  for (const ListenerView& l : snap->listeners) {
    counts[listener_rate_key(l.config->name)] = l.stats->accepted.load(std::memory_order_relaxed);
  }
  for (const auto& [name, up] : snap->upstreams) {
    for (std::size_t i = 0; i < up->size(); ++i) {
      const ServerState& st = up->server(i);
      counts[server_rate_key(name, st.address.text)] = st.total_sessions.load(std::memory_order_relaxed);
    }
  }
  rates_.add(now, std::move(counts));
}

nlohmann::json AdminApi::status_with_rates() {
  nlohmann::json doc = status_json(*hooks_.snapshot(), hooks_.info(), Clock::now(), wall_ms());
  const auto or_null = [](std::optional<double> v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  for (auto& l : doc["listeners"]) l["conn_per_s"] = or_null(rates_.rate(listener_rate_key(l["name"].get<std::string>())));
  for (auto& u : doc["upstreams"]) {
    const std::string name = u["name"].get<std::string>();
    for (auto& sv : u["servers"]) {
      sv["sessions_per_s"] = or_null(rates_.rate(server_rate_key(name, sv["address"].get<std::string>())));
    }
  }
  return doc;
}

Response AdminApi::page() {
  Response r;
  r.content_type = "text/html; charset=utf-8";
  r.body = status_page(status_with_rates(), wall_ms());
  return r;
}

}  // namespace sluice::admin
