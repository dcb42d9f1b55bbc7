// A small HTTP/1.1 server on a libuv loop, for the admin API. One request per
// connection (every answer says `Connection: close`), requests parsed by
// http-parser (RequestParser), hard limits on everything a client controls: connections at
// once, header bytes, body bytes and the time to send a request. Runs on the
// control loop; it never sees a proxied socket.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <uv.h>

#include "admin/request_parser.hpp"
#include "sluice/config.hpp"

namespace sluice::admin {

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra ones
};

struct HttpLimits {
  std::size_t max_connections = 64;
  std::size_t max_header_bytes = 64 * 1024;   // request line + headers
  std::size_t max_body_bytes = 1024 * 1024;
  std::uint64_t request_timeout_ms = 10'000;  // from accept to a complete request
};

// The reason phrase for `status` ("Not Found").
const char* reason_phrase(int status);
// Serialises `r` as an HTTP/1.1 response with Connection: close.
std::string serialize(const Response& r);

class HttpServer {
 public:
  using Handler = std::function<Response(const Request&)>;

  HttpServer(uv_loop_t* loop, Handler handler, HttpLimits limits = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens. Returns an empty string, or the error.
  std::string listen(const Endpoint& at);
  // The bound address ("127.0.0.1:9090"), after listen().
  const std::string& bound() const { return bound_; }
  // Stops listening and closes every connection; `done` runs once every
  // handle is closed (the loop may then end).
  void close(std::function<void()> done);

  struct Connection;

 private:
  static void on_connection(uv_stream_t* server, int status);
  void finished(Connection* c);
  void maybe_done();

  uv_loop_t* loop_;
  Handler handler_;
  HttpLimits limits_;
  uv_tcp_t listener_{};
  bool listening_ = false;
  bool closing_ = false;
  bool listener_closed_ = false;
  std::string bound_;
  std::vector<std::unique_ptr<Connection>> connections_;
  std::function<void()> done_;
};

}  // namespace sluice::admin
