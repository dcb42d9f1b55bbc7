// One HTTP/1.1 request of the admin API, parsed by http-parser as its bytes
// arrive, with the limits the admin server puts on what a client controls
// (header and body bytes). Pure: no sockets, no timers, no logging, so it can
// be unit-tested and fuzzed on its own; HttpServer feeds it what it reads.
#pragma once

#include <http_parser.h>

#include <cstddef>
#include <map>
#include <string>

namespace sluice::admin {

struct Request {
  std::string method;  // "GET"
  std::string path;    // "/status" (percent-encoding left as sent)
  std::string query;   // after '?', may be empty
  std::map<std::string, std::string> headers;  // names in lower case; repeated headers joined by ", "
  std::string body;
  std::string peer;    // "127.0.0.1:51234"
};

class RequestParser {
 public:
  enum class State {
    need_more,  // no complete request yet, nothing wrong so far
    complete,   // request() is the whole request; later bytes are ignored
    rejected,   // reject_status() says how to answer; later bytes are ignored
  };

  // max_header_bytes counts the request line and the headers.
  RequestParser(std::size_t max_header_bytes, std::size_t max_body_bytes);
  RequestParser(const RequestParser&) = delete;
  RequestParser& operator=(const RequestParser&) = delete;

  // Feeds the next bytes of the connection; returns the state after them.
  // Feeding nothing changes nothing: it is not the end of the stream.
  State feed(const char* data, std::size_t n);
  State state() const { return state_; }

  // True once the request line and every header are in (also when the body
  // is still to come, or the request was then rejected for its body): the
  // caller may decide on the headers alone, e.g. authenticate before the body.
  bool headers_complete() const { return headers_done_; }

  // The request; method, path, query and headers are filled in once
  // headers_complete(), the body once complete.
  Request& request() { return request_; }
  const Request& request() const { return request_; }

  // Once rejected: 400 (malformed, or an HTTP/1.1 request without exactly
  // one Host), 413 (body too large) or 431 (headers too large), and for 400
  // what was wrong (empty otherwise).
  int reject_status() const { return reject_; }
  const std::string& reject_detail() const { return detail_; }

  // True while a request is incomplete, its headers announced a body that
  // has not all arrived, and they carry "Expect: 100-continue": clients such
  // as curl wait for "100 Continue" before sending a larger body.
  bool expects_continue() const;

 private:
  static const http_parser_settings& settings();
  int count_header(std::size_t n);
  void flush_header();

  std::size_t max_header_bytes_;
  std::size_t max_body_bytes_;
  http_parser parser_{};
  Request request_;
  State state_ = State::need_more;
  http_errno last_error_ = HPE_OK;
  std::string field_;  // header name being read
  std::string value_;  // its value so far
  bool in_value_ = false;
  std::size_t header_bytes_ = 0;
  int host_headers_ = 0;
  bool headers_done_ = false;
  bool complete_ = false;
  int reject_ = 0;
  std::string detail_;
};

}  // namespace sluice::admin
