// Immutable configuration: what the TOML file says, after validation.
// Produced only by load_config()/parse_config() (src/config/); everything
// downstream may assume every field is valid and every name resolves.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <sys/socket.h>

namespace sluice {

using Duration = std::chrono::milliseconds;

// A parsed "host:port" / "[v6]:port", resolved once at load time.
struct Endpoint {
  std::string text;          // as written in the file, e.g. "[::1]:5432"
  std::string host;          // without brackets
  std::uint16_t port = 0;
  sockaddr_storage addr{};   // resolved address (numeric hosts, or first getaddrinfo answer)
  socklen_t addr_len = 0;
};

struct GlobalConfig {
  unsigned workers = 0;                  // 0 = one per core
  std::uint64_t max_connections = 100000;
  Duration shutdown_timeout = std::chrono::seconds(30);
  std::string log_level = "info";        // trace|debug|info|warn|error|critical|off
  std::string access_log = "stderr";     // path, "stderr", "stdout" or "off"
  std::string access_log_format = "text"; // "text" | "json"
};

enum class Balance { least_conn, round_robin, hash, random };
enum class HashKey { sni, client_ip, sni_or_client_ip };

struct ServerConfig {
  Endpoint address;
  std::uint32_t weight = 1;      // 1..1000
  std::uint32_t max_conns = 0;   // 0 = unlimited
  bool backup = false;
};

struct UpstreamConfig {
  std::string name;
  Balance balance = Balance::least_conn;
  std::uint32_t max_fails = 1;   // 0 disables passive health
  Duration fail_timeout = std::chrono::seconds(10);
  HashKey hash_key = HashKey::sni_or_client_ip;
  double hash_balance_factor = 0.0;  // 0 = off; otherwise > 1.0
  std::vector<ServerConfig> servers;
};

enum class Preread { none, tls };
enum class OnNotTls { use_default, close };
enum class OnMalformed { close, use_default };

struct Route {
  std::string sni;        // lower-case, no trailing dot; "*.suffix" for wildcards
  std::string upstream;   // name of an [upstream.NAME]
};

struct ListenerConfig {
  std::string name;
  Endpoint listen;
  std::string upstream;                  // may be empty when preread="tls" and default_upstream/routes are set
  Duration connect_timeout = std::chrono::seconds(5);
  Duration idle_timeout{0};              // 0 = off
  std::uint32_t tries = 3;               // connect attempts per session, >= 1
  Duration next_upstream_timeout{0};     // 0 = unlimited
  Duration fin_timeout = std::chrono::seconds(30);
  Duration max_lifetime{0};              // 0 = off
  std::uint32_t backlog = 511;
  // TLS preread
  Preread preread = Preread::none;
  Duration preread_timeout = std::chrono::seconds(5);
  std::uint32_t preread_max_bytes = 16384;
  std::vector<Route> routes;
  std::string default_upstream;          // empty = none
  OnNotTls on_not_tls = OnNotTls::use_default;
  OnMalformed on_malformed = OnMalformed::close;
};

struct Config {
  std::string path;
  GlobalConfig global;
  std::vector<ListenerConfig> listeners;
  std::map<std::string, UpstreamConfig> upstreams;  // by name
};

// Thrown by the loader; what() is "file:line:column: message" (or "file: message"
// when the error has no position, e.g. the file cannot be read).
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reads and validates a file. Throws ConfigError.
Config load_config(const std::string& path);
// Same, from text already in memory; `path` is used only in messages.
Config parse_config(std::string_view text, const std::string& path);

}  // namespace sluice
