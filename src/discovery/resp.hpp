// RESP (the Redis protocol) replies as Sentinel sends them: simple strings,
// errors, integers, bulk strings (and null), arrays. Bounded: a sentinel is
// a peer, and its bytes must not make the control loop hold or build an
// unbounded value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::discovery {

struct RespValue {
  enum class Type { simple, error, integer, bulk, null, array };
  Type type = Type::null;
  std::string text;              // simple, error, bulk
  std::int64_t integer = 0;
  std::vector<RespValue> items;  // array
};

// Limits of one reply; anything larger is a protocol error.
inline constexpr std::size_t kRespMaxBulk = 64 * 1024;
inline constexpr std::size_t kRespMaxItems = 64;
inline constexpr std::size_t kRespMaxDepth = 4;
inline constexpr std::size_t kRespMaxLine = 1024;  // a "+...", "-...", ":..." or header line
// One reply's bytes, everything in it counted: a bulk string at its cap and
// the lines around it fit; 64 of them do not.
inline constexpr std::size_t kRespMaxReply = kRespMaxBulk + 4096;

enum class RespResult { done, more, bad };

// Reads the replies of one connection from its bytes as they arrive, each
// byte looked at once: the work is linear in what the peer sends however
// it cuts it (a reply sent a byte per segment is not parsed again from its
// start for every byte). What it holds is the reply being read, bounded by
// the caps above.
class RespReader {
 public:
  // Takes bytes from the front of `in` up to the end of the next whole reply
  // (all of `in` when no reply ends in it) and returns how many it took.
  // Takes nothing while a reply is ready() and not taken, or once bad().
  std::size_t read(std::string_view in);
  // A whole reply is waiting: take() it.
  bool ready() const { return ready_; }
  RespValue take();
  // The bytes broke the protocol or a cap: error() says how; the
  // connection is then useless.
  bool bad() const { return !error_.empty(); }
  const std::string& error() const { return error_; }
  // Bytes looked at since the start, every reply counted.
  std::uint64_t examined() const { return examined_; }

 private:
  enum class Phase {
    kind,      // the next byte says what the value is
    line,      // the rest of a "+", "-", ":", "$" or "*" line, up to CRLF
    bulk,      // a bulk string's bytes
    bulk_end,  // the CRLF after them
  };
  // An array whose items are being read.
  struct Open {
    RespValue array;
    std::size_t want = 0;
  };

  bool fail(std::string why);
  bool end_line();
  void finished(RespValue v);

  Phase phase_ = Phase::kind;
  char kind_ = 0;
  std::string line_;            // the line so far (CRLF included once it has come)
  RespValue value_;             // the bulk string being read
  std::size_t bulk_left_ = 0;   // its bytes still to come
  std::size_t crlf_seen_ = 0;   // bytes of the CRLF after it seen
  std::vector<Open> open_;      // the arrays around the value being read, outermost first
  std::size_t reply_bytes_ = 0;
  bool ready_ = false;
  RespValue reply_;
  std::string error_;
  std::uint64_t examined_ = 0;
};

// The first reply in `in` (a RespReader fed `in`). done: `out` holds it and
// `used` the bytes it took; more: the reply is not complete yet; bad:
// `error` says why. A connection keeps one RespReader instead: calling this
// again with more bytes reads the reply again from its start.
RespResult parse_resp(std::string_view in, RespValue& out, std::size_t& used, std::string& error);

// A command as RESP: an array of bulk strings.
std::string resp_command(const std::vector<std::string>& args);

}  // namespace sluice::discovery
