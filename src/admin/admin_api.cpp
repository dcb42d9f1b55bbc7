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

// Constant-time comparison, so the answer's timing says nothing about the token.
bool same_token(std::string_view a, std::string_view b) {
  unsigned diff = a.size() == b.size() ? 0U : 1U;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
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

RateLimitedWarning g_unauthorized;

}  // namespace

AdminApi::AdminApi(AdminHooks hooks) : hooks_(std::move(hooks)) {}

Response AdminApi::handle(const Request& req) {
  if (!token_.empty()) {
    auto it = req.headers.find("authorization");
    const std::string_view prefix = "Bearer ";
    const bool ok = it != req.headers.end() && it->second.size() > prefix.size() &&
                    std::string_view(it->second).substr(0, prefix.size()) == prefix &&
                    same_token(std::string_view(it->second).substr(prefix.size()), token_);
    if (!ok) {
      g_unauthorized.warn("admin: unauthorized request from " + req.peer + " (" +
                          escape_text(req.method + " " + req.path) + ")");
      Response r = error(401, "unauthorized: send Authorization: Bearer TOKEN");
      r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"sluice\"");
      return r;
    }
  }

  const std::vector<std::string_view> parts = split_path(req.path);
  const std::string& m = req.method;
  if (parts.empty()) {
    if (m != "GET" && m != "HEAD") return method_not_allowed("GET");
    return page();
  }
  if (parts.size() == 1 && parts[0] == "status") {
    if (m != "GET" && m != "HEAD") return method_not_allowed("GET");
    return json_response(200, status_json(*hooks_.snapshot(), hooks_.info(), Clock::now(), wall_ms()));
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
    const Outcome o = hooks_.reload();
    if (!o.ok) return json_response(400, {{"ok", false}, {"error", o.message}});
    return json_response(200, {{"ok", true},
                               {"message", o.message},
                               {"generation", hooks_.info().generation},
                               {"restart_required", o.restart_required}});
  }
  if (parts.size() == 1 && parts[0] == "config") {
    if (m != "PUT") return method_not_allowed("PUT");
    const Outcome o = hooks_.put_config(req.body);
    if (!o.ok) return json_response(400, {{"ok", false}, {"error", o.message}});
    return json_response(200, {{"ok", true},
                               {"message", o.message},
                               {"generation", hooks_.info().generation},
                               {"restart_required", o.restart_required}});
  }
  if (parts.size() == 5 && parts[0] == "upstreams" && parts[2] == "servers") {
    return server_action(req, parts[1], parts[3], parts[4]);
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
  // By the address as the file writes it, or by any text that parses to the same address.
  long index = -1;
  for (std::size_t i = 0; i < up->size() && index < 0; ++i) {
    if (up->server(i).address.text == server) index = static_cast<long>(i);
  }
  if (index < 0) {
    std::string perr;
    if (auto ep = parse_address(server, false, perr)) {
      for (std::size_t i = 0; i < up->size() && index < 0; ++i) {
        if (up->server(i).address.port == ep->port && same_ip(up->server(i).address.addr, ep->addr)) index = static_cast<long>(i);
      }
    }
  }
  if (index < 0) {
    return error(404, "upstream \"" + escape_text(upstream) + "\" has no server " + escape_text(server));
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
                 req.peer);
  } else if (action == "drain") {
    state->set_admin(AdminState::drain);
    spdlog::info("admin: {} draining: no new sessions, {} live one(s) stay (by {})", who,
                 state->active.load(std::memory_order_relaxed), req.peer);
  } else if (action == "disable") {
    state->set_admin(AdminState::disabled);
    spdlog::info("admin: {} disabled: no new sessions, closing {} live one(s) (by {})", who,
                 state->active.load(std::memory_order_relaxed), req.peer);
    hooks_.close_sessions(state, Cause::server_drained);
  } else {
    state->set_admin(AdminState::enabled);
    spdlog::info("admin: {} enabled (by {})", who, req.peer);
  }
  return json_response(200, server_json(*up, i, Clock::now()));
}

Response AdminApi::page() {
  const nlohmann::json status = status_json(*hooks_.snapshot(), hooks_.info(), Clock::now(), wall_ms());
  const TimePoint now = Clock::now();
  std::map<std::string, double> rates;
  const double dt = std::chrono::duration<double>(now - last_view_).count();
  for (const auto& l : status["listeners"]) {
    const std::string name = l["name"].get<std::string>();
    const std::uint64_t accepted = l["accepted"].get<std::uint64_t>();
    auto it = last_accepted_.find(name);
    if (it != last_accepted_.end() && dt > 0.05 && accepted >= it->second) {
      rates[name] = static_cast<double>(accepted - it->second) / dt;
    }
    last_accepted_[name] = accepted;
  }
  last_view_ = now;
  Response r;
  r.content_type = "text/html; charset=utf-8";
  r.body = status_page(status, rates);
  return r;
}

}  // namespace sluice::admin
