// Immutable configuration: what the TOML file says, after validation.
// Produced only by load_config()/parse_config() (src/config/); everything
// downstream may assume every field is valid and every name resolves.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
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

// "10.0.0.0/8", "::1/128", "192.168.1.7" (a bare address is a /32 or /128).
struct Cidr {
  std::string text;                 // as written
  int family = 0;                   // AF_INET or AF_INET6
  std::array<std::uint8_t, 16> addr{};  // network bytes (4 used for AF_INET), host bits zero
  unsigned prefix = 0;              // 0..32 or 0..128
};

// "100/s", "6000/m", "10000/h": a token bucket refilled at `per_second`,
// holding at most one second's worth (at least 1 token).
struct RateLimit {
  std::string text;
  double per_second = 0;  // 0 = no limit
};

struct GlobalConfig {
  unsigned workers = 0;                  // 0 = one per core
  std::uint64_t max_connections = 100000;
  Duration shutdown_timeout = std::chrono::seconds(30);
  std::string log_level = "info";        // trace|debug|info|warn|error|critical|off
  std::string error_log = "stderr";      // path, "stderr" or "stdout" (SIGUSR1 reopens a path)
  std::string access_log = "stderr";     // path, "stderr", "stdout" or "off"
  std::string access_log_format = "text"; // "text" | "json"
  Duration log_interval{0};              // interim access records for long sessions; 0 = off
  bool log_phases = false;               // access records give each phase's time (microseconds)
  Duration drain_timeout{0};             // default for upstreams (see UpstreamConfig)
  // On SIGTERM: GET /ready answers 503 at once, listeners keep accepting
  // this long, then the graceful stop begins (a front tier's notice period).
  Duration shutdown_delay{0};
  // The serving process's PID, written atomically once it serves (by a new
  // binary once it has taken over) and removed at exit. Empty = none.
  std::string pid_file;
  // A binary upgrade (SIGUSR2, POST /upgrade) is given up when the new
  // process has not taken over within this.
  Duration upgrade_timeout = std::chrono::seconds(30);
  // Once the new process serves, the old one hands its sessions over for at
  // most this long; the sessions that could not move by then are closed
  // (cause upgrade) and it exits. The loader sets it to upgrade_timeout
  // when the file does not say.
  Duration upgrade_finish_timeout = std::chrono::seconds(30);
  // The window over which sessions closed together at a deadline (the end
  // of shutdown_timeout, of a drain_timeout) are closed one by one, so that
  // their clients do not all reconnect in the same second. Unset: the end
  // of shutdown_timeout closes at once, a drain over a tenth of its
  // drain_timeout.
  Duration close_spread{0};
  bool close_spread_set = false;
  // Reload when the configuration file's content changes (inotify on its
  // directory, so a Kubernetes ConfigMap's `..data` swap is seen).
  bool watch_config = false;
  // The CPU the control thread (admin API, checks, DNS, reloads) runs on;
  // the workers then run on the others. -1 = no pinning. Read at start.
  int control_cpu = -1;
};

// [admin]: the HTTP admin API on the control loop. Absent table = no API.
struct AdminConfig {
  bool enabled = false;
  Endpoint listen;                       // default "127.0.0.1:9090"; non-loopback needs token_file
  std::string token_file;                // empty = no auth (loopback only)
  std::string token;                     // token_file's content, trimmed; read at load time
  // Names besides the listen address, localhost and literal IPs that a
  // request which changes something may give in Host: "lb1.example" (any
  // port) or "lb1.example:8443"; lower case, no trailing dot.
  std::vector<std::string> allowed_hosts;
};

// The longest token_file token: the admin API compares every presented
// token over this many bytes, whatever either's length.
inline constexpr std::size_t kMaxAdminTokenBytes = 4096;

enum class Balance { least_conn, round_robin, hash, random };
enum class HashKey { sni, client_ip, sni_or_client_ip };

struct ServerConfig {
  Endpoint address;
  std::uint32_t weight = 1;      // 1..1000
  std::uint32_t max_conns = 0;   // 0 = unlimited
  bool backup = false;
  // A server that DNS gave (see DiscoveredEntry): the name it came from
  // ("db.internal", "_pg._tcp.db.service.consul"); empty for a server
  // written in the file. Its address text is then numeric and canonical
  // ("10.0.0.7:5432", "[2001:db8::7]:5432").
  std::string from;
};

// A `servers` entry whose servers come from DNS, re-resolved while sluice
// runs (src/discovery/):
//   { address = "db.internal:5432", resolve = true }: every A/AAAA address;
//   { service = "_postgresql._tcp.db.service.consul" }: an SRV record set.
enum class DiscoveryKind { host, service };
// Which addresses a name gives: A and AAAA ("any"), or one of them. With
// "ipv4" no AAAA query is sent (nginx's resolver ipv6=off), and the other way.
enum class AddressFamily { any, ipv4, ipv6 };

struct DiscoveredEntry {
  DiscoveryKind kind = DiscoveryKind::host;
  std::string name;              // lower-case, no trailing dot
  std::string text;              // as written: "db.internal:5432", or the service name
  std::uint16_t port = 0;        // host: the entry's port; service: from the records
  std::uint32_t weight = 1;      // host only: SRV records carry their own
  std::uint32_t max_conns = 0;
  bool backup = false;
  AddressFamily family = AddressFamily::any;  // as written, else [resolver]'s
};

// `sentinel = { ... }` on an upstream: its one server is the master that
// Redis Sentinel names (src/discovery/sentinel.*), instead of `servers`.
struct SentinelConfig {
  std::vector<Endpoint> addresses;  // asked in this order, the first that answers wins
  std::string master;               // the name the sentinels monitor ("mymaster")
  std::string password_file;        // the sentinels' AUTH; empty = none (read at each connection)
};

// [resolver]: how discovered names are looked up.
struct ResolverConfig {
  // "ip:port" each (port 53 when not written); empty = /etc/resolv.conf's.
  std::vector<Endpoint> nameservers;
  Duration timeout = std::chrono::seconds(2);  // per try (c-ares doubles it on each round)
  std::uint32_t attempts = 2;                  // tries per query, over all nameservers
  Duration valid{0};                           // 0 = refresh per the records' TTL
  Duration hold = std::chrono::seconds(10);    // a server missing from a good answer stays this long
  AddressFamily family = AddressFamily::any;   // of entries that do not say
  // What one answer may bring: SRV records read from one answer, and
  // servers one entry gives (so also addresses from one A or AAAA answer).
  // More are dropped, with a warning.
  std::uint32_t max_targets = 1000;
  std::uint32_t max_addresses = 1000;
};

// [upstream.NAME.health]: active checks, run on the control loop.
enum class HealthType { tcp, http, send_expect, postgres, redis, mysql };
enum class HealthInitial { up, down };
enum class OnDown { keep, close_sessions, drain };
enum class OnRoleChange { keep, close_sessions };
enum class ExpectMatch { prefix, substring };
enum class RedisRole { master, replica, any };
enum class PostgresRole { primary, standby, any };
enum class MysqlRole { primary, replica, any };

struct StatusRange {
  int low = 200;
  int high = 399;  // inclusive
};

enum class ProxyProtocol { none, v1, v2 };

struct HealthConfig {
  HealthType type = HealthType::tcp;
  Duration interval = std::chrono::seconds(2);   // end of one check to start of the next
  Duration timeout = std::chrono::seconds(1);
  std::uint32_t rise = 2;
  std::uint32_t fall = 3;
  double jitter = 0.1;                           // fraction of interval ("10%" -> 0.1), 0..1
  std::uint16_t port = 0;                        // 0 = the server's own port
  // Default "up", but "down" for a check with a role (see parse_health).
  HealthInitial initial = HealthInitial::up;
  OnDown on_down = OnDown::keep;
  OnRoleChange on_role_change = OnRoleChange::close_sessions;  // role checks only
  Duration slow_start{0};                        // 0 = off
  // http
  std::string path = "/";
  std::string method = "GET";
  std::string host;                              // empty = the server's address text
  std::vector<StatusRange> expect_status{StatusRange{}};
  std::string expect_body;                       // empty = any body
  // send_expect (send_hex / expect_hex are decoded into these)
  std::string send;
  std::string expect;
  ExpectMatch expect_match = ExpectMatch::prefix;
  // The upstream's proxy_protocol: tcp, http and send_expect checks send the
  // header first (with the check connection's own addresses), as the
  // server expects it on every connection. Not a key of the table.
  ProxyProtocol send_proxy = ProxyProtocol::none;
  // redis
  RedisRole redis_role = RedisRole::any;         // key "role"
  // postgres
  PostgresRole postgres_role = PostgresRole::any; // key "role"
  std::string user = "postgres";
  std::string database = "postgres";
  std::string sslmode = "prefer";
  // mysql (user and password_file are shared with postgres)
  MysqlRole mysql_role = MysqlRole::any;          // key "role"
  bool galera = false;                            // also require a synced Galera node
  // mysql (and later postgres): a replica further behind is down; 0 = off
  Duration max_lag{0};
  // redis, postgres and mysql
  std::string password_file;                     // empty = no password
};

enum class AllDown { fail_closed, fail_open };

struct UpstreamConfig {
  std::string name;
  Balance balance = Balance::least_conn;
  std::uint32_t max_fails = 1;   // 0 disables passive health
  Duration fail_timeout = std::chrono::seconds(10);
  HashKey hash_key = HashKey::sni_or_client_ip;
  double hash_balance_factor = 0.0;  // 0 = off; otherwise > 1.0
  AllDown all_down = AllDown::fail_closed;
  // Another upstream's name: new sessions go there while none of this one's
  // servers is eligible (and on along that one's fallback). Empty = none.
  std::string fallback;
  ProxyProtocol proxy_protocol = ProxyProtocol::none;
  Duration drain_timeout{0};         // removed servers' sessions end after this; 0 = let them finish
  bool drain_timeout_set = false;    // written on the upstream (else [global]'s value, copied)
  // The wait queue behind max_conns (upstream/wait_queue.hpp): clients that
  // find every eligible server full wait, up to `queue` of them, each for
  // queue_timeout at most. 0 = off: such clients are refused at once.
  std::uint32_t queue = 0;
  Duration queue_timeout = std::chrono::seconds(10);
  std::optional<HealthConfig> health;
  std::vector<ServerConfig> servers;
  std::vector<DiscoveredEntry> discovered;  // servers from DNS, added to `servers` as answers come
  std::optional<SentinelConfig> sentinel;   // the server is the master Redis Sentinel names (then no `servers`)
};

enum class Preread { none, tls, postgres };
// The protocol a listener's clients speak, when the file says so: a client
// that sluice refuses is told why in that protocol (src/preread/refusal.hpp).
enum class ClientProtocol { none, postgres, mysql, redis };
enum class OnNotTls { use_default, close };
enum class OnMalformed { close, use_default };
enum class Splice { off, pipe, automatic };  // "off" | "pipe" | "auto"

struct Route {
  std::string sni;        // lower-case, no trailing dot; "*.suffix" for wildcards; empty = any
  std::string upstream;   // name of an [upstream.NAME]
  std::string alpn = {};  // an ALPN protocol the client must offer (exact bytes); empty = any
};

// A route as metrics and counters name it: its sni, and its alpn when it has
// one ("db.example.com alpn=postgresql", "alpn=h2"); unique within a listener.
inline std::string route_name(const Route& r) {
  if (r.alpn.empty()) return r.sni;
  return (r.sni.empty() ? "" : r.sni + " ") + "alpn=" + r.alpn;
}

struct ListenerConfig {
  std::string name;
  Endpoint listen;
  std::string upstream;                  // may be empty when prereading and default_upstream/routes are set
  Duration connect_timeout = std::chrono::seconds(5);
  Duration idle_timeout{0};              // 0 = off
  std::uint32_t tries = 3;               // connect attempts per session, >= 1
  Duration next_upstream_timeout{0};     // 0 = unlimited
  Duration fin_timeout = std::chrono::seconds(30);  // inactivity after the first FIN
  // A FIN is passed on and the other direction goes on (true), or the first
  // FIN, once the bytes before it are delivered, ends the session (false:
  // nginx's default, proxy_half_close off).
  bool half_close = true;
  Duration max_lifetime{0};              // 0 = off
  std::uint32_t backlog = 4096;  // the kernel caps it at net.core.somaxconn
  // TCP keepalive on both legs.
  bool tcp_keepalive = true;
  Duration tcp_keepalive_idle = std::chrono::seconds(60);
  Duration tcp_keepalive_interval = std::chrono::seconds(10);
  std::uint32_t tcp_keepalive_count = 6;
  // Preread (TLS ClientHello, or PostgreSQL SSLRequest + ClientHello)
  Preread preread = Preread::none;
  ClientProtocol protocol = ClientProtocol::none;  // preread = "postgres" implies postgres
  Duration preread_timeout = std::chrono::seconds(5);
  std::uint32_t preread_max_bytes = 16384;
  std::vector<Route> routes;
  std::string default_upstream;          // empty = none
  OnNotTls on_not_tls = OnNotTls::use_default;
  OnMalformed on_malformed = OnMalformed::close;
  // PROXY protocol from trusted peers (v1 or v2, detected)
  bool accept_proxy = false;
  std::vector<Cidr> trusted_proxies;     // required with accept_proxy
  // Access control and limits
  std::vector<Cidr> allow;               // empty = everyone (unless denied)
  std::vector<Cidr> deny;                // wins over allow
  std::uint64_t max_connections = 0;     // this listener; 0 = only the global limit
  std::uint32_t client_max_connections = 0;  // per client address; 0 = off
  RateLimit client_rate_limit;           // per client address; per_second 0 = off
  // Bulk data path
  Splice splice = Splice::off;
};

struct Config {
  std::string path;
  GlobalConfig global;
  AdminConfig admin;
  std::vector<ListenerConfig> listeners;
  std::map<std::string, UpstreamConfig> upstreams;  // by name
  ResolverConfig resolver;
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
