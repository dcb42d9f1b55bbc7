// libFuzzer target for the admin API's request parser (RequestParser).
//
// Input layout: byte 0 picks the header and body limits, bytes 1..2 seed the
// split generator, the rest is what a client sends. The bytes are fed once
// whole and once in chunks whose sizes come from the seed. Invariants: both
// reach the same state and the same request (or a rejection for the same
// reason, see below); a decided parser keeps its answer; a complete request
// stays within the limits, has lower-case header names and a method; a
// rejection is 400 with a reason, or 413 or 431 without one; the end of the
// headers is seen at the same point either way, and from then on the method
// and the path are known. Anything else (or a sanitizer report) aborts.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "admin/request_parser.hpp"

using sluice::admin::Request;
using sluice::admin::RequestParser;
using State = RequestParser::State;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

bool same(const Request& a, const Request& b) {
  return a.method == b.method && a.path == b.path && a.query == b.query && a.headers == b.headers &&
         a.body == b.body;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  // Mostly the server's own limits; often small ones so that they are hit.
  static constexpr std::size_t kHeader[] = {64 * 1024, 64 * 1024, 256, 32, 8, 1};
  static constexpr std::size_t kBody[] = {1024 * 1024, 16, 1, 0};
  const std::size_t max_header = kHeader[data[0] % 6];
  const std::size_t max_body = kBody[(data[0] / 6) % 4];
  std::uint32_t rng = (std::uint32_t{data[1]} << 8 | data[2]) * 2654435761U + 1;
  const char* stream = reinterpret_cast<const char*>(data + 3);
  const std::size_t len = size - 3;

  RequestParser whole(max_header, max_body);
  const State a = whole.feed(stream, len);
  check(whole.state() == a);

  RequestParser split(max_header, max_body);
  State b = split.state();
  check(b == State::need_more);
  std::size_t pos = 0;
  while (pos < len) {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    // Mostly short chunks (a slow client), sometimes empty or long ones.
    std::size_t n = rng % 16 == 0 ? 0 : 1 + (rng >> 8) % (rng % 4 == 0 ? 4096 : 8);
    if (n > len - pos) n = len - pos;
    const State prev = b;
    const bool had_headers = split.headers_complete();
    b = split.feed(stream + pos, n);
    if (prev != State::need_more) check(b == prev);
    if (had_headers) check(split.headers_complete());
    pos += n;
  }

  check(a == b);
  // The end of the headers is reached after the same bytes however they
  // come; from then on the method, path and query are known.
  if (a != State::rejected) check(whole.headers_complete() == split.headers_complete());
  if (a == State::complete) check(whole.headers_complete());
  for (const RequestParser* p : {&whole, &split}) {
    if (p->headers_complete()) {
      check(!p->request().method.empty());
      check(p->request().path.find('?') == std::string::npos);
    }
  }
  switch (a) {
    case State::complete: {
      const Request& r = whole.request();
      check(same(r, split.request()));
      check(!r.method.empty());
      check(r.body.size() <= max_body);
      check(r.path.size() + r.query.size() <= max_header);
      for (const auto& [name, value] : r.headers) {
        for (char c : name) check(!std::isupper(static_cast<unsigned char>(c)));
        check(name.size() + value.size() <= max_header);
      }
      check(whole.reject_status() == 0);
      break;
    }
    case State::rejected:
      for (const RequestParser* p : {&whole, &split}) {
        if (p->reject_status() == 400) {
          check(!p->reject_detail().empty());
        } else {
          check(p->reject_status() == 413 || p->reject_status() == 431);
          check(p->reject_detail().empty());
        }
      }
      // A request both malformed and over a limit is refused for whichever
      // the parser meets first, and http-parser hands over a URL or header
      // in pieces only at the end of each buffer: with the bytes split, the
      // limit may come first. Two different limits, or two different
      // malformations, would be a real difference.
      if (whole.reject_status() != split.reject_status()) {
        check(whole.reject_status() == 400 || split.reject_status() == 400);
      } else {
        check(whole.reject_detail() == split.reject_detail());
      }
      break;
    case State::need_more:
      check(whole.reject_status() == 0);
      break;
  }

  // A decided parser ignores what follows.
  if (a != State::need_more) check(whole.feed(stream, len) == a);
  return 0;
}
