// [upstream.NAME.health] -> HealthConfig. The common keys apply to every
// check type; each type adds its own, and a key of another type is an error
// (so `path = "/primary"` on a tcp check is never silently ignored).
#include "config/health_parser.hpp"

#include <algorithm>
#include <array>
#include <string_view>
#include <vector>

#include "config/quote.hpp"
#include "config/table_reader.hpp"
#include "config/values.hpp"

namespace sluice::config_detail {

namespace {

struct TypeKeys {
  std::string_view name;
  HealthType type;
  std::vector<std::string_view> keys;
};

// all_down is the upstream's (config_parser.cpp reads it); it is allowed here too.
const std::vector<std::string_view> kCommonKeys = {"type",    "interval", "timeout", "rise",       "fall",
                                                   "jitter",  "port",     "initial", "on_down",    "slow_start",
                                                   "all_down"};

const std::array<TypeKeys, 6> kTypes = {{
    {"tcp", HealthType::tcp, {}},
    {"http", HealthType::http, {"path", "method", "host", "expect_status", "expect_body"}},
    {"send_expect", HealthType::send_expect, {"send", "send_hex", "expect", "expect_hex", "expect_match"}},
    {"postgres",
     HealthType::postgres,
     {"role", "user", "database", "password_file", "sslmode", "max_lag", "on_role_change"}},
    {"redis", HealthType::redis, {"role", "password_file", "on_role_change"}},
    {"mysql", HealthType::mysql, {"role", "user", "password_file", "max_lag", "galera", "on_role_change"}},
}};

// Unknown keys, and keys of another type, reported at the first one written.
void check_keys(const TableReader& r, const TypeKeys& chosen, bool type_written) {
  std::vector<std::string_view> allowed = kCommonKeys;
  allowed.insert(allowed.end(), chosen.keys.begin(), chosen.keys.end());
  const toml::key* key = r.first_key_not_in(allowed);
  if (key == nullptr) return;
  std::string owners;
  for (const auto& t : kTypes) {
    if (std::find(t.keys.begin(), t.keys.end(), key->str()) == t.keys.end()) continue;
    if (!owners.empty()) owners += " or ";
    owners += quote(t.name);
  }
  if (owners.empty()) r.reject_unknown_keys(allowed);
  r.fail_key(key->str(), "key " + quote(key->str()) + " is not allowed with type = " + quote(chosen.name) +
                             (type_written ? "" : " (the default)") + "; it belongs to type = " + owners);
}

// Exactly one of two keys (`send` / `send_hex`). Returns the one given.
std::string_view one_of(const TableReader& r, std::string_view a, std::string_view b) {
  const auto ia = r.table().find(a);
  const auto ib = r.table().find(b);
  const bool has_a = ia != r.table().end();
  const bool has_b = ib != r.table().end();
  if (has_a && has_b) {
    const bool b_later = before(ia->first.source().begin, ib->first.source().begin);
    r.fail_key(b_later ? b : a, std::string(a) + " and " + std::string(b) + " cannot both be given; use one");
  }
  if (!has_a && !has_b) {
    r.fail_table("type = \"send_expect\" needs " + std::string(a) + " or " + std::string(b));
  }
  return has_a ? a : b;
}

bool is_token_char(char c) { return c >= 'A' && c <= 'Z'; }

// Printable ASCII without spaces: what may go into a request line or Host header.
bool is_visible(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

void parse_http(const TableReader& r, HealthConfig& h) {
  if (auto v = r.string("path")) {
    if (!is_visible(*v) || v->front() != '/') {
      r.fail(*r.get("path"), "path must start with \"/\" and contain no spaces or control characters, got " +
                                 quote(*v));
    }
    h.path = *v;
  }
  if (auto v = r.string("method")) {
    if (v->empty() || v->size() > 20 || !std::all_of(v->begin(), v->end(), is_token_char)) {
      r.fail(*r.get("method"), "method must be an HTTP method in capitals like \"GET\" or \"HEAD\", got " + quote(*v));
    }
    h.method = *v;
  }
  if (auto v = r.string("host")) {
    if (!is_visible(*v)) {
      r.fail(*r.get("host"), "host must be a host name (no spaces or control characters), got " + quote(*v));
    }
    h.host = *v;
  }
  if (const toml::array* list = r.array("expect_status", "an array like [200, \"300-399\"]")) {
    if (list->empty()) r.fail(*r.get("expect_status"), "expect_status must not be empty");
    h.expect_status.clear();
    for (std::size_t i = 0; i < list->size(); ++i) {
      const toml::node& node = (*list)[i];
      const std::string entry = "expect_status entry " + std::to_string(i + 1);
      if (const auto* code = node.as_integer()) {
        if (code->get() < 100 || code->get() > 599) {
          r.fail(node, entry + " must be a status code 100..599, got " + std::to_string(code->get()));
        }
        h.expect_status.push_back(StatusRange{static_cast<int>(code->get()), static_cast<int>(code->get())});
        continue;
      }
      const auto* text = node.as_string();
      if (text == nullptr) r.fail_type(entry, node, "a status code like 200 or a range like \"200-399\"");
      std::string error;
      const auto range = parse_status_range(text->get(), error);
      if (!range) r.fail(node, entry + " " + error);
      h.expect_status.push_back(*range);
    }
  }
  if (auto v = r.string("expect_body")) {
    if (v->empty()) r.fail(*r.get("expect_body"), "expect_body must not be empty (leave it out to accept any body)");
    h.expect_body = *v;
  }
  // The answer to HEAD carries no body, so the check could never pass.
  if (h.method == "HEAD" && !h.expect_body.empty()) {
    r.fail(*r.get("expect_body"), "expect_body can never match with method = \"HEAD\" (the answer to HEAD has "
                                  "no body); use method = \"GET\" or leave expect_body out");
  }
}

void parse_send_expect(const TableReader& r, HealthConfig& h) {
  if (one_of(r, "send", "send_hex") == "send") {
    h.send = *r.string("send");  // may be empty: send nothing, wait for the server's greeting
  } else {
    h.send = *r.parsed<std::string>("send_hex", "a hex string like \"2a310d0a\"", parse_hex_bytes);
  }
  if (one_of(r, "expect", "expect_hex") == "expect") {
    h.expect = *r.string("expect");
    if (h.expect.empty()) r.fail(*r.get("expect"), "expect must not be empty");
  } else {
    h.expect = *r.parsed<std::string>("expect_hex", "a hex string like \"2b504f4e47\"", parse_hex_bytes);
  }
  if (auto v = r.choice<ExpectMatch>("expect_match",
                                     {{"prefix", ExpectMatch::prefix}, {"substring", ExpectMatch::substring}})) {
    h.expect_match = *v;
  }
}

void parse_nonempty(const TableReader& r, std::string_view key, std::string& out) {
  if (auto v = r.string(key)) {
    if (v->empty()) r.fail(*r.get(key), std::string(key) + " must not be empty");
    out = *v;
  }
}

// Every database check takes role = "primary" | "replica" | "any"; each
// also takes its own system's word for a replica or primary ("standby" for
// PostgreSQL, "master" for Redis).
void parse_postgres(const TableReader& r, HealthConfig& h) {
  if (auto v = r.choice<PostgresRole>("role", {{"primary", PostgresRole::primary},
                                               {"replica", PostgresRole::standby},
                                               {"standby", PostgresRole::standby},
                                               {"any", PostgresRole::any}})) {
    h.postgres_role = *v;
  }
  parse_nonempty(r, "user", h.user);
  parse_nonempty(r, "database", h.database);
  if (auto v = r.choice<std::string_view>("sslmode", {{"disable", "disable"},
                                                      {"allow", "allow"},
                                                      {"prefer", "prefer"},
                                                      {"require", "require"},
                                                      {"verify-ca", "verify-ca"},
                                                      {"verify-full", "verify-full"}})) {
    h.sslmode = std::string(*v);
  }
  if (auto v = r.readable_file("password_file")) h.password_file = *v;
  if (auto v = r.duration("max_lag", false)) {
    if (h.postgres_role == PostgresRole::primary) {
      r.fail(*r.get("max_lag"), "max_lag applies to replicas; it cannot be used with role = \"primary\"");
    }
    h.max_lag = *v;
  }
}

void parse_redis(const TableReader& r, HealthConfig& h) {
  if (auto v = r.choice<RedisRole>("role", {{"primary", RedisRole::master},
                                            {"master", RedisRole::master},
                                            {"replica", RedisRole::replica},
                                            {"any", RedisRole::any}})) {
    h.redis_role = *v;
  }
  if (auto v = r.readable_file("password_file")) h.password_file = *v;
}

void parse_mysql(const TableReader& r, HealthConfig& h) {
  if (auto v = r.choice<MysqlRole>(
          "role", {{"primary", MysqlRole::primary}, {"replica", MysqlRole::replica}, {"any", MysqlRole::any}})) {
    h.mysql_role = *v;
  }
  // No default user: a check logs in, and the account is the operator's to
  // create with the few privileges it needs (docs/health.md).
  if (!r.has("user")) r.fail_table("type = \"mysql\" needs user (the account the check logs in with)");
  parse_nonempty(r, "user", h.user);
  if (auto v = r.readable_file("password_file")) h.password_file = *v;
  if (auto v = r.duration("max_lag", false)) {
    if (h.mysql_role == MysqlRole::primary) {
      r.fail(*r.get("max_lag"), "max_lag applies to replicas; it cannot be used with role = \"primary\"");
    }
    if (*v < std::chrono::seconds(1)) {
      r.fail(*r.get("max_lag"), "max_lag must be at least 1s (the server reports whole seconds)");
    }
    h.max_lag = *v;
  }
  if (auto v = r.boolean("galera")) h.galera = *v;
}

}  // namespace

bool has_role(const HealthConfig& h) {
  switch (h.type) {
    case HealthType::postgres: return h.postgres_role != PostgresRole::any;
    case HealthType::redis: return h.redis_role != RedisRole::any;
    case HealthType::mysql: return h.mysql_role != MysqlRole::any;
    case HealthType::tcp:
    case HealthType::http:
    case HealthType::send_expect: return false;
  }
  return false;
}

HealthConfig parse_health(const toml::table& table, const std::string& context, const std::string& path) {
  TableReader r(table, context, path);
  HealthConfig h;
  if (auto v = r.choice<HealthType>("type", {{"tcp", HealthType::tcp},
                                             {"http", HealthType::http},
                                             {"send_expect", HealthType::send_expect},
                                             {"postgres", HealthType::postgres},
                                             {"redis", HealthType::redis},
                                             {"mysql", HealthType::mysql}})) {
    h.type = *v;
  }
  const auto chosen = std::find_if(kTypes.begin(), kTypes.end(), [&](const TypeKeys& t) { return t.type == h.type; });
  check_keys(r, *chosen, r.has("type"));

  if (auto v = r.duration("interval", false)) h.interval = *v;
  if (auto v = r.duration("timeout", false)) h.timeout = *v;
  // Without a timeout of its own, a check never waits longer than the
  // interval (HAProxy uses inter the same way). A longer timeout is allowed:
  // the interval runs from the end of one check, so checks never overlap.
  if (!r.has("timeout")) h.timeout = std::min(h.timeout, h.interval);
  if (auto v = r.integer("rise", 1, 100)) h.rise = static_cast<std::uint32_t>(*v);
  if (auto v = r.integer("fall", 1, 100)) h.fall = static_cast<std::uint32_t>(*v);
  if (auto v = r.parsed<double>("jitter", "a percentage string like \"10%\"", parse_percent)) h.jitter = *v;
  if (auto v = r.integer("port", 1, 65535)) h.port = static_cast<std::uint16_t>(*v);
  if (auto v = r.choice<HealthInitial>("initial", {{"up", HealthInitial::up}, {"down", HealthInitial::down}})) {
    h.initial = *v;
  }
  if (auto v = r.choice<OnDown>("on_down", {{"keep", OnDown::keep},
                                           {"close_sessions", OnDown::close_sessions},
                                           {"drain", OnDown::drain}})) {
    h.on_down = *v;
  }
  if (auto v = r.choice<OnRoleChange>("on_role_change", {{"keep", OnRoleChange::keep},
                                                         {"close_sessions", OnRoleChange::close_sessions}})) {
    h.on_role_change = *v;
  }
  if (auto v = r.duration("slow_start", true)) h.slow_start = *v;

  switch (h.type) {
    case HealthType::tcp:
      break;
    case HealthType::http:
      parse_http(r, h);
      break;
    case HealthType::send_expect:
      parse_send_expect(r, h);
      break;
    case HealthType::postgres:
      parse_postgres(r, h);
      break;
    case HealthType::redis:
      parse_redis(r, h);
      break;
    case HealthType::mysql:
      parse_mysql(r, h);
      break;
  }
  // A check that looks for a role starts down: until the first check has
  // answered, nobody knows which node is the primary, and a guess of "up"
  // sends writes to a standby in the first seconds after a start.
  if (!r.has("initial") && has_role(h)) h.initial = HealthInitial::down;
  return h;
}

}  // namespace sluice::config_detail
