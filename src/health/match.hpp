// The pure decisions of the checks: status ranges, expected replies, and how
// a peer's bytes are quoted in a reason.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config.hpp"

namespace sluice::health {

// Bytes kept from a reply for matching (HTTP body, send_expect reply).
inline constexpr std::size_t kMaxReplyBytes = 64 * 1024;

// Is `status` inside one of the (inclusive) ranges?
bool status_matches(int status, const std::vector<StatusRange>& ranges);

// "200-399", "200,204,300-399" for reasons and logs.
std::string format_ranges(const std::vector<StatusRange>& ranges);

enum class Expect { matched, need_more, mismatch };

// Does `reply` (everything read so far) satisfy `expect`? With `prefix`, a
// reply that already differs from the expectation is a mismatch at once;
// with `substring`, only the end of the reply (EOF or the byte cap) makes it
// one, which is the caller's call.
Expect match_expect(std::string_view reply, std::string_view expect, ExpectMatch mode);

// A library's error text in the style of our reasons: "Connection refused"
// (strerror, as hiredis and libpq report it) -> "connection refused", like
// libuv's. Words in capitals ("FATAL: ...") are left alone.
std::string lower_first(std::string text);

// A peer's bytes for a reason: printable ASCII as is, the rest as \xNN,
// at most `max` input bytes, then "...".
std::string quote_bytes(std::string_view bytes, std::size_t max = 32);

}  // namespace sluice::health
