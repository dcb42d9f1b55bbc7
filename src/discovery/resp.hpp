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

enum class RespResult { done, more, bad };

// Parses the first reply in `in`. done: `out` holds it and `used` the bytes
// it took; more: the reply is not complete yet; bad: `error` says why (the
// connection is then useless).
RespResult parse_resp(std::string_view in, RespValue& out, std::size_t& used, std::string& error);

// A command as RESP: an array of bulk strings.
std::string resp_command(const std::vector<std::string>& args);

}  // namespace sluice::discovery
