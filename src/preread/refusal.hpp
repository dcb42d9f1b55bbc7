// Protocol-native refusals: what a client that sluice refuses (no server,
// a full or timed-out queue, a limit, the access list) is told in its own
// protocol before the close, so that its user reads that the load balancer
// refused it, and why, instead of "lost connection".
//
// Pure, like the ClientHello parser: the encoders of PostgreSQL's
// ErrorResponse, MySQL's ERR packet and a Redis error reply, and a reader
// fed the client's bytes that says when its first message is whole (the
// moment its protocol lets a server answer) and what to send. No sockets,
// no timers, no logging: the session does the I/O and owns the timeout.
//
// The text is sluice's own and fixed, ASCII only; the only name in it, the
// upstream's, comes from the configuration and is escaped all the same.
// Nothing the client sent is ever echoed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/cause.hpp"
#include "sluice/config.hpp"

namespace sluice::preread {

// Whether a session ending with `cause` before any server answered is a
// refusal the client is told about.
bool is_told_refusal(Cause cause);

// "sluice: no server available in upstream \"pg\" (no_server)". `upstream`
// may be empty (none chosen yet); `queue_full` tells a full wait queue
// from an upstream with no eligible server (both are no_server).
std::string refusal_message(Cause cause, std::string_view upstream, bool queue_full = false);

// PostgreSQL: an ErrorResponse of severity FATAL.
std::string pg_error_response(std::string_view sqlstate, std::string_view message);
// The SQLSTATE for `cause`: 57P03 (cannot_connect_now) when sluice has no
// server to give, 53300 (too_many_connections) when a limit or the queue
// refused, 28000 (invalid_authorization_specification) when the client may
// not connect at all (what the server itself sends for pg_hba).
std::string_view pg_sqlstate(Cause cause, bool queue_full = false);

// MySQL: an ERR packet as a server sends in place of its handshake
// (sequence 0, no SQLSTATE marker: no capabilities are agreed yet).
std::string mysql_err_packet(std::uint16_t code, std::string_view message);
// 1040 (ER_CON_COUNT_ERROR, "Too many connections") for every cause but
// the access list's 1130 (ER_HOST_NOT_PRIVILEGED).
std::uint16_t mysql_error_code(Cause cause);

// Redis: "-ERR <message>\r\n"; a CR or LF in `message` becomes a space.
std::string redis_error(std::string_view message);

// Reads the client's first message and says what to send.
class Refusal {
 public:
  // PostgreSQL's largest startup packet (the server's own limit), and a
  // first Redis command's (a request larger than this is answered, and
  // the rest of it is not read).
  static constexpr std::size_t kMaxPgStartup = 10000;
  static constexpr std::size_t kMaxRedisCommand = 64 * 1024;

  enum class Status {
    need_more,  // send `send` (PostgreSQL's 'N'), then read on
    done,       // send `send` (may be empty: nothing can be said), then close
  };
  struct Step {
    Status status = Status::need_more;
    std::string send;
  };

  Refusal(ClientProtocol protocol, Cause cause, std::string_view upstream, bool queue_full = false);

  // The bytes the client sent before the refusal (a preread's), then each
  // read; an empty span at first when there were none. MySQL's client waits
  // for the server to speak: its answer comes at once.
  Step feed(std::span<const std::uint8_t> data);

  // The error the client gets once its first message is whole.
  const std::string& reply() const { return reply_; }

 private:
  Step feed_postgres();
  Step feed_redis();

  ClientProtocol protocol_;
  std::string reply_;
  std::vector<std::uint8_t> head_;  // what is read of the current message
  unsigned negotiations_ = 0;       // SSLRequests and GSSENCRequests answered 'N'
  bool done_ = false;
};

}  // namespace sluice::preread
