// type = "http": one HTTP/1.1 request (`method` `path`, Host, Connection:
// close); the response status must fall in `expect_status` and, when
// `expect_body` is set, the body (its first 64 KiB) must contain it. The
// response is parsed by http-parser.
#pragma once

#include <http_parser.h>

#include <string>

#include "health/stream_probe.hpp"

namespace sluice::health {

class HttpProbe final : public StreamProbe {
 public:
  HttpProbe(uv_loop_t* loop, const HealthConfig& config, const Endpoint& target);

  // The request this probe sends.
  const std::string& request() const { return request_; }

 private:
  void on_connected() override;
  void on_data(std::string_view bytes) override;
  void on_end(std::string_view error) override;
  // Feeds the parser; a null `data` tells it the peer closed.
  void parse(const char* data, std::size_t len);

  static int on_headers_complete(http_parser* p);
  static int on_body(http_parser* p, const char* at, std::size_t len);
  static int on_message_complete(http_parser* p);

  std::string request_;
  http_parser parser_{};
  http_parser_settings settings_{};
  std::string body_;
  bool got_bytes_ = false;
};

}  // namespace sluice::health
