#include "health/http_probe.hpp"

#include "health/match.hpp"

namespace sluice::health {

namespace {

// Stops the parser: the check has its answer.
constexpr int kStop = -1;

HttpProbe* probe_of(http_parser* p) { return static_cast<HttpProbe*>(p->data); }

}  // namespace

HttpProbe::HttpProbe(uv_loop_t* loop, const HealthConfig& config, const Endpoint& target)
    : StreamProbe(loop, config, target) {
  const std::string& host = config_.host.empty() ? target_.text : config_.host;
  request_ = config_.method + " " + config_.path + " HTTP/1.1\r\n" + "Host: " + host + "\r\n" +
             "User-Agent: sluice-health\r\nAccept: */*\r\nConnection: close\r\n\r\n";
  http_parser_settings_init(&settings_);
  settings_.on_headers_complete = &HttpProbe::on_headers_complete;
  settings_.on_body = &HttpProbe::on_body;
  settings_.on_message_complete = &HttpProbe::on_message_complete;
}

void HttpProbe::on_connected() {
  http_parser_init(&parser_, HTTP_RESPONSE);
  parser_.data = this;
  body_.clear();
  got_bytes_ = false;
  send(request_);
}

void HttpProbe::on_data(std::string_view bytes) {
  got_bytes_ = true;
  parse(bytes.data(), bytes.size());
}

void HttpProbe::on_end(std::string_view error) {
  if (!error.empty()) {
    finish(false, std::string(error));
    return;
  }
  parse(nullptr, 0);
  if (in_flight()) {
    finish(false, got_bytes_ ? "connection closed before the response was complete"
                             : "connection closed without a response");
  }
}

void HttpProbe::parse(const char* data, std::size_t len) {
  const std::size_t used = http_parser_execute(&parser_, &settings_, data, len);
  if (!in_flight()) return;  // a callback decided
  const auto err = static_cast<http_errno>(parser_.http_errno);
  if (err != HPE_OK || used != len) {
    finish(false, std::string("malformed HTTP response: ") + http_errno_description(err));
  }
}

int HttpProbe::on_headers_complete(http_parser* p) {
  HttpProbe* self = probe_of(p);
  const int status = static_cast<int>(p->status_code);
  const std::string what = "HTTP " + std::to_string(status);
  if (!status_matches(status, self->config_.expect_status)) {
    self->finish(false, what);
    return kStop;
  }
  if (self->config_.expect_body.empty()) {
    self->finish(true, what);
    return kStop;
  }
  return self->config_.method == "HEAD" ? 1 : 0;  // 1: the response has no body
}

int HttpProbe::on_body(http_parser* p, const char* at, std::size_t len) {
  HttpProbe* self = probe_of(p);
  const std::size_t room = kMaxReplyBytes - self->body_.size();
  self->body_.append(at, len < room ? len : room);
  const std::string status = "HTTP " + std::to_string(p->status_code);
  if (self->body_.find(self->config_.expect_body) != std::string::npos) {
    self->finish(true, status + ", body matched");
    return kStop;
  }
  if (self->body_.size() >= kMaxReplyBytes) {
    self->finish(false, status + " but the first 64 KiB of the body lack " + quote_bytes(self->config_.expect_body));
    return kStop;
  }
  return 0;
}

int HttpProbe::on_message_complete(http_parser* p) {
  HttpProbe* self = probe_of(p);
  self->finish(false, "HTTP " + std::to_string(p->status_code) + " but the body lacks " +
                          quote_bytes(self->config_.expect_body));
  return kStop;
}

}  // namespace sluice::health
