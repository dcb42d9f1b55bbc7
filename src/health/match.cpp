#include "health/match.hpp"

#include <cstdio>

namespace sluice::health {

bool status_matches(int status, const std::vector<StatusRange>& ranges) {
  for (const StatusRange& r : ranges) {
    if (status >= r.low && status <= r.high) return true;
  }
  return false;
}

std::string format_ranges(const std::vector<StatusRange>& ranges) {
  std::string out;
  for (const StatusRange& r : ranges) {
    if (!out.empty()) out += ',';
    out += std::to_string(r.low);
    if (r.high != r.low) out += "-" + std::to_string(r.high);
  }
  return out;
}

Expect match_expect(std::string_view reply, std::string_view expect, ExpectMatch mode) {
  if (mode == ExpectMatch::substring) {
    return reply.find(expect) != std::string_view::npos ? Expect::matched : Expect::need_more;
  }
  if (reply.size() >= expect.size()) {
    return reply.substr(0, expect.size()) == expect ? Expect::matched : Expect::mismatch;
  }
  return expect.substr(0, reply.size()) == reply ? Expect::need_more : Expect::mismatch;
}

std::string lower_first(std::string text) {
  if (text.size() >= 2 && text[0] >= 'A' && text[0] <= 'Z' && text[1] >= 'a' && text[1] <= 'z') {
    text[0] = static_cast<char>(text[0] - 'A' + 'a');
  }
  return text;
}

std::string quote_bytes(std::string_view bytes, std::size_t max) {
  std::string out = "\"";
  for (std::size_t i = 0; i < bytes.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  out += '"';
  if (bytes.size() > max) out += "...";
  return out;
}

}  // namespace sluice::health
