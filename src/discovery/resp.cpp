#include "discovery/resp.hpp"

#include <charconv>

namespace sluice::discovery {

namespace {

struct Parser {
  std::string_view in;
  std::size_t pos = 0;
  std::string error;

  // The line at pos (without CRLF): false when incomplete or bad.
  RespResult line(std::string_view& out) {
    const std::size_t end = in.find("\r\n", pos);
    if (end == std::string_view::npos) {
      if (in.size() - pos > kRespMaxLine) {
        error = "a reply line longer than " + std::to_string(kRespMaxLine) + " bytes";
        return RespResult::bad;
      }
      return RespResult::more;
    }
    if (end - pos > kRespMaxLine) {
      error = "a reply line longer than " + std::to_string(kRespMaxLine) + " bytes";
      return RespResult::bad;
    }
    out = in.substr(pos, end - pos);
    pos = end + 2;
    return RespResult::done;
  }

  bool number(std::string_view text, std::int64_t& n) {
    const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
    if (ec != std::errc() || p != text.data() + text.size() || text.empty()) {
      error = "a malformed length or integer in a reply";
      return false;
    }
    return true;
  }

  // A bulk string's or an array's length: -1 (a null) or 0 to `max`.
  RespResult length(std::string_view text, std::uint64_t max, const char* what, const char* unit, std::int64_t& n) {
    if (!number(text, n)) return RespResult::bad;
    if (n < -1 || (n >= 0 && static_cast<std::uint64_t>(n) > max)) {
      error = std::string(what) + " of " + std::to_string(n) + " " + unit + " (at most " + std::to_string(max) + ")";
      return RespResult::bad;
    }
    return RespResult::done;
  }

  RespResult value(RespValue& out, std::size_t depth) {
    if (pos >= in.size()) return RespResult::more;
    const char kind = in[pos++];
    std::string_view text;
    if (RespResult r = line(text); r != RespResult::done) return r;
    switch (kind) {
      case '+':
        out.type = RespValue::Type::simple;
        out.text.assign(text);
        return RespResult::done;
      case '-':
        out.type = RespValue::Type::error;
        out.text.assign(text);
        return RespResult::done;
      case ':':
        out.type = RespValue::Type::integer;
        return number(text, out.integer) ? RespResult::done : RespResult::bad;
      case '$': {
        std::int64_t n = 0;
        if (RespResult r = length(text, kRespMaxBulk, "a bulk string", "bytes", n); r != RespResult::done) return r;
        if (n == -1) {
          out.type = RespValue::Type::null;
          return RespResult::done;
        }
        const auto len = static_cast<std::size_t>(n);
        if (in.size() - pos < len + 2) return RespResult::more;
        if (in.substr(pos + len, 2) != "\r\n") {
          error = "a bulk string not followed by CRLF";
          return RespResult::bad;
        }
        out.type = RespValue::Type::bulk;
        out.text.assign(in.substr(pos, len));
        pos += len + 2;
        return RespResult::done;
      }
      case '*': {
        std::int64_t n = 0;
        if (RespResult r = length(text, kRespMaxItems, "an array", "items", n); r != RespResult::done) return r;
        if (n == -1) {
          out.type = RespValue::Type::null;
          return RespResult::done;
        }
        if (depth + 1 > kRespMaxDepth) {
          error = "arrays nested more than " + std::to_string(kRespMaxDepth) + " deep";
          return RespResult::bad;
        }
        out.type = RespValue::Type::array;
        out.items.assign(static_cast<std::size_t>(n), RespValue{});
        for (RespValue& item : out.items) {
          if (RespResult r = value(item, depth + 1); r != RespResult::done) return r;
        }
        return RespResult::done;
      }
      default:
        error = "a reply that is not RESP";
        return RespResult::bad;
    }
  }
};

}  // namespace

RespResult parse_resp(std::string_view in, RespValue& out, std::size_t& used, std::string& error) {
  Parser p;
  p.in = in;
  out = RespValue{};
  const RespResult r = p.value(out, 0);
  if (r == RespResult::done) used = p.pos;
  if (r == RespResult::bad) error = std::move(p.error);
  return r;
}

std::string resp_command(const std::vector<std::string>& args) {
  std::string out = "*" + std::to_string(args.size()) + "\r\n";
  for (const std::string& a : args) {
    out += "$" + std::to_string(a.size()) + "\r\n";
    out += a;
    out += "\r\n";
  }
  return out;
}

}  // namespace sluice::discovery
