// The long-lived half of the runtime: state that must outlive any one
// configuration. Server state is keyed by upstream name + the socket address
// the server resolves to (family, IP, IPv6 scope, port), never by how the
// file spells it: "[0:0:0:0:0:0:0:1]:5432" and "[::1]:5432" are one server,
// and a host name that resolves elsewhere after a reload is a new one. So a
// reload that keeps a server keeps its active count, health, drain flag and
// runtime weight; a reload that removes one forgets it. Process and listener
// counters live here too, so that a reload never resets max_connections
// accounting or what /metrics reports.
//
// Lookups take a lock; they happen only while a Snapshot is built (control
// loop). The data path holds shared_ptrs and touches only atomics.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/client_table.hpp"
#include "sluice/cause.hpp"
#include "sluice/config.hpp"
#include "sluice/histogram.hpp"
#include "upstream/server_state.hpp"
#include "upstream/wait_queue.hpp"

namespace sluice {

class AccessLog;

struct CauseCounters {
  std::array<std::atomic<std::uint64_t>, kCauseCount> by_cause{};
  void add(Cause c) { by_cause[static_cast<std::size_t>(c)].fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t get(Cause c) const { return by_cause[static_cast<std::size_t>(c)].load(std::memory_order_relaxed); }
};

// Session duration buckets (seconds): from a refused connection to a
// database session that lasts the day.
inline constexpr std::array<double, 12> kSessionBuckets = {0.001, 0.01, 0.1,  1.0,    10.0,    60.0,
                                                           300.0, 900.0, 1800.0, 3600.0, 21600.0, 86400.0};

// One SNI route of a listener (or its default route): the configured name,
// never the client's, so there are as many as the file has routes.
struct RouteStats {
  std::atomic<std::uint64_t> sessions{0};   // sessions routed here
  std::atomic<std::uint64_t> bytes_in{0};   // at session end
  std::atomic<std::uint64_t> bytes_out{0};  // at session end
};

struct ListenerStats {
  std::atomic<std::uint64_t> active{0};    // client connections open now
  std::atomic<std::uint64_t> accepted{0};  // since start
  std::atomic<std::uint64_t> bytes_in{0};  // delivered client -> server (at session end)
  std::atomic<std::uint64_t> bytes_out{0}; // delivered server -> client (at session end)
  CauseCounters closed;
  ClientTable clients;  // client_max_connections, client_rate_limit
  std::atomic<std::uint64_t> peak_active{0};  // highest `active` since start
  Histogram<kSessionBuckets.size()> session_seconds{kSessionBuckets};  // at session end
  // The counters of route `sni` ("" for the default route), kept across
  // reloads like the rest. Control loop only (Snapshot::build).
  std::shared_ptr<RouteStats> route(const std::string& sni);

 private:
  std::mutex routes_mu_;
  std::map<std::string, std::shared_ptr<RouteStats>> routes_;
};

struct ProcessCounters {
  std::atomic<std::uint64_t> connections{0};  // open client connections, all listeners
  CauseCounters closed;
  std::atomic<std::uint64_t> accept_pauses{0};  // EMFILE/ENFILE back-offs
  std::atomic<std::uint64_t> local_errors{0};   // our own resource errors on connect
  std::atomic<std::uint64_t> refusing{0};       // sessions telling a refused client why (bounded)
};

// A resolved address as an identity: family, IP, IPv6 scope and port, as
// bytes. Two spellings of one address give the same identity; an address
// without a family (never resolved) gives its text, so it is still unique.
std::string server_identity(const Endpoint& address);

// A server that a reload or a DNS change removed while sessions still used
// it: those sessions go on (until they end, or its drain_timeout), and this
// is how /status, /metrics and the admin API still find them.
struct RetiredServer {
  std::string upstream;
  std::shared_ptr<ServerState> state;
  std::int64_t retired_at_ms = 0;  // wall clock of the removal
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The state of `server` in `upstream`: the one the current Snapshot has
  // for the same resolved address, else a new one. Passive health takes the
  // upstream's current parameters. A state keeps the address text it was
  // created with (logs, /status and /metrics labels stay steady while the
  // server stays); the file's current spelling is in the Snapshot's member.
  std::shared_ptr<ServerState> server(const UpstreamConfig& upstream, const ServerConfig& server);
  // Called once a new Snapshot holds `kept`: every other server was removed
  // by the reload. Old Snapshots (sessions still running) keep their state
  // objects, but a later reload that adds such a server back gets a fresh
  // one: what was set on it at run time (drain, weight, health) is
  // forgotten, as if it had never been there, however long its old
  // sessions last.
  void forget_servers_except(const std::vector<const ServerState*>& kept);
  // The server states the registry still knows (those of the current Snapshot).
  std::vector<std::shared_ptr<ServerState>> servers() const;

  // `state` left upstream `upstream` (a reload or a DNS change): remembered,
  // without keeping it alive, for as long as an old Snapshot holds it.
  void retire(const std::string& upstream, const std::shared_ptr<ServerState>& state);
  // The retired servers that have live sessions now, by upstream name and
  // address text (the oldest retirement first). Drops those no Snapshot
  // holds any more.
  std::vector<RetiredServer> retired();

  std::shared_ptr<ListenerStats> listener(const std::string& name);
  // Sessions that upstream `from` sent on to its fallback `to` (kept across
  // reloads while the pair stays).
  std::shared_ptr<std::atomic<std::uint64_t>> fallback_counter(const std::string& from, const std::string& to);

  // The wait queue of upstream `name` (`queue` > 0): one per name for the
  // process, kept across reloads, so that a reload neither reorders nor
  // forgets its waiters and its counters go on.
  std::shared_ptr<WaitQueue> queue(const std::string& name);
  // The queues of upstreams that have one now or had one (for /status and /metrics).
  std::map<std::string, std::shared_ptr<WaitQueue>> queues() const;

  ProcessCounters& counters() { return counters_; }
  const ProcessCounters& counters() const { return counters_; }

  // The access log for `global`: the one in use when its target and format
  // are unchanged (so a reload neither reopens nor loses records), a new one
  // otherwise. Throws std::runtime_error when a new file cannot be opened.
  std::shared_ptr<AccessLog> access_log(const GlobalConfig& global);

 private:
  // (upstream name, server_identity(address)).
  using ServerKey = std::pair<std::string, std::string>;

  mutable std::mutex mu_;
  std::map<ServerKey, std::weak_ptr<ServerState>> servers_;
  // (upstream name, address as written) -> the state it named last, to
  // tell the operator when a name now resolves elsewhere.
  std::map<std::pair<std::string, std::string>, std::weak_ptr<ServerState>> by_text_;
  std::map<std::string, std::shared_ptr<ListenerStats>> listeners_;
  std::map<std::pair<std::string, std::string>, std::shared_ptr<std::atomic<std::uint64_t>>> fallbacks_;
  std::map<std::string, std::shared_ptr<WaitQueue>> queues_;
  struct Retired {
    std::string upstream;
    std::weak_ptr<ServerState> state;
    std::int64_t at_ms = 0;
  };
  std::vector<Retired> retired_;  // in the order of retirement
  ProcessCounters counters_;
  std::shared_ptr<AccessLog> access_log_;
  std::string access_log_key_;
};

}  // namespace sluice
