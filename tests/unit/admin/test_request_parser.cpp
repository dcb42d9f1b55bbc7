// The admin API's request parser on its own: whole and split requests,
// the limits, and what it answers for broken ones.
#include <doctest/doctest.h>

#include <string>

#include "admin/request_parser.hpp"

using sluice::admin::RequestParser;
using State = RequestParser::State;

namespace {

State feed(RequestParser& p, const std::string& s) { return p.feed(s.data(), s.size()); }

}  // namespace

TEST_CASE("a request with a query, repeated headers and a body") {
  RequestParser p(1024, 1024);
  const std::string text =
      "POST /upstreams/pg/servers/10.0.0.1%3A5432/drain?x=1&y=2 HTTP/1.1\r\n"
      "Host: a\r\nX-Tag: one\r\nx-tag: two\r\nContent-Length: 5\r\n\r\nhello";
  CHECK(feed(p, text) == State::complete);
  const auto& r = p.request();
  CHECK(r.method == "POST");
  CHECK(r.path == "/upstreams/pg/servers/10.0.0.1%3A5432/drain");
  CHECK(r.query == "x=1&y=2");
  CHECK(r.headers.at("host") == "a");
  CHECK(r.headers.at("x-tag") == "one, two");
  CHECK(r.body == "hello");
  CHECK(p.reject_status() == 0);
}

TEST_CASE("a request split into single bytes parses like the whole") {
  const std::string text = "PUT /config HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\nabc";
  RequestParser p(1024, 1024);
  State s = State::need_more;
  bool asked_continue = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    CHECK(s == State::need_more);
    s = p.feed(text.data() + i, 1);
    asked_continue = asked_continue || p.expects_continue();
  }
  CHECK(s == State::complete);
  CHECK(asked_continue);
  CHECK_FALSE(p.expects_continue());  // the body is in
  CHECK(p.request().method == "PUT");
  CHECK(p.request().body == "abc");
}

TEST_CASE("the headers can be judged before the body arrives") {
  RequestParser p(1024, 1024);
  CHECK(feed(p, "PUT /config?x=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\nContent-Length: 4\r\n") == State::need_more);
  CHECK_FALSE(p.headers_complete());
  CHECK(feed(p, "\r\nab") == State::need_more);
  REQUIRE(p.headers_complete());
  CHECK(p.request().method == "PUT");
  CHECK(p.request().path == "/config");
  CHECK(p.request().query == "x=1");
  CHECK(p.request().headers.at("authorization") == "Bearer t");
  CHECK(p.request().body == "ab");
  CHECK(feed(p, "cd") == State::complete);
  CHECK(p.request().body == "abcd");

  // Headers that announce too large a body: complete, and rejected.
  RequestParser big(1024, 10);
  CHECK(feed(big, "HEAD / HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n") == State::rejected);
  CHECK(big.headers_complete());
  CHECK(big.request().method == "HEAD");
}

TEST_CASE("bytes after a complete request are ignored") {
  RequestParser p(1024, 1024);
  CHECK(feed(p, "GET /status HTTP/1.1\r\nHost: x\r\n\r\nGET /other HTTP/1.1\r\n\r\n") == State::complete);
  CHECK(p.request().path == "/status");
  CHECK(feed(p, "garbage") == State::complete);
  CHECK(p.request().path == "/status");
}

TEST_CASE("limits and malformed requests are rejected with their status") {
  struct Case {
    const char* text;
    std::size_t max_header;
    std::size_t max_body;
    int status;
  };
  const Case cases[] = {
      {"GET /status HTTP/1.1\r\nX-Long: 0123456789012345678901234567890123456789\r\n\r\n", 40, 1024, 431},
      {"GET /0123456789012345678901234567890123456789 HTTP/1.1\r\n\r\n", 20, 1024, 431},
      {"PUT /config HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n", 1024, 10, 413},
      {"PUT /config HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nb\r\nhello world\r\n0\r\n\r\n", 1024, 10, 413},
      {"HELLO\r\n\r\n", 1024, 1024, 400},
      {"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n", 1024, 1024, 400},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    RequestParser p(c.max_header, c.max_body);
    CHECK(feed(p, c.text) == State::rejected);
    CHECK(p.reject_status() == c.status);
    CHECK(p.reject_detail().empty() == (c.status != 400));
    CHECK(feed(p, "GET / HTTP/1.1\r\n\r\n") == State::rejected);
  }
}

TEST_CASE("an incomplete request asks for more") {
  RequestParser p(1024, 1024);
  CHECK(feed(p, "GET /sta") == State::need_more);
  CHECK(feed(p, "tus HTTP/1.1\r\nHost: x\r\n") == State::need_more);
  CHECK_FALSE(p.expects_continue());
  CHECK(feed(p, "\r\n") == State::complete);
  CHECK(p.request().path == "/status");
}

TEST_CASE("an empty feed is not the end of the stream") {
  // http-parser reads a zero-length buffer as EOF; a read of nothing must
  // not turn an incomplete request into a malformed one. (Found by
  // fuzz_admin_request.)
  const std::string text = "GET /status HTTP/1.1\r\nHost: x\r\n\r\n";
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    CAPTURE(cut);
    RequestParser p(1024, 1024);
    p.feed(text.data(), cut);
    p.feed(text.data() + cut, 0);
    CHECK(p.feed(text.data() + cut, text.size() - cut) == State::complete);
    CHECK(p.request().path == "/status");
  }
}

TEST_CASE("an HTTP/1.1 request needs exactly one Host; HTTP/1.0 may have none") {
  for (const char* text : {"GET /status HTTP/1.1\r\n\r\n", "POST /reload HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
                           "GET /status HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n",
                           "GET /status HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n"}) {
    CAPTURE(text);
    RequestParser p(1024, 1024);
    CHECK(feed(p, text) == State::rejected);
    CHECK(p.reject_status() == 400);
    CHECK(p.reject_detail().find("Host") != std::string::npos);
    CHECK_FALSE(p.headers_complete());  // nothing to judge: the answer is 400
  }
  RequestParser old(1024, 1024);
  CHECK(feed(old, "GET /status HTTP/1.0\r\n\r\n") == State::complete);
  CHECK(old.request().headers.count("host") == 0);
  RequestParser empty(1024, 1024);
  CHECK(feed(empty, "GET /status HTTP/1.1\r\nHost:\r\n\r\n") == State::complete);
}
