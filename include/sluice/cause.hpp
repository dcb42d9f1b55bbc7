// Why a session ended. Exactly one per session, logged and counted.
#pragma once

#include <cstddef>
#include <string_view>

namespace sluice {

enum class Cause : unsigned char {
  none,              // still running
  client_closed,     // client sent FIN first, both directions finished
  server_closed,     // server sent FIN first, both directions finished
  client_reset,      // read/write error on the client side
  server_reset,      // read/write error on the server side
  idle_timeout,      // no bytes either way for idle_timeout
  connect_failed,    // all tries used (or next_upstream_timeout passed)
  no_server,         // no eligible server at all
  preread_timeout,   // ClientHello not complete within preread_timeout
  preread_malformed, // ClientHello malformed (on_malformed = "close") or too large
  rejected_not_tls,  // not TLS and on_not_tls = "close"
  limit_reached,     // global or listener max_connections reached
  acl_denied,        // client address refused by the listener's allow/deny
  shutdown,          // closed by graceful stop after shutdown_timeout
  server_down,       // active checks marked the server down (on_down = "close_sessions")
  server_drained,    // the server was disabled, or removed and drain_timeout passed
  internal_error,    // a failure inside sluice that is none of the above
  fin_timeout,       // one side half-closed, then nothing moved for fin_timeout
  max_lifetime,      // session older than max_lifetime
  local_resource,    // sluice's own resources ran out (fds, ports, buffers)
  rejected_proxy,    // accept_proxy: untrusted peer, or a bad/missing PROXY header
  client_limit,      // client_max_connections reached for this client address
  rate_limited,      // client_rate_limit exceeded for this client address
  server_no_tls,     // preread = "postgres": the server refused TLS (answered 'N')
  queue_timeout,     // waited in the upstream's queue (every server full) for queue_timeout
  fenced,            // the server lost its place as the one writer (another primary won, or a failover began)
  admin,             // closed by an operator through the admin API (a retired server's sessions)
  upgrade,           // a binary upgrade's old process: could not hand it over within upgrade_finish_timeout
};

inline constexpr std::size_t kCauseCount = static_cast<std::size_t>(Cause::upgrade) + 1;

constexpr std::string_view to_string(Cause c) {
  switch (c) {
    case Cause::none: return "none";
    case Cause::client_closed: return "client_closed";
    case Cause::server_closed: return "server_closed";
    case Cause::client_reset: return "client_reset";
    case Cause::server_reset: return "server_reset";
    case Cause::idle_timeout: return "idle_timeout";
    case Cause::connect_failed: return "connect_failed";
    case Cause::no_server: return "no_server";
    case Cause::preread_timeout: return "preread_timeout";
    case Cause::preread_malformed: return "preread_malformed";
    case Cause::rejected_not_tls: return "rejected_not_tls";
    case Cause::limit_reached: return "limit_reached";
    case Cause::acl_denied: return "acl_denied";
    case Cause::shutdown: return "shutdown";
    case Cause::server_down: return "server_down";
    case Cause::server_drained: return "server_drained";
    case Cause::internal_error: return "internal_error";
    case Cause::fin_timeout: return "fin_timeout";
    case Cause::max_lifetime: return "max_lifetime";
    case Cause::local_resource: return "local_resource";
    case Cause::rejected_proxy: return "rejected_proxy";
    case Cause::client_limit: return "client_limit";
    case Cause::rate_limited: return "rate_limited";
    case Cause::server_no_tls: return "server_no_tls";
    case Cause::queue_timeout: return "queue_timeout";
    case Cause::fenced: return "fenced";
    case Cause::admin: return "admin";
    case Cause::upgrade: return "upgrade";
  }
  return "unknown";
}

}  // namespace sluice
