// A small HTTP/1.1 server on a libuv loop, for the admin API. One request per
// connection (every answer says `Connection: close`), requests parsed by
// http-parser (RequestParser), hard limits on everything a client controls:
// connections at once, header bytes, body bytes, the time to send the headers
// and the whole request, and an answer that stops moving. A full server makes
// room for a new connection by closing the oldest one that has not sent its
// headers (or is only waiting for the client's FIN), so idle clients cannot
// lock an operator out. Runs on the control loop; it never sees a proxied
// socket.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
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
  std::uint64_t header_timeout_ms = 3'000;    // from accept to the end of the headers
  std::uint64_t request_timeout_ms = 10'000;  // from accept to a complete request
  std::uint64_t write_timeout_ms = 10'000;    // an answer that moves no byte this long is abandoned
};

// The reason phrase for `status` ("Not Found").
const char* reason_phrase(int status);
// Serialises `r` as an HTTP/1.1 response with Connection: close. The answer
// to a HEAD request (`head`) has the same headers, Content-Length included,
// and no body.
std::string serialize(const Response& r, bool head = false);

class HttpServer {
 public:
  using Handler = std::function<Response(const Request&)>;
  // Looks at a request once its headers are in, before its body is read or
  // `100 Continue` sent: an answer (say, 401) ends the request there,
  // nullopt lets it go on.
  using Gate = std::function<std::optional<Response>(const Request&)>;

  HttpServer(uv_loop_t* loop, Handler handler, HttpLimits limits = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Sets the gate every request passes at the end of its headers.
  void set_gate(Gate gate) { gate_ = std::move(gate); }

  // Binds and listens. Returns an empty string, or the error.
  // With `inherited_fd` (a binary upgrade), listens on that socket, already
  // bound and listening, instead of binding a new one.
  std::string listen(const Endpoint& at, int inherited_fd = -1);
  // The listening socket (-1 before listen()), for a binary upgrade.
  int listening_fd() const;
  // The bound address ("127.0.0.1:9090"), after listen().
  const std::string& bound() const { return bound_; }
  std::uint16_t bound_port() const { return bound_port_; }
  // Stops listening and closes every connection; `done` runs once every
  // handle is closed (the loop may then end). With `finish_requests`, the
  // connections already accepted are answered first (each within its own
  // deadlines): a listening socket shared with another process (a binary
  // upgrade) may have handed this one a request the other never sees.
  void close(std::function<void()> done, bool finish_requests = false);

  struct Connection;

 private:
  static void on_connection(uv_stream_t* server, int status);
  void finished(Connection* c);
  void maybe_done();
  // With the server full, closes the connection that matters least (see the
  // file comment), never `keep`. Returns false when every other connection is
  // busy with a request.
  bool make_room(Connection* keep);

  uv_loop_t* loop_;
  Handler handler_;
  Gate gate_;
  HttpLimits limits_;
  uv_tcp_t listener_{};
  bool listening_ = false;
  bool closing_ = false;
  bool listener_closed_ = false;
  std::string bound_;
  std::uint16_t bound_port_ = 0;
  std::vector<std::unique_ptr<Connection>> connections_;
  std::function<void()> done_;
};

}  // namespace sluice::admin
