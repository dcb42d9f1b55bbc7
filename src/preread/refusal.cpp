#include "preread/refusal.hpp"

#include <algorithm>
#include <optional>

#include "preread/client_hello.hpp"
#include "preread/postgres.hpp"

namespace sluice::preread {

namespace {

constexpr std::uint32_t kPgGssEncRequest = 80877104;
constexpr std::uint32_t kPgCancelRequest = 80877102;
constexpr std::size_t kMaxName = 64;  // of an upstream's name in a message

std::uint32_t be32(const std::uint8_t* b) {
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
}

void put_be32(std::string& out, std::uint32_t v) {
  out += static_cast<char>(v >> 24);
  out += static_cast<char>(v >> 16);
  out += static_cast<char>(v >> 8);
  out += static_cast<char>(v);
}

// Configuration names are [A-Za-z0-9_.-]; anything else (and a name too
// long for a one-line message) is shown escaped or cut all the same.
std::string quoted_name(std::string_view name) {
  std::string out = "\"";
  std::size_t n = 0;
  for (const char ch : name) {
    if (++n > kMaxName) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += ch;
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  out += '"';
  return out;
}

// A Redis command's end: the offset past it, 0 while it is incomplete.
// A request Redis would call a protocol error counts as whole: it is
// answered like any other. Every length read is bounded by the buffer,
// which the caller caps.
std::size_t redis_command_end(std::span<const std::uint8_t> b) {
  std::size_t pos = 0;
  // A line: the offset past its "\n", or nullopt when it has not come yet.
  auto line_end = [&b](std::size_t from) -> std::optional<std::size_t> {
    for (std::size_t i = from; i < b.size(); ++i) {
      if (b[i] == '\n') return i + 1;
    }
    return std::nullopt;
  };
  // "<digits>\r\n" after a type byte at `pos`: the number, or -1 when the
  // line is not a number; nullopt while the line is incomplete.
  auto number_line = [&](std::size_t at, std::size_t& next) -> std::optional<long long> {
    const auto end = line_end(at + 1);
    if (!end) return std::nullopt;
    next = *end;
    long long v = 0;
    bool any = false;
    bool negative = false;
    for (std::size_t i = at + 1; i < *end - 1; ++i) {
      const auto c = b[i];
      if (c == '\r' && i == *end - 2) break;
      if (c == '-' && i == at + 1) {
        negative = true;
        continue;
      }
      if (c < '0' || c > '9' || v > 1'000'000'000'000LL) return -1;
      v = v * 10 + (c - '0');
      any = true;
    }
    if (!any) return -1;
    return negative ? -v : v;
  };
  if (b.empty()) return 0;
  if (b[0] != '*') {
    // An inline command: one line.
    const auto end = line_end(0);
    return end ? *end : 0;
  }
  std::size_t next = 0;
  const auto count = number_line(pos, next);
  if (!count) return 0;
  if (*count <= 0) return next;  // malformed, or an empty request: either way, whole
  pos = next;
  for (long long i = 0; i < *count; ++i) {
    if (pos >= b.size()) return 0;
    if (b[pos] != '$') return pos + 1;  // a protocol error: answered now
    const auto len = number_line(pos, next);
    if (!len) return 0;
    if (*len < 0) return next;
    // Its bytes and "\r\n"; a length past the cap is answered now too.
    if (static_cast<unsigned long long>(*len) > Refusal::kMaxRedisCommand) return next;
    pos = next + static_cast<std::size_t>(*len) + 2;
    if (pos > b.size()) return 0;
  }
  return pos;
}

}  // namespace

bool is_told_refusal(Cause cause) {
  switch (cause) {
    case Cause::no_server:
    case Cause::connect_failed:
    case Cause::queue_timeout:
    case Cause::limit_reached:
    case Cause::client_limit:
    case Cause::rate_limited:
    case Cause::acl_denied:
    case Cause::rejected_not_tls:
      return true;
    default:
      return false;
  }
}

std::string refusal_message(Cause cause, std::string_view upstream, bool queue_full) {
  const std::string up = upstream.empty() ? std::string() : "upstream " + quoted_name(upstream);
  // Refused before any server was tried: the upstream it would have gone to.
  const std::string before = up.empty() ? std::string() : ", before " + up;
  std::string what;
  switch (cause) {
    case Cause::no_server:
      if (queue_full) {
        what = "every server of " + (up.empty() ? std::string("the upstream") : up) + " is busy and its queue is full";
      } else {
        what = up.empty() ? "no upstream for this connection" : "no server available in " + up;
      }
      break;
    case Cause::connect_failed:
      what = "no server of " + (up.empty() ? std::string("the upstream") : up) + " could be reached";
      break;
    case Cause::queue_timeout:
      what = "every server of " + (up.empty() ? std::string("the upstream") : up) +
             " stayed busy until the queue timed out";
      break;
    case Cause::limit_reached: what = "too many connections" + before; break;
    case Cause::client_limit: what = "too many connections from this address" + before; break;
    case Cause::rate_limited: what = "too many new connections from this address" + before; break;
    case Cause::acl_denied: what = "this address is not allowed" + before; break;
    case Cause::rejected_not_tls: what = "only TLS connections are accepted here" + before; break;
    default: what = "connection refused" + before; break;
  }
  return "sluice: " + what + " (" + std::string(to_string(cause)) + ")";
}

std::string pg_error_response(std::string_view sqlstate, std::string_view message) {
  std::string body;
  auto field = [&body](char type, std::string_view value) {
    body += type;
    body.append(value);
    body += '\0';
  };
  field('S', "FATAL");
  field('V', "FATAL");  // the severity that is never translated (protocol 3.0, PostgreSQL 9.6+)
  field('C', sqlstate);
  field('M', message);
  body += '\0';
  std::string out = "E";
  put_be32(out, static_cast<std::uint32_t>(body.size() + 4));
  return out + body;
}

std::string_view pg_sqlstate(Cause cause, bool queue_full) {
  switch (cause) {
    case Cause::acl_denied:
    case Cause::rejected_not_tls:
      return "28000";
    case Cause::queue_timeout:
    case Cause::limit_reached:
    case Cause::client_limit:
    case Cause::rate_limited:
      return "53300";
    case Cause::no_server:
      return queue_full ? "53300" : "57P03";
    default:
      return "57P03";
  }
}

std::string mysql_err_packet(std::uint16_t code, std::string_view message) {
  std::string body;
  body += static_cast<char>(0xff);
  body += static_cast<char>(code & 0xff);
  body += static_cast<char>(code >> 8);
  body.append(message.substr(0, 512));  // MySQL's own bound on a message
  std::string out;
  const auto len = static_cast<std::uint32_t>(body.size());
  out += static_cast<char>(len & 0xff);
  out += static_cast<char>((len >> 8) & 0xff);
  out += static_cast<char>((len >> 16) & 0xff);
  out += '\0';  // sequence 0: the server's first packet
  return out + body;
}

std::uint16_t mysql_error_code(Cause cause) { return cause == Cause::acl_denied ? 1130 : 1040; }

std::string redis_error(std::string_view message) {
  std::string out = "-ERR ";
  for (const char c : message) out += c == '\r' || c == '\n' ? ' ' : c;
  out += "\r\n";
  return out;
}

Refusal::Refusal(ClientProtocol protocol, Cause cause, std::string_view upstream, bool queue_full)
    : protocol_(protocol) {
  const std::string message = refusal_message(cause, upstream, queue_full);
  switch (protocol) {
    case ClientProtocol::postgres: reply_ = pg_error_response(pg_sqlstate(cause, queue_full), message); break;
    case ClientProtocol::mysql: reply_ = mysql_err_packet(mysql_error_code(cause), message); break;
    case ClientProtocol::redis: reply_ = redis_error(message); break;
    case ClientProtocol::none: break;
  }
}

Refusal::Step Refusal::feed(std::span<const std::uint8_t> data) {
  if (done_) return {Status::done, {}};
  // What a client that already speaks TLS (a preread routed its
  // ClientHello, or answered PostgreSQL's SSLRequest with 'S') cannot read:
  // plain text would only break its handshake.
  if (head_.empty() && !data.empty() && data[0] == kTlsHandshake && negotiations_ == 0) {
    done_ = true;
    return {Status::done, {}};
  }
  Step step;
  switch (protocol_) {
    case ClientProtocol::mysql:
      // The server speaks first: the ERR takes the handshake's place.
      done_ = true;
      return {Status::done, reply_};
    case ClientProtocol::none:
      done_ = true;
      return {Status::done, {}};
    case ClientProtocol::postgres:
      head_.insert(head_.end(), data.begin(), data.end());
      step = feed_postgres();
      break;
    case ClientProtocol::redis: {
      const std::size_t room = kMaxRedisCommand - head_.size();
      head_.insert(head_.end(), data.begin(), data.begin() + static_cast<std::ptrdiff_t>(std::min(room, data.size())));
      step = feed_redis();
      break;
    }
  }
  if (step.status == Status::done) done_ = true;
  return step;
}

// Messages until the startup packet: an SSLRequest or GSSENCRequest is
// answered 'N' (sluice has no TLS of its own to offer; the client goes on
// in plain text, as `sslmode=prefer` does), a CancelRequest gets nothing,
// and a StartupMessage gets the error, as a server that cannot take the
// connection answers it.
Refusal::Step Refusal::feed_postgres() {
  Step step;
  while (true) {
    if (head_.empty()) return step;
    if (head_[0] == kTlsHandshake) return {Status::done, std::move(step.send)};  // TLS after 'N': nothing to say
    if (head_.size() < 4) return step;
    const std::uint32_t len = be32(head_.data());
    if (len < 8 || len > kMaxPgStartup) return {Status::done, std::move(step.send)};
    if (head_.size() < len) return step;
    const std::uint32_t code = be32(head_.data() + 4);
    if (code == kPgCancelRequest) return {Status::done, std::move(step.send)};
    if (len == 8 && (code == kSslRequestCode || code == kPgGssEncRequest) && negotiations_ < 2) {
      ++negotiations_;
      step.send += 'N';
      head_.erase(head_.begin(), head_.begin() + 8);
      continue;
    }
    step.send += reply_;
    step.status = Status::done;
    return step;
  }
}

Refusal::Step Refusal::feed_redis() {
  if (redis_command_end(head_) != 0 || head_.size() >= kMaxRedisCommand) return {Status::done, reply_};
  return {};
}

}  // namespace sluice::preread
