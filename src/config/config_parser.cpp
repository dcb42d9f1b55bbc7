// TOML text -> validated, immutable Config. All checks live here (and in
// values.cpp); the first problem found is thrown as ConfigError with the
// position of the offending node.
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <system_error>
#include <vector>

#include <toml++/toml.h>

#include "config/discovery_parser.hpp"
#include "config/health_parser.hpp"
#include "config/quote.hpp"
#include "config/table_reader.hpp"
#include "config/values.hpp"
#include "sluice/address.hpp"
#include "sluice/config.hpp"
#include "sluice/host.hpp"

namespace sluice {

namespace {

using config_detail::describe;
using config_detail::fail_at;
using config_detail::TableReader;

constexpr auto kInt64Max = std::numeric_limits<std::int64_t>::max();

bool valid_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

constexpr std::string_view kNameRule = "[A-Za-z0-9_.-]+";

// Same address and port: two sockets would collide.
bool same_endpoint(const Endpoint& a, const Endpoint& b) { return a.port == b.port && same_ip(a.addr, b.addr); }

bool is_unspecified(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) {
    sockaddr_in sin{};
    std::memcpy(&sin, &ss, sizeof sin);
    return sin.sin_addr.s_addr == htonl(INADDR_ANY);
  }
  if (ss.ss_family == AF_INET6) {
    sockaddr_in6 sin6{};
    std::memcpy(&sin6, &ss, sizeof sin6);
    return IN6_IS_ADDR_UNSPECIFIED(&sin6.sin6_addr);
  }
  return false;
}

// The addresses of this host's interfaces, as endpoints with port 0.
std::vector<Endpoint> local_addresses() {
  std::vector<Endpoint> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (const ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr) continue;
    const auto family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    Endpoint ep;
    ep.addr_len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&ep.addr, it->ifa_addr, ep.addr_len);
    out.push_back(ep);
  }
  ::freeifaddrs(list);
  return out;
}

std::string already_used(std::string_view key, const Endpoint& mine, std::string_view owner, const Endpoint& theirs) {
  const std::string head = std::string(key) + " " + quote(mine.text);
  if (mine.text == theirs.text) return head + " is already used by " + std::string(owner);
  return head + " resolves to the same address as " + std::string(owner) + " (" + quote(theirs.text) + ")";
}

// SNI pattern: a host name or "*.suffix"; lower-cased, trailing dot removed.
// Returns an empty string when the pattern is not valid.
std::string normalize_sni(std::string_view text) {
  std::string out = normalize_host(text);
  std::string_view host = out;
  if (host.starts_with("*.")) host.remove_prefix(2);
  // The same rule as the names discovery asks for.
  if (config_detail::normalize_dns_name(host).empty()) return {};
  return out;
}

// Keys that belong in another table. Written in the wrong one they are not
// just "unknown": the message says where they go (tries on an upstream is a
// listener's, balance on a listener is an upstream's). Only keys that no
// table of this kind accepts are listed, so a list never hides a real key.
struct Home {
  std::vector<std::string_view> keys;
  std::string_view where;
};

const Home kListenerHome = {{"listen", "connect_timeout", "idle_timeout", "tries", "next_upstream_timeout",
                             "fin_timeout", "max_lifetime", "backlog", "preread", "protocol", "preread_timeout",
                             "preread_max_bytes", "routes", "default_upstream", "on_not_tls", "on_malformed",
                             "tcp_keepalive", "tcp_keepalive_idle", "tcp_keepalive_interval", "tcp_keepalive_count",
                             "accept_proxy", "trusted_proxies", "allow", "deny", "client_max_connections",
                             "client_rate_limit", "splice", "half_close"},
                            "a listener key: set it in the [[listener]] that sends to this upstream "
                            "(each listener has its own)"};
const Home kUpstreamHome = {{"balance", "max_fails", "fail_timeout", "hash_key", "hash_balance_factor", "all_down",
                             "fallback", "queue", "queue_timeout", "servers", "health"},
                            "an upstream key: set it under [upstream.NAME]"};
const Home kServerHome = {{"address", "weight", "max_conns", "backup"},
                          "a server key: set it on each server, like servers = [{ address = \"10.0.0.1:5432\", "
                          "max_conns = 100 }]"};
const Home kHealthHome = {{"type", "interval", "timeout", "rise", "fall", "jitter", "initial", "on_down",
                           "on_role_change", "slow_start", "path", "method", "expect_status", "expect_body", "send", "send_hex",
                           "expect", "expect_hex", "expect_match", "role", "user", "database", "password_file",
                           "sslmode"},
                          "a health check key: set it under [upstream.NAME.health]"};

// Throws for the first key written in `table` that belongs to one of `homes`.
void reject_misplaced(const TableReader& r, std::initializer_list<const Home*> homes) {
  const toml::key* first = nullptr;
  const Home* home = nullptr;
  for (const auto& [key, value] : r.table()) {
    for (const Home* h : homes) {
      if (std::find(h->keys.begin(), h->keys.end(), key.str()) == h->keys.end()) continue;
      const auto& at = key.source().begin;
      if (first == nullptr || at.line < first->source().begin.line ||
          (at.line == first->source().begin.line && at.column < first->source().begin.column)) {
        first = &key;
        home = h;
      }
    }
  }
  if (first == nullptr) return;
  r.fail_key(first->str(), quote(first->str()) + " is " + std::string(home->where));
}

// On a listener, proxy_protocol is a likely mix-up of the two directions.
void reject_proxy_protocol_on_listener(const TableReader& r) {
  if (!r.has("proxy_protocol")) return;
  r.fail_key("proxy_protocol",
             "\"proxy_protocol\" (sending a PROXY header to the servers) is an upstream key: set it under "
             "[upstream.NAME]; to accept a PROXY header from clients, use accept_proxy and trusted_proxies");
}

class Parser {
 public:
  Parser(const toml::table& root, const std::string& path) : root_(root), path_(path) {}

  Config run() {
    Config config;
    config.path = path_;
    TableReader top(root_, "top level", path_);
    top.reject_unknown_keys({"global", "admin", "listener", "upstream", "resolver"});

    if (const toml::node* global = top.get("global")) {
      const auto* table = global->as_table();
      if (table == nullptr) top.fail_type("global", *global, "a table ([global])");
      config.global = parse_global(*table);
    }

    std::string error;
    config.admin.listen = *parse_address("127.0.0.1:9090", false, error);
    if (const toml::node* admin = top.get("admin")) {
      const auto* table = admin->as_table();
      if (table == nullptr) top.fail_type("admin", *admin, "a table ([admin])");
      parse_admin(*table, config.admin);
    }

    if (const toml::node* resolver = top.get("resolver")) {
      const auto* table = resolver->as_table();
      if (table == nullptr) top.fail_type("resolver", *resolver, "a table ([resolver])");
      config.resolver = config_detail::parse_resolver(*table, path_);
    }

    // Upstreams first so listener references can be checked where they are written.
    if (const toml::node* upstreams = top.get("upstream")) {
      const auto* table = upstreams->as_table();
      if (table == nullptr) top.fail_type("upstream", *upstreams, "a table of upstreams ([upstream.NAME])");
      parse_upstreams(*table, config);
      check_fallbacks(config);
    }

    // No listener is a valid file (a package's default, or an instance
    // that only checks servers until one is added): it serves no client.
    const toml::node* listeners = top.get("listener");
    const auto* array = listeners != nullptr ? listeners->as_array() : nullptr;
    if (listeners != nullptr && (array == nullptr || (!array->empty() && !array->is_array_of_tables()))) {
      top.fail_type("listener", *listeners, "an array of tables ([[listener]])");
    }
    for (std::size_t i = 0; array != nullptr && i < array->size(); ++i) {
      const toml::table& table = *(*array)[i].as_table();
      const TableReader placement(table, listener_context(table, i + 1), path_);
      reject_proxy_protocol_on_listener(placement);
      reject_misplaced(placement, {&kUpstreamHome, &kServerHome, &kHealthHome});
      config.listeners.push_back(parse_listener(table, i + 1, config));
    }
    if (config.admin.enabled) check_admin_address(config);
    for (const auto& l : config.listeners) {
      check_no_loop(l, config);
      check_hash_key(l, config);
    }
    return config;
  }

 private:
  GlobalConfig parse_global(const toml::table& table) {
    TableReader r(table, "[global]", path_);
    r.reject_unknown_keys({"workers", "max_connections", "shutdown_timeout", "log_level", "error_log", "access_log",
                           "access_log_format", "log_interval", "log_phases", "drain_timeout", "shutdown_delay", "pid_file",
                           "upgrade_timeout", "upgrade_finish_timeout", "close_spread", "watch_config", "control_cpu"});
    GlobalConfig g;
    if (auto v = r.integer("workers", 0, 256)) g.workers = static_cast<unsigned>(*v);
    if (auto v = r.integer("max_connections", 1, kInt64Max)) g.max_connections = static_cast<std::uint64_t>(*v);
    if (auto v = r.duration("shutdown_timeout", true)) g.shutdown_timeout = *v;
    if (auto v = r.choice<std::string_view>("log_level", {{"trace", "trace"},
                                                          {"debug", "debug"},
                                                          {"info", "info"},
                                                          {"warn", "warn"},
                                                          {"error", "error"},
                                                          {"critical", "critical"},
                                                          {"off", "off"}})) {
      g.log_level = std::string(*v);
    }
    if (auto v = r.string("error_log")) {
      if (v->empty() || *v == "off") {
        r.fail(*r.get("error_log"), "error_log must be a file path, \"stderr\" or \"stdout\", got " + quote(*v) +
                                        " (log_level = \"off\" silences it)");
      }
      g.error_log = *v;
    }
    if (auto v = r.string("access_log")) {
      if (v->empty()) {
        r.fail(*r.get("access_log"), "access_log must be a file path, \"stderr\", \"stdout\" or \"off\", got \"\"");
      }
      g.access_log = *v;
    }
    if (auto v = r.choice<std::string_view>("access_log_format", {{"text", "text"}, {"json", "json"}})) {
      g.access_log_format = std::string(*v);
    }
    if (auto v = r.duration("log_interval", true)) {
      if (v->count() != 0 && *v < std::chrono::seconds(1)) {
        r.fail(*r.get("log_interval"),
               "log_interval must be \"0s\" (off) or at least \"1s\", got " + quote(*r.string("log_interval")));
      }
      g.log_interval = *v;
    }
    if (auto v = r.duration("drain_timeout", true)) g.drain_timeout = *v;
    if (auto v = r.duration("shutdown_delay", true)) g.shutdown_delay = *v;
    if (auto v = r.string("pid_file")) {
      if (v->empty() || v->front() != '/') r.fail(*r.get("pid_file"), "pid_file must be an absolute path, got " + quote(*v));
      g.pid_file = *v;
    }
    if (auto v = r.duration("upgrade_timeout", false)) g.upgrade_timeout = *v;
    g.upgrade_finish_timeout = g.upgrade_timeout;
    if (auto v = r.duration("upgrade_finish_timeout", false)) g.upgrade_finish_timeout = *v;
    if (auto v = r.duration("close_spread", true)) {
      g.close_spread = *v;
      g.close_spread_set = true;
    }
    if (auto v = r.boolean("watch_config")) g.watch_config = *v;
    if (auto v = r.boolean("log_phases")) g.log_phases = *v;
    if (auto v = r.integer("control_cpu", 0, 1023)) g.control_cpu = static_cast<int>(*v);
    return g;
  }

  void parse_admin(const toml::table& table, AdminConfig& a) {
    TableReader r(table, "[admin]", path_);
    r.reject_unknown_keys({"listen", "token_file", "allowed_hosts"});
    a.enabled = true;
    if (auto v = r.address("listen", true)) a.listen = *v;
    if (auto v = r.readable_file("token_file")) {
      a.token = read_token(*v);
      if (a.token.empty()) r.fail(*r.get("token_file"), "token_file " + quote(*v) + " holds no token (it is empty)");
      if (a.token.size() > kMaxAdminTokenBytes) {
        r.fail(*r.get("token_file"), "token_file " + quote(*v) + " holds a token of " + std::to_string(a.token.size()) +
                                         " bytes; at most " + std::to_string(kMaxAdminTokenBytes));
      }
      a.token_file = *v;
    }
    if (const toml::array* list = r.array("allowed_hosts", "an array of host names like [\"lb1.example\"]")) {
      for (std::size_t i = 0; i < list->size(); ++i) {
        const toml::node& node = (*list)[i];
        const std::string entry = "allowed_hosts entry " + std::to_string(i + 1);
        const auto* text = node.as_string();
        if (text == nullptr) r.fail_type(entry, node, "a host name like \"lb1.example\"");
        std::string error;
        std::optional<std::string> name = parse_allowed_host(text->get(), error);
        if (!name) r.fail(node, entry + " " + error);
        a.allowed_hosts.push_back(std::move(*name));
      }
    }
    if (a.token_file.empty() && !is_loopback(a.listen.addr)) {
      r.fail(*r.get("listen"), "listen " + quote(a.listen.text) +
                                   " is not a loopback address: set token_file so that every request needs a token");
    }
  }

  // The file's content without surrounding white space (empty when unreadable).
  static std::string read_token(const std::string& file_path) {
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(file_path.c_str(), "rb"), &std::fclose);
    if (!file) return {};
    std::string text;
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, file.get())) > 0;) text.append(buf, n);
    const auto first = text.find_first_not_of(" \t\r\n");
    if (first == std::string::npos) return {};
    const auto last = text.find_last_not_of(" \t\r\n");
    return text.substr(first, last - first + 1);
  }

  void parse_upstreams(const toml::table& table, Config& config) {
    // In file order, so the first error reported is the first one written.
    std::vector<std::pair<const toml::key*, const toml::node*>> entries;
    for (const auto& [key, node] : table) entries.emplace_back(&key, &node);
    std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
      const auto& x = a.first->source().begin;
      const auto& y = b.first->source().begin;
      return x.line < y.line || (x.line == y.line && x.column < y.column);
    });
    for (const auto& [key, node] : entries) {
      const std::string context = "upstream " + quote(key->str());
      if (!valid_name(key->str())) {
        fail_at(path_, key->source(), context, "name must match " + std::string(kNameRule));
      }
      const auto* body = node->as_table();
      if (body == nullptr) {
        fail_at(path_, node->source(), context,
                "must be a table ([upstream." + std::string(key->str()) + "]), got " + describe(*node));
      }
      check_placement(*body, context);
      UpstreamConfig u = parse_upstream(*body, context, config.global, config.resolver.family);
      u.name = std::string(key->str());
      config.upstreams.emplace(u.name, std::move(u));
    }
  }

  // An upstream and its servers, for keys that belong elsewhere.
  void check_placement(const toml::table& table, const std::string& context) {
    reject_misplaced(TableReader(table, context, path_), {&kListenerHome, &kServerHome, &kHealthHome});
    const toml::array* servers = table.get_as<toml::array>("servers");
    if (servers == nullptr) return;
    for (std::size_t i = 0; i < servers->size(); ++i) {
      if (const auto* server = (*servers)[i].as_table()) {
        reject_misplaced(TableReader(*server, context + " server " + std::to_string(i + 1), path_),
                         {&kListenerHome, &kUpstreamHome, &kHealthHome});
      }
    }
  }

  static std::string listener_context(const toml::table& table, std::size_t index) {
    const toml::node* name_node = table.get("name");
    const bool named = name_node != nullptr && name_node->is_string() && valid_name(name_node->as_string()->get());
    return named ? "listener " + quote(name_node->as_string()->get()) : "listener #" + std::to_string(index);
  }

  UpstreamConfig parse_upstream(const toml::table& table, const std::string& context, const GlobalConfig& global,
                                AddressFamily family) {
    TableReader r(table, context, path_);
    r.reject_unknown_keys({"balance", "max_fails", "fail_timeout", "hash_key", "hash_balance_factor", "all_down",
                           "fallback", "proxy_protocol", "drain_timeout", "queue", "queue_timeout", "servers",
                           "sentinel", "health"});
    UpstreamConfig u;
    u.drain_timeout = global.drain_timeout;
    if (auto v = r.choice<Balance>("balance", {{"least_conn", Balance::least_conn},
                                               {"round_robin", Balance::round_robin},
                                               {"hash", Balance::hash},
                                               {"random", Balance::random}})) {
      u.balance = *v;
    }
    const bool hashing = u.balance == Balance::hash;
    if (auto v = r.integer("max_fails", 0, 1000)) u.max_fails = static_cast<std::uint32_t>(*v);
    if (auto v = r.duration("fail_timeout", false)) u.fail_timeout = *v;
    if (r.has("hash_key") && !hashing) r.fail_key("hash_key", "hash_key is allowed only with balance = \"hash\"");
    if (auto v = r.choice<HashKey>("hash_key", {{"sni", HashKey::sni},
                                                {"client_ip", HashKey::client_ip},
                                                {"sni_or_client_ip", HashKey::sni_or_client_ip}})) {
      u.hash_key = *v;
    }
    if (r.has("hash_balance_factor") && !hashing) {
      r.fail_key("hash_balance_factor", "hash_balance_factor is allowed only with balance = \"hash\"");
    }
    if (auto v = r.number("hash_balance_factor")) {
      const double f = *v;
      if (f != 0.0 && !(f > 1.0 && f <= 100.0)) {
        r.fail(*r.get("hash_balance_factor"),
               "hash_balance_factor must be 0 (off) or more than 1.0 and at most 100, got " +
                   describe(*r.get("hash_balance_factor")));
      }
      u.hash_balance_factor = f;
    }
    if (auto v = all_down_of(r)) u.all_down = *v;
    if (auto v = r.string("fallback")) u.fallback = *v;
    if (auto v = r.choice<ProxyProtocol>(
            "proxy_protocol", {{"none", ProxyProtocol::none}, {"v1", ProxyProtocol::v1}, {"v2", ProxyProtocol::v2}})) {
      u.proxy_protocol = *v;
    }
    if (auto v = r.duration("drain_timeout", true)) {
      u.drain_timeout = *v;
      u.drain_timeout_set = true;
    }
    if (auto v = r.integer("queue", 0, 1000000)) u.queue = static_cast<std::uint32_t>(*v);
    if (r.has("queue_timeout") && u.queue == 0) {
      r.fail_key("queue_timeout", "queue_timeout needs queue = N (N > 0): without a queue nobody waits");
    }
    if (auto v = r.duration("queue_timeout", false)) u.queue_timeout = *v;

    if (r.has("sentinel") && r.has("servers")) {
      r.fail_key("sentinel", "sentinel and servers are both set: an upstream takes its server from the sentinels or "
                             "from servers, not both");
    }
    if (!r.has("sentinel") && !r.has("servers")) {
      r.fail_table("needs servers = [{ address = \"host:port\" }, ...] or sentinel = { addresses = [...], master = "
                   "\"...\" }");
    }
    if (const toml::node* sentinel = r.get("sentinel")) {
      const auto* sentinel_table = sentinel->as_table();
      if (sentinel_table == nullptr) {
        r.fail_type("sentinel", *sentinel, "a table like { addresses = [\"10.0.0.1:26379\"], master = \"mymaster\" }");
      }
      u.sentinel = config_detail::parse_sentinel(*sentinel_table, context, path_);
    }
    if (u.sentinel) {
      parse_upstream_health(r, u, context);
      sentinel_health(r, u, context);
      check_queue(r, u);
      return u;
    }

    const toml::node& servers_node = r.require("servers");
    const toml::array* servers = r.array("servers", "an array of tables like [{ address = \"10.0.0.1:5432\" }]");
    if (servers->empty()) r.fail(servers_node, "servers must not be empty");
    for (std::size_t i = 0; i < servers->size(); ++i) {
      const std::string server_context = context + " server " + std::to_string(i + 1);
      const toml::node& node = (*servers)[i];
      const auto* table_node = node.as_table();
      if (table_node == nullptr) {
        fail_at(path_, node.source(), server_context,
                "must be a table like { address = \"10.0.0.1:5432\" }, got " + describe(node));
      }
      if (config_detail::is_discovered_entry(*table_node)) {
        add_discovered(u, config_detail::parse_discovered_entry(*table_node, server_context, path_, hashing, family),
                       *table_node, server_context);
        continue;
      }
      TableReader s(*table_node, server_context, path_);
      if (s.has("family")) {
        s.fail_key("family", "family is allowed only on servers from DNS (resolve = true, or service): a fixed "
                             "address has its own");
      }
      s.reject_unknown_keys({"address", "resolve", "weight", "max_conns", "backup"});
      ServerConfig server;
      const toml::node& address_node = s.require("address");
      server.address = *s.address("address", false);
      for (std::size_t j = 0; j < u.servers.size(); ++j) {
        if (same_endpoint(server.address, u.servers[j].address)) {
          s.fail(address_node,
                 already_used("address", server.address, "server " + std::to_string(j + 1), u.servers[j].address));
        }
      }
      if (auto v = s.integer("weight", 1, 1000)) server.weight = static_cast<std::uint32_t>(*v);
      if (auto v = s.integer("max_conns", 0, 1000000)) server.max_conns = static_cast<std::uint32_t>(*v);
      if (auto v = s.boolean("backup")) {
        if (*v && hashing) s.fail(*s.get("backup"), "backup = true is not allowed with balance = \"hash\"");
        server.backup = *v;
      }
      u.servers.push_back(std::move(server));
    }

    parse_upstream_health(r, u, context);
    check_queue(r, u);
    return u;
  }

  void parse_upstream_health(const TableReader& r, UpstreamConfig& u, const std::string& context) {
    if (const toml::node* health = r.get("health")) {
      const auto* health_table = health->as_table();
      if (health_table == nullptr) r.fail_type("health", *health, "a table ([upstream.NAME.health])");
      u.health = config_detail::parse_health(*health_table, context + " health", path_);
      u.health->send_proxy = u.proxy_protocol;
      // all_down is the upstream's, but it is read where the checks are set
      // up too: both places mean the same, and they must not disagree.
      const TableReader h(*health_table, context + " health", path_);
      if (auto v = all_down_of(h)) {
        if (r.has("all_down") && *v != u.all_down) {
          h.fail(*h.get("all_down"), "all_down is also set for " + context + " outside its health table, with another value");
        }
        u.all_down = *v;
      }
    }
  }

  // A sentinel names the master, but sluice sends no one there before its
  // own check has seen the role: a sentinel can be wrong or late, and the
  // old master may still answer as one. No [health] table means a redis
  // check with role = "primary" and the documented defaults; one written
  // must be that check.
  void sentinel_health(const TableReader& r, UpstreamConfig& u, const std::string& context) {
    if (!u.health) {
      toml::table defaults{{"type", "redis"}, {"role", "primary"}};
      u.health = config_detail::parse_health(defaults, context + " health", path_);
      u.health->send_proxy = u.proxy_protocol;
      return;
    }
    const TableReader h(*r.get("health")->as_table(), context + " health", path_);
    if (u.health->type != HealthType::redis) {
      const std::string message = "an upstream with sentinel needs type = \"redis\" with role = \"primary\" (sluice "
                                  "confirms the master the sentinels name), or no [health] table for that check";
      if (const toml::node* type = h.get("type")) h.fail(*type, message);
      h.fail_table(message);
    }
    if (u.health->redis_role != RedisRole::master) {
      const toml::node* role = h.get("role");
      const std::string message = "an upstream with sentinel needs role = \"primary\" (or \"master\"): its server is "
                                  "the master the sentinels name";
      if (role != nullptr) h.fail(*role, message);
      h.fail_table(message);
    }
  }

  // Only servers with max_conns ever fill up: without one the queue would
  // never hold anyone, which is a mistake worth saying.
  void check_queue(const TableReader& r, const UpstreamConfig& u) {
    // A primary pool's clients also wait through a failover (the master
    // fenced, the next one not yet checked): no max_conns needed there.
    const bool primary_pool =
        u.sentinel.has_value() ||
        (u.health && ((u.health->type == HealthType::postgres && u.health->postgres_role == PostgresRole::primary) ||
                      (u.health->type == HealthType::redis && u.health->redis_role == RedisRole::master) ||
                      (u.health->type == HealthType::mysql && u.health->mysql_role == MysqlRole::primary)));
    if (u.queue > 0 && !primary_pool) {
      const bool any_limit =
          std::any_of(u.servers.begin(), u.servers.end(), [](const ServerConfig& s) { return s.max_conns > 0; }) ||
          std::any_of(u.discovered.begin(), u.discovered.end(),
                      [](const DiscoveredEntry& e) { return e.max_conns > 0; });
      if (!any_limit) {
        r.fail(*r.get("queue"), "queue needs max_conns on the servers: a queue holds clients only while every "
                                "eligible server is at its max_conns (or, in a primary pool, through a failover)");
      }
    }
  }

  // Two entries of one upstream must not ask for the same name (they would
  // give the same servers twice).
  void add_discovered(UpstreamConfig& u, DiscoveredEntry e, const toml::table& table, const std::string& context) {
    for (const DiscoveredEntry& other : u.discovered) {
      if (other.kind == e.kind && other.name == e.name && other.port == e.port) {
        const TableReader r(table, context, path_);
        const std::string key = e.kind == DiscoveryKind::service ? "service" : "address";
        r.fail(*r.get(key), key + " " + quote(e.text) + " is already discovered by another entry of this upstream (" +
                                quote(other.text) + ")");
      }
    }
    u.discovered.push_back(std::move(e));
  }

  static std::optional<AllDown> all_down_of(const TableReader& r) {
    return r.choice<AllDown>("all_down", {{"fail_closed", AllDown::fail_closed}, {"fail_open", AllDown::fail_open}});
  }

  ListenerConfig parse_listener(const toml::table& table, std::size_t index, const Config& config) {
    ListenerConfig l;
    const toml::node* name_node = table.get("name");
    const bool named = name_node != nullptr && name_node->is_string() && valid_name(name_node->as_string()->get());
    const std::string context = listener_context(table, index);
    TableReader r(table, context, path_);
    r.reject_unknown_keys({"name", "listen", "upstream", "connect_timeout", "idle_timeout", "tries",
                           "next_upstream_timeout", "fin_timeout", "max_lifetime", "backlog", "preread",
                           "preread_timeout", "preread_max_bytes", "routes", "default_upstream", "on_not_tls",
                           "on_malformed", "tcp_keepalive", "tcp_keepalive_idle", "tcp_keepalive_interval",
                           "tcp_keepalive_count", "accept_proxy", "trusted_proxies", "allow", "deny",
                           "max_connections", "client_max_connections", "client_rate_limit", "splice",
                           "half_close", "protocol"});

    r.require("name");
    l.name = *r.string("name");
    if (!named) r.fail(*name_node, "name must match " + std::string(kNameRule) + ", got " + quote(l.name));
    for (std::size_t i = 0; i < config.listeners.size(); ++i) {
      if (config.listeners[i].name == l.name) {
        r.fail(*name_node, "name " + quote(l.name) + " is already used by listener #" + std::to_string(i + 1));
      }
    }

    const toml::node& listen_node = r.require("listen");
    l.listen = *r.address("listen", true);
    if (l.listen.port != 0) {
      for (const auto& other : config.listeners) {
        if (same_endpoint(l.listen, other.listen)) {
          r.fail(listen_node, already_used("listen", l.listen, "listener " + quote(other.name), other.listen));
        }
      }
    }

    if (auto v = r.choice<Preread>("preread",
                                   {{"none", Preread::none}, {"tls", Preread::tls}, {"postgres", Preread::postgres}})) {
      l.preread = *v;
    }
    // TLS and PostgreSQL preread both end in a ClientHello: the same routing keys apply.
    const bool tls = l.preread != Preread::none;
    const std::string mode = l.preread == Preread::postgres ? "preread = \"postgres\"" : "preread = \"tls\"";
    parse_protocol(r, l);

    if (tls) {
      if (r.has("upstream")) {
        r.fail_key("upstream", "upstream is not allowed with " + mode + "; use default_upstream and routes");
      }
    } else {
      // accept_proxy reads a PROXY header first, and a refusal in the
      // clients' protocol their first message: both within preread_timeout.
      const bool proxy_header = r.has("accept_proxy") && r.boolean("accept_proxy").value_or(false);
      const bool timed = proxy_header || l.protocol != ClientProtocol::none;
      for (std::string_view key : {"routes", "default_upstream", "on_not_tls", "on_malformed", "preread_timeout",
                                   "preread_max_bytes"}) {
        if (key == "preread_timeout" && timed) continue;
        if (r.has(key)) {
          r.fail_key(key, std::string(key) + " is allowed only with preread = \"tls\" or \"postgres\"" +
                              (key == "preread_timeout" ? " (or accept_proxy, or protocol)" : ""));
        }
      }
      if (auto v = r.duration("preread_timeout", false)) l.preread_timeout = *v;
      r.require("upstream");
      l.upstream = *r.string("upstream");
      check_upstream(r, "upstream", *r.get("upstream"), l.upstream, config);
    }

    if (auto v = r.duration("connect_timeout", false)) l.connect_timeout = *v;
    if (auto v = r.duration("idle_timeout", true)) l.idle_timeout = *v;
    if (auto v = r.integer("tries", 1, 100)) l.tries = static_cast<std::uint32_t>(*v);
    if (auto v = r.duration("next_upstream_timeout", true)) l.next_upstream_timeout = *v;
    if (auto v = r.boolean("half_close")) l.half_close = *v;
    if (!l.half_close && r.has("fin_timeout")) {
      r.fail_key("fin_timeout",
                 "fin_timeout is allowed only with half_close = true (without half-close a FIN ends the session)");
    }
    if (auto v = r.duration("fin_timeout", false)) l.fin_timeout = *v;
    if (auto v = r.duration("max_lifetime", true)) l.max_lifetime = *v;
    if (auto v = r.integer("backlog", 1, 65535)) l.backlog = static_cast<std::uint32_t>(*v);

    if (tls) {
      if (auto v = r.duration("preread_timeout", false)) l.preread_timeout = *v;
      if (auto v = r.integer("preread_max_bytes", 512, 65536)) l.preread_max_bytes = static_cast<std::uint32_t>(*v);
      if (auto v = r.choice<OnNotTls>("on_not_tls", {{"default", OnNotTls::use_default}, {"close", OnNotTls::close}})) {
        l.on_not_tls = *v;
      }
      if (auto v = r.choice<OnMalformed>("on_malformed",
                                         {{"close", OnMalformed::close}, {"default", OnMalformed::use_default}})) {
        l.on_malformed = *v;
      }
      if (const toml::array* routes =
              r.array("routes", "an array of tables like [{ sni = \"db.example.com\", upstream = \"NAME\" }]")) {
        parse_routes(*routes, context, l, config);
      }
      if (auto v = r.string("default_upstream")) {
        l.default_upstream = *v;
        check_upstream(r, "default_upstream", *r.get("default_upstream"), l.default_upstream, config);
      }
      if (l.routes.empty() && l.default_upstream.empty()) {
        r.fail_table(mode + " needs routes or default_upstream (or both)");
      }
    }
    parse_keepalive(r, l);
    parse_access(r, l);
    if (auto v = r.choice<Splice>("splice", {{"off", Splice::off}, {"pipe", Splice::pipe}, {"auto", Splice::automatic}})) {
      l.splice = *v;
    }
    return l;
  }

  // protocol = "postgres" | "mysql" | "redis": what the clients speak, so
  // that a refusal can be told in it. preread = "postgres" says it already.
  static void parse_protocol(const TableReader& r, ListenerConfig& l) {
    if (l.preread == Preread::postgres) l.protocol = ClientProtocol::postgres;
    const auto v = r.choice<ClientProtocol>("protocol", {{"postgres", ClientProtocol::postgres},
                                                        {"mysql", ClientProtocol::mysql},
                                                        {"redis", ClientProtocol::redis}});
    if (!v) return;
    if (l.preread == Preread::postgres && *v != ClientProtocol::postgres) {
      r.fail(*r.get("protocol"), "protocol = " + quote(*r.string("protocol")) +
                                     " does not go with preread = \"postgres\", whose clients speak PostgreSQL");
    }
    l.protocol = *v;
  }

  // Linux takes keepalive times in whole seconds, at most 32767 (TCP_KEEPIDLE, TCP_KEEPINTVL).
  static Duration keepalive_seconds(const TableReader& r, std::string_view key, Duration fallback) {
    // A plain integer is seconds, as in nginx's so_keepalive=IDLE:INTVL:CNT.
    if (const toml::node* n = r.get(key); n != nullptr && n->is_integer()) {
      return std::chrono::seconds(*r.integer(key, 1, 32767));
    }
    const auto v = r.duration(key, true);
    if (!v) return fallback;
    if (*v < std::chrono::seconds(1) || *v > std::chrono::seconds(32767) || v->count() % 1000 != 0) {
      r.fail(*r.get(key), std::string(key) + " must be whole seconds from \"1s\" to \"32767s\", got " +
                              quote(*r.string(key)));
    }
    return *v;
  }

  static void parse_keepalive(const TableReader& r, ListenerConfig& l) {
    if (auto v = r.boolean("tcp_keepalive")) l.tcp_keepalive = *v;
    if (!l.tcp_keepalive) {
      for (std::string_view key : {"tcp_keepalive_idle", "tcp_keepalive_interval", "tcp_keepalive_count"}) {
        if (r.has(key)) r.fail_key(key, std::string(key) + " is allowed only with tcp_keepalive = true");
      }
      return;
    }
    l.tcp_keepalive_idle = keepalive_seconds(r, "tcp_keepalive_idle", l.tcp_keepalive_idle);
    l.tcp_keepalive_interval = keepalive_seconds(r, "tcp_keepalive_interval", l.tcp_keepalive_interval);
    if (auto v = r.integer("tcp_keepalive_count", 1, 127)) l.tcp_keepalive_count = static_cast<std::uint32_t>(*v);
  }

  // PROXY protocol from trusted peers, address lists and per-client limits.
  static void parse_access(const TableReader& r, ListenerConfig& l) {
    if (auto v = r.boolean("accept_proxy")) l.accept_proxy = *v;
    if (l.accept_proxy && !r.has("trusted_proxies")) {
      r.fail(*r.get("accept_proxy"),
             "accept_proxy = true needs trusted_proxies (the networks of the proxies allowed to send a PROXY header)");
    }
    if (!l.accept_proxy && r.has("trusted_proxies")) {
      r.fail_key("trusted_proxies", "trusted_proxies is allowed only with accept_proxy = true");
    }
    if (auto v = r.cidrs("trusted_proxies")) {
      if (v->empty()) r.fail(*r.get("trusted_proxies"), "trusted_proxies must not be empty");
      l.trusted_proxies = std::move(*v);
    }
    if (auto v = r.cidrs("allow")) {
      if (v->empty()) {
        r.fail(*r.get("allow"), "allow = [] would refuse every client; leave allow out to admit everyone not denied");
      }
      l.allow = std::move(*v);
    }
    if (auto v = r.cidrs("deny")) l.deny = std::move(*v);
    if (auto v = r.integer("max_connections", 0, kInt64Max)) l.max_connections = static_cast<std::uint64_t>(*v);
    if (auto v = r.integer("client_max_connections", 0, 1000000)) {
      l.client_max_connections = static_cast<std::uint32_t>(*v);
    }
    if (auto v = r.parsed<RateLimit>("client_rate_limit", "a rate string like \"100/s\"", parse_rate_limit)) {
      l.client_rate_limit = *v;
    }
  }

  void parse_routes(const toml::array& routes, const std::string& context, ListenerConfig& l, const Config& config) {
    for (std::size_t i = 0; i < routes.size(); ++i) {
      const std::string route_context = context + " route " + std::to_string(i + 1);
      const toml::node& node = routes[i];
      const auto* table = node.as_table();
      if (table == nullptr) {
        fail_at(path_, node.source(), route_context,
                "must be a table like { sni = \"db.example.com\", upstream = \"NAME\" }, got " + describe(node));
      }
      TableReader r(*table, route_context, path_);
      r.reject_unknown_keys({"sni", "alpn", "upstream"});
      Route route;
      route.alpn = parse_route_alpn(r);
      if (!route.alpn.empty() && !r.has("sni")) {
        check_route_unique(r, "alpn", route, l.routes);
        finish_route(r, route, l, config);
        continue;
      }
      if (!r.has("sni")) r.fail_table("a route needs sni, alpn or both (and upstream)");
      const std::string sni = *r.string("sni");
      route.sni = normalize_sni(sni);
      if (sni == "*") {
        r.fail(*r.get("sni"), "sni = \"*\" is not a route: connections that no route matches go to "
                              "default_upstream; set default_upstream = \"NAME\" on the listener instead");
      }
      if (route.sni.empty()) {
        r.fail(*r.get("sni"), "sni must be a host name like \"db.example.com\" or a wildcard like "
                              "\"*.example.com\", got " + quote(sni));
      }
      check_route_unique(r, "sni", route, l.routes);
      finish_route(r, route, l, config);
    }
  }

  // A route's alpn: one protocol name the client must offer (empty: none
  // asked). RFC 7301 names are 1..255 bytes, compared exactly.
  static std::string parse_route_alpn(const TableReader& r) {
    auto v = r.string("alpn");
    if (!v) return {};
    if (v->empty() || v->size() > 255) {
      r.fail(*r.get("alpn"), "alpn must be one ALPN protocol name of 1 to 255 bytes, like \"postgresql\", \"h2\" "
                             "or \"http/1.1\", got " + quote(*v));
    }
    return *v;
  }

  // Two routes for the same host and protocol would leave one unreachable.
  static void check_route_unique(const TableReader& r, std::string_view key, const Route& route,
                                 const std::vector<Route>& routes) {
    for (std::size_t j = 0; j < routes.size(); ++j) {
      if (routes[j].sni != route.sni || routes[j].alpn != route.alpn) continue;
      std::string what = route.sni.empty() ? "" : "sni " + quote(route.sni);
      if (!route.alpn.empty()) what += (what.empty() ? "" : " with ") + std::string("alpn ") + quote(route.alpn);
      r.fail(*r.get(key), what + " is already used by route " + std::to_string(j + 1));
    }
  }

  void finish_route(const TableReader& r, Route& route, ListenerConfig& l, const Config& config) {
    r.require("upstream");
    route.upstream = *r.string("upstream");
    check_upstream(r, "upstream", *r.get("upstream"), route.upstream, config);
    l.routes.push_back(std::move(route));
  }

  // The node a key was read from; the checks below run after parsing, when
  // only the Config is left, and still report the position in the file.
  const toml::node& node_at(toml::node_view<const toml::node> view) const { return *view.node(); }

  void check_admin_address(const Config& config) {
    for (const auto& l : config.listeners) {
      if (l.listen.port != 0 && same_endpoint(config.admin.listen, l.listen)) {
        fail_at(path_, node_at(root_["admin"]["listen"]).source(), "[admin]",
                already_used("listen", config.admin.listen, "listener " + quote(l.name), l.listen));
      }
    }
  }

  // Every `fallback` names another upstream, and no chain of them comes
  // back to where it started. Checked in file order, so the error names the
  // first fallback written that is wrong.
  void check_fallbacks(const Config& config) {
    std::vector<const UpstreamConfig*> order;
    for (const auto& [name, u] : config.upstreams) {
      if (!u.fallback.empty()) order.push_back(&u);
    }
    auto key_at = [this](const UpstreamConfig* u) { return node_at(root_["upstream"][u->name]["fallback"]).source(); };
    std::sort(order.begin(), order.end(), [&key_at](const UpstreamConfig* a, const UpstreamConfig* b) {
      const auto x = key_at(a).begin;
      const auto y = key_at(b).begin;
      return x.line < y.line || (x.line == y.line && x.column < y.column);
    });
    for (const UpstreamConfig* u : order) {
      const std::string context = "upstream " + quote(u->name);
      if (config.upstreams.count(u->fallback) == 0) {
        std::string known;
        for (const auto& [name, other] : config.upstreams) {
          if (name == u->name) continue;
          known += (known.empty() ? "" : ", ") + name;
        }
        fail_at(path_, key_at(u), context,
                "fallback " + quote(u->fallback) + " is not defined; known upstreams: " + (known.empty() ? "none" : known));
      }
      std::string chain = u->name;
      std::vector<std::string> seen{u->name};
      for (const UpstreamConfig* at = u; !at->fallback.empty(); at = &config.upstreams.at(at->fallback)) {
        chain += " -> " + at->fallback;
        if (std::find(seen.begin(), seen.end(), at->fallback) != seen.end()) {
          fail_at(path_, key_at(u), context,
                  "fallback chain loops (" + chain + "): when every upstream in it is down, sessions would go "
                  "round it; end the chain at an upstream without fallback");
        }
        seen.push_back(at->fallback);
        if (config.upstreams.count(at->fallback) == 0) break;  // reported at its own key
      }
    }
  }

  // Upstream names a listener can send to, each once, in the order written
  // (with the fallbacks they lead to).
  std::vector<std::string> used_upstreams(const ListenerConfig& l, const Config& config) {
    std::vector<std::string> names;
    auto add = [&names, &config](const std::string& first) {
      for (std::string name = first; !name.empty(); name = config.upstreams.at(name).fallback) {
        if (std::find(names.begin(), names.end(), name) != names.end()) return;
        names.push_back(name);
      }
    };
    add(l.upstream);
    for (const auto& route : l.routes) add(route.upstream);
    add(l.default_upstream);
    return names;
  }

  // Would connecting to `server` reach the socket bound to `listen`? The
  // same address and port, or a wildcard listen ("0.0.0.0", "[::]"; IPv6
  // listeners are IPv6-only) and a local address of that family on the same
  // port. A server at the wildcard address reaches the local host too.
  bool loops_back(const Endpoint& listen, const Endpoint& server) {
    if (listen.port != server.port || listen.addr.ss_family != server.addr.ss_family) return false;
    if (same_endpoint(listen, server)) return true;
    if (is_unspecified(listen.addr)) return is_local(server);
    if (is_unspecified(server.addr)) return is_local(listen);
    return false;
  }

  bool is_local(const Endpoint& ep) {
    if (is_loopback(ep.addr) || is_unspecified(ep.addr)) return true;
    if (!local_) local_ = local_addresses();
    for (Endpoint local : *local_) {
      local.port = ep.port;  // same_endpoint() compares this field, not the sockaddr's port
      if (same_endpoint(local, ep)) return true;
    }
    return false;
  }

  void check_no_loop(const ListenerConfig& l, const Config& config) {
    if (l.listen.port == 0) return;
    for (const auto& name : used_upstreams(l, config)) {
      const auto& servers = config.upstreams.at(name).servers;
      for (std::size_t i = 0; i < servers.size(); ++i) {
        if (!loops_back(l.listen, servers[i].address)) continue;
        const toml::node& at = node_at(root_["upstream"][name]["servers"][i]["address"]);
        fail_at(path_, at.source(), "upstream " + quote(name) + " server " + std::to_string(i + 1),
                "address " + quote(servers[i].address.text) + " is where listener " + quote(l.name) + " listens (" +
                    quote(l.listen.text) + ") and that listener sends to this upstream: connections would loop "
                    "back into sluice");
      }
    }
  }

  // Without a preread there is no SNI: every hash key would be empty and all
  // traffic would land on one server.
  void check_hash_key(const ListenerConfig& l, const Config& config) {
    if (l.preread != Preread::none) return;
    for (const auto& name : used_upstreams(l, config)) {  // its fallbacks too
      const auto& u = config.upstreams.at(name);
      if (u.balance == Balance::hash && u.hash_key == HashKey::sni) sni_hash_without_sni(l, u);
    }
  }

  [[noreturn]] void sni_hash_without_sni(const ListenerConfig& l, const UpstreamConfig& u) {
    fail_at(path_, node_at(root_["upstream"][u.name]["hash_key"]).source(), "upstream " + quote(u.name),
            "hash_key = \"sni\" needs an SNI, but listener " + quote(l.name) +
                " uses this upstream without preread = \"tls\" or \"postgres\": every key would be empty and all "
                "connections would go to one server; use \"sni_or_client_ip\" or \"client_ip\"");
  }

  void check_upstream(const TableReader& r, std::string_view key, const toml::node& node, const std::string& name,
                      const Config& config) {
    if (config.upstreams.count(name) != 0) return;
    std::string known;
    for (const auto& [upstream_name, upstream] : config.upstreams) {
      if (!known.empty()) known += ", ";
      known += upstream_name;
    }
    if (known.empty()) known = "none";
    r.fail(node, std::string(key) + " " + quote(name) + " is not defined; known upstreams: " + known);
  }

  const toml::table& root_;
  const std::string& path_;
  std::optional<std::vector<Endpoint>> local_;  // this host's addresses, read once when first needed
};

}  // namespace

Config parse_config(std::string_view text, const std::string& path) {
  toml::table root;
  try {
    root = toml::parse(text, std::string_view(path));
  } catch (const toml::parse_error& e) {
    fail_at(path, e.source(), "", "syntax error: " + std::string(e.description()));
  }
  return Parser(root, path).run();
}

Config load_config(const std::string& path) {
  auto cannot_read = [&path] { return ConfigError(path + ": cannot read: " + std::generic_category().message(errno)); };
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) throw cannot_read();
  std::string text;
  char buf[65536];
  for (;;) {
    const std::size_t n = std::fread(buf, 1, sizeof buf, file.get());
    text.append(buf, n);
    if (n < sizeof buf) {
      if (std::ferror(file.get()) != 0) throw cannot_read();
      break;
    }
  }
  return parse_config(text, path);
}

}  // namespace sluice
