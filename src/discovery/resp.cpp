#include "discovery/resp.hpp"

#include <algorithm>
#include <charconv>
#include <utility>

namespace sluice::discovery {

namespace {

bool number(std::string_view text, std::int64_t& n) {
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  return ec == std::errc() && p == text.data() + text.size() && !text.empty();
}

std::string too_long_line() { return "a reply line longer than " + std::to_string(kRespMaxLine) + " bytes"; }

}  // namespace

bool RespReader::fail(std::string why) {
  error_ = std::move(why);
  return false;
}

std::size_t RespReader::read(std::string_view in) {
  std::size_t pos = 0;
  while (pos < in.size() && !ready_ && !bad()) {
    // Every phase takes at least one byte, and the reply has room for no more.
    if (reply_bytes_ >= kRespMaxReply) {
      fail("a reply over " + std::to_string(kRespMaxReply) + " bytes");
      break;
    }
    ++reply_bytes_;
    switch (phase_) {
      case Phase::kind:
        ++examined_;
        kind_ = in[pos++];
        if (std::string_view("+-:$*").find(kind_) == std::string_view::npos) {
          fail("a reply that is not RESP");
          break;
        }
        line_.clear();
        phase_ = Phase::line;
        break;
      case Phase::line: {
        ++examined_;
        line_ += in[pos++];
        const bool whole = line_.size() >= 2 && line_[line_.size() - 2] == '\r' && line_.back() == '\n';
        if (whole) {
          line_.resize(line_.size() - 2);
          if (line_.size() > kRespMaxLine) {
            fail(too_long_line());
          } else {
            end_line();
          }
        } else if (line_.size() > kRespMaxLine) {
          fail(too_long_line());
        }
        break;
      }
      case Phase::bulk: {
        // Copied as it comes: no byte of a bulk string is looked at twice.
        // (The reply's count has this phase's first byte already.)
        const std::size_t n = std::min({bulk_left_, in.size() - pos, kRespMaxReply - reply_bytes_ + 1});
        value_.text.append(in.substr(pos, n));
        pos += n;
        examined_ += n;
        bulk_left_ -= n;
        reply_bytes_ += n - 1;
        if (bulk_left_ == 0) phase_ = Phase::bulk_end;
        break;
      }
      case Phase::bulk_end:
        ++examined_;
        if (in[pos++] != "\r\n"[crlf_seen_]) {
          fail("a bulk string not followed by CRLF");
          break;
        }
        if (++crlf_seen_ == 2) {
          phase_ = Phase::kind;
          finished(std::move(value_));
        }
        break;
    }
  }
  return pos;
}

// A line of `kind_` is whole in line_: a value, or the start of one.
bool RespReader::end_line() {
  phase_ = Phase::kind;
  RespValue v;
  switch (kind_) {
    case '+':
    case '-':
      v.type = kind_ == '+' ? RespValue::Type::simple : RespValue::Type::error;
      v.text = std::move(line_);
      finished(std::move(v));
      return true;
    case ':':
      if (!number(line_, v.integer)) return fail("a malformed length or integer in a reply");
      v.type = RespValue::Type::integer;
      finished(std::move(v));
      return true;
    case '$':
    case '*': {
      const bool bulk = kind_ == '$';
      const std::uint64_t max = bulk ? kRespMaxBulk : kRespMaxItems;
      std::int64_t n = 0;
      if (!number(line_, n)) return fail("a malformed length or integer in a reply");
      if (n < -1 || (n >= 0 && static_cast<std::uint64_t>(n) > max)) {
        return fail(std::string(bulk ? "a bulk string" : "an array") + " of " + std::to_string(n) + " " +
                    (bulk ? "bytes" : "items") + " (at most " + std::to_string(max) + ")");
      }
      if (n == -1) {
        finished(RespValue{});  // null
        return true;
      }
      if (bulk) {
        value_ = RespValue{};
        value_.type = RespValue::Type::bulk;
        bulk_left_ = static_cast<std::size_t>(n);
        crlf_seen_ = 0;
        phase_ = bulk_left_ > 0 ? Phase::bulk : Phase::bulk_end;
        return true;
      }
      if (open_.size() + 1 > kRespMaxDepth) {
        return fail("arrays nested more than " + std::to_string(kRespMaxDepth) + " deep");
      }
      v.type = RespValue::Type::array;
      if (n == 0) {
        finished(std::move(v));
        return true;
      }
      // Items are added as they come: a peer's count reserves nothing.
      open_.push_back({std::move(v), static_cast<std::size_t>(n)});
      return true;
    }
    default:
      return fail("a reply that is not RESP");  // not reached: read() takes only these kinds
  }
}

// `v` is whole: an item of the innermost open array (which may then be
// whole too), or the reply.
void RespReader::finished(RespValue v) {
  while (!open_.empty()) {
    Open& top = open_.back();
    top.array.items.push_back(std::move(v));
    if (top.array.items.size() < top.want) return;
    v = std::move(top.array);
    open_.pop_back();
  }
  reply_ = std::move(v);
  ready_ = true;
}

RespValue RespReader::take() {
  RespValue v = std::move(reply_);
  reply_ = RespValue{};
  ready_ = false;
  reply_bytes_ = 0;
  return v;
}

RespResult parse_resp(std::string_view in, RespValue& out, std::size_t& used, std::string& error) {
  RespReader reader;
  const std::size_t n = reader.read(in);
  out = RespValue{};
  if (reader.bad()) {
    error = reader.error();
    return RespResult::bad;
  }
  if (!reader.ready()) return RespResult::more;
  out = reader.take();
  used = n;
  return RespResult::done;
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
