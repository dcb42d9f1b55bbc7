#include "admin/request_parser.hpp"

#include <algorithm>
#include <cctype>
#include <utility>

namespace sluice::admin {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

RequestParser* of(http_parser* p) { return static_cast<RequestParser*>(p->data); }

}  // namespace

RequestParser::RequestParser(std::size_t max_header_bytes, std::size_t max_body_bytes)
    : max_header_bytes_(max_header_bytes), max_body_bytes_(max_body_bytes) {
  http_parser_init(&parser_, HTTP_REQUEST);
  parser_.data = this;
}

const http_parser_settings& RequestParser::settings() {
  static const http_parser_settings s = [] {
    http_parser_settings x{};
    http_parser_settings_init(&x);
    x.on_url = [](http_parser* p, const char* at, std::size_t n) {
      RequestParser* r = of(p);
      r->request_.path.append(at, n);
      return r->count_header(n);
    };
    x.on_header_field = [](http_parser* p, const char* at, std::size_t n) {
      RequestParser* r = of(p);
      if (r->in_value_) r->flush_header();
      r->field_.append(at, n);
      return r->count_header(n);
    };
    x.on_header_value = [](http_parser* p, const char* at, std::size_t n) {
      RequestParser* r = of(p);
      r->in_value_ = true;
      r->value_.append(at, n);
      return r->count_header(n);
    };
    x.on_headers_complete = [](http_parser* p) {
      RequestParser* r = of(p);
      if (r->in_value_) r->flush_header();
      // RFC 9112, 3.2: an HTTP/1.1 request without Host, or with more than
      // one, is answered 400.
      const bool needs_host = p->http_major > 1 || (p->http_major == 1 && p->http_minor >= 1);
      if (r->host_headers_ > 1 || (needs_host && r->host_headers_ == 0)) {
        r->reject_ = 400;
        r->detail_ = r->host_headers_ > 1 ? "more than one Host header" : "no Host header (HTTP/1.1 requires one)";
        return -1;
      }
      r->request_.method = http_method_str(static_cast<http_method>(p->method));
      const auto q = r->request_.path.find('?');
      if (q != std::string::npos) {
        r->request_.query = r->request_.path.substr(q + 1);
        r->request_.path.resize(q);
      }
      r->headers_done_ = true;
      if ((p->flags & F_CONTENTLENGTH) != 0 && p->content_length > r->max_body_bytes_) {
        r->reject_ = 413;
        return -1;
      }
      return 0;
    };
    x.on_body = [](http_parser* p, const char* at, std::size_t n) {
      RequestParser* r = of(p);
      if (r->request_.body.size() + n > r->max_body_bytes_) {
        r->reject_ = 413;
        return 1;
      }
      r->request_.body.append(at, n);
      return 0;
    };
    x.on_message_complete = [](http_parser* p) {
      of(p)->complete_ = true;
      http_parser_pause(p, 1);  // one request per connection: ignore anything after it
      return 0;
    };
    return x;
  }();
  return s;
}

int RequestParser::count_header(std::size_t n) {
  header_bytes_ += n;
  if (header_bytes_ > max_header_bytes_) {
    reject_ = 431;
    return 1;
  }
  return 0;
}

void RequestParser::flush_header() {
  std::string name = lower(std::move(field_));
  if (name == "host") ++host_headers_;
  auto [it, fresh] = request_.headers.emplace(name, value_);
  if (!fresh) it->second += ", " + value_;
  field_.clear();
  value_.clear();
  in_value_ = false;
  header_bytes_ += 4;  // ": " and CRLF
}

RequestParser::State RequestParser::feed(const char* data, std::size_t n) {
  // http-parser takes a zero-length buffer for the end of the stream.
  if (state_ != State::need_more || n == 0) return state_;
  http_parser_execute(&parser_, &settings(), data, n);
  last_error_ = HTTP_PARSER_ERRNO(&parser_);
  if (complete_) {
    state_ = State::complete;
  } else if (reject_ != 0) {
    state_ = State::rejected;
  } else if (last_error_ == HPE_HEADER_OVERFLOW) {
    reject_ = 431;
    state_ = State::rejected;
  } else if (last_error_ != HPE_OK) {
    reject_ = 400;
    detail_ = http_errno_description(last_error_);
    state_ = State::rejected;
  }
  return state_;
}

bool RequestParser::expects_continue() const {
  if (state_ != State::need_more || last_error_ != HPE_OK) return false;
  if ((parser_.flags & F_CONTENTLENGTH) == 0 || parser_.content_length == 0) return false;
  auto it = request_.headers.find("expect");
  return it != request_.headers.end() && lower(it->second) == "100-continue";
}

}  // namespace sluice::admin
