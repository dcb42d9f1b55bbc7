#include "log/escape.hpp"

#include <algorithm>
#include <cstdint>

namespace sluice {

namespace {

constexpr char kHex[] = "0123456789abcdef";

void append_hex_byte(std::string& out, unsigned char b) {
  out += '\\';
  out += 'x';
  out += kHex[b >> 4];
  out += kHex[b & 0x0f];
}

bool continuation(unsigned char b) { return (b & 0xc0) == 0x80; }

// Code points a reader may take for a line break or a field separator: C1
// controls (U+0085 is NEL), and Unicode's other white space.
bool separator_like(std::uint32_t cp) {
  return (cp >= 0x80 && cp <= 0xa0) || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000 || cp == 0xfeff;
}

// Decodes the valid UTF-8 sequence at the start of `s`: its length (0 when
// invalid) and, through `cp`, its code point.
std::size_t decode_utf8(std::string_view s, std::uint32_t& cp) {
  if (s.empty()) return 0;
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  std::size_t n = 0;
  std::uint32_t min = 0;
  if ((b0 & 0xe0) == 0xc0) {
    n = 2, cp = b0 & 0x1fu, min = 0x80;
  } else if ((b0 & 0xf0) == 0xe0) {
    n = 3, cp = b0 & 0x0fu, min = 0x800;
  } else if ((b0 & 0xf8) == 0xf0) {
    n = 4, cp = b0 & 0x07u, min = 0x10000;
  } else {
    return 0;  // continuation byte or 0xf8..0xff
  }
  if (s.size() < n) return 0;
  for (std::size_t i = 1; i < n; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (!continuation(b)) return 0;
    cp = (cp << 6) | (b & 0x3fu);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

std::string fmt_u_escape(std::uint32_t cp) {  // cp < 0x10000
  std::string out = "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(cp >> shift) & 0x0f];
  return out;
}

}  // namespace

std::size_t utf8_sequence_length(std::string_view s) {
  std::uint32_t cp = 0;
  return decode_utf8(s, cp);
}

void append_text_escaped(std::string& out, std::string_view value) {
  while (!value.empty()) {
    const auto b = static_cast<unsigned char>(value[0]);
    if (b > 0x20 && b < 0x7f) {
      if (b == '\\') out += '\\';
      out += static_cast<char>(b);
      value.remove_prefix(1);
      continue;
    }
    std::uint32_t cp = 0;
    const std::size_t n = b >= 0x80 ? decode_utf8(value, cp) : 0;
    if (n == 0 || separator_like(cp)) {
      for (std::size_t i = 0; i < std::max<std::size_t>(n, 1); ++i) {
        append_hex_byte(out, static_cast<unsigned char>(value[i]));
      }
      value.remove_prefix(std::max<std::size_t>(n, 1));
    } else {
      out.append(value.substr(0, n));
      value.remove_prefix(n);
    }
  }
}

void append_json_string(std::string& out, std::string_view value) {
  out += '"';
  while (!value.empty()) {
    const auto b = static_cast<unsigned char>(value[0]);
    if (b < 0x80) {
      switch (b) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          if (b < 0x20 || b == 0x7f) {
            out += "\\u00";
            out += kHex[b >> 4];
            out += kHex[b & 0x0f];
          } else {
            out += static_cast<char>(b);
          }
      }
      value.remove_prefix(1);
      continue;
    }
    std::uint32_t cp = 0;
    const std::size_t n = decode_utf8(value, cp);
    if (n == 0) {
      out += '\\';  // JSON's escaped backslash, then the byte as xHH
      append_hex_byte(out, b);
      value.remove_prefix(1);
    } else if (separator_like(cp)) {
      out += fmt_u_escape(cp);
      value.remove_prefix(n);
    } else {
      out.append(value.substr(0, n));
      value.remove_prefix(n);
    }
  }
  out += '"';
}

}  // namespace sluice
