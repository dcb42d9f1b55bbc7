// Quoting of user-supplied text inside error messages.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace sluice {

// `text` in double quotes, with quotes, backslashes and control bytes escaped,
// so a message stays on one line and shows exactly what the file says.
inline std::string quote(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out += '"';
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(byte));
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

}  // namespace sluice
