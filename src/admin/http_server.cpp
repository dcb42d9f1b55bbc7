#include "admin/http_server.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>

#include <spdlog/spdlog.h>

#include "log/escape.hpp"
#include "log/rate_limited_warning.hpp"
#include "sluice/address.hpp"
#include "sluice/uv_handle.hpp"

namespace sluice::admin {

namespace {

constexpr std::uint64_t kLingerMs = 1000;  // after the answer: wait for the client's FIN this long

}  // namespace

const char* reason_phrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 421: return "Misdirected Request";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

std::string serialize(const Response& r, bool head) {
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + reason_phrase(r.status) + "\r\n";
  out += "Content-Type: " + r.content_type + "\r\n";
  out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  out += "Cache-Control: no-store\r\nConnection: close\r\n";
  for (const auto& [name, value] : r.headers) out += name + ": " + value + "\r\n";
  out += "\r\n";
  if (!head) out += r.body;
  return out;
}

struct HttpServer::Connection {
  // Where the connection stands; the timer's meaning follows it.
  enum class Phase {
    headers,    // reading the request line and headers; the header deadline runs, and a full server may close it
    body,       // the headers passed the gate; reading the body until the request deadline
    answering,  // the answer is being written; abandoned when no byte of it moves for write_timeout_ms
    lingering,  // answered and FIN sent; reading (and dropping) until the client's FIN, at most kLingerMs, and a
                // full server may close it
  };

  HttpServer* server = nullptr;
  uv_tcp_t tcp{};
  uv_timer_t timer{};
  uv_write_t write_req{};
  uv_shutdown_t shutdown_req{};
  RequestParser parser;
  Phase phase = Phase::headers;
  bool continue_sent = false;
  uv_write_t continue_req{};
  bool peer_eof = false;          // the client has sent its FIN
  std::uint64_t accepted_ms = 0;  // loop time at accept; the deadlines count from it
  std::size_t unsent = 0;         // bytes of the answer not yet in the kernel at the last timer tick
  int open_handles = 0;
  bool closing = false;
  std::string out;
  char buf[16 * 1024];

  uv_stream_t* stream() { return reinterpret_cast<uv_stream_t*>(&tcp); }
  void start();
  void on_data(const char* data, std::size_t n);
  void on_eof();
  void on_timer();
  void respond(Response r);
  void written(int status);
  void close();

  explicit Connection(const HttpLimits& l) : parser(l.max_header_bytes, l.max_body_bytes) {}
};

namespace {

using Connection = HttpServer::Connection;

Response error_response(int status, const std::string& message) {
  Response r;
  r.status = status;
  std::string escaped;
  for (char ch : message) {
    if (ch == '"' || ch == '\\') escaped += '\\';
    if (static_cast<unsigned char>(ch) >= 0x20) escaped += ch;
  }
  r.body = "{\"error\":\"" + escaped + "\"}\n";
  return r;
}

void timer_fired(uv_timer_t* t) { static_cast<Connection*>(t->data)->on_timer(); }

RateLimitedWarning g_full;

}  // namespace

void Connection::start() {
  const HttpLimits& limits = server->limits_;
  accepted_ms = uv_now(server->loop_);
  uv_timer_start(&timer, timer_fired, std::min(limits.header_timeout_ms, limits.request_timeout_ms), 0);
  uv_read_start(
      stream(),
      [](uv_handle_t* h, std::size_t, uv_buf_t* b) {
        auto* c = static_cast<Connection*>(h->data);
        *b = uv_buf_init(c->buf, sizeof c->buf);
      },
      [](uv_stream_t* s, ssize_t n, const uv_buf_t* b) {
        auto* c = static_cast<Connection*>(s->data);
        if (n == UV_EOF) {
          c->on_eof();
        } else if (n < 0) {
          c->close();
        } else if (n > 0) {
          c->on_data(b->base, static_cast<std::size_t>(n));
        }
      });
}

void Connection::on_data(const char* data, std::size_t n) {
  // Bytes after the request we answered, or the rest of a refused one, are dropped.
  if (phase != Phase::headers && phase != Phase::body) return;
  const RequestParser::State state = parser.feed(data, n);
  const Request& request = parser.request();
  // A handler or the gate throws only for our own faults (memory, a bug): 500, logged.
  auto failed = [&request](const std::exception& e) {
    // The path is the client's bytes: escaped, so it cannot break or forge a log line.
    std::string path;
    append_text_escaped(path, request.path);
    spdlog::error("admin: {} {} failed: {}", request.method, path, e.what());
    return error_response(500, "internal error");
  };
  if (phase == Phase::headers && parser.headers_complete()) {
    // Decided on the headers alone: a refused client never gets `100 Continue`
    // and its body is never read.
    if (server->gate_) {
      std::optional<Response> refused;
      try {
        refused = server->gate_(request);
      } catch (const std::exception& e) {
        refused = failed(e);
      }
      if (refused) {
        respond(std::move(*refused));
        return;
      }
    }
    phase = Phase::body;
    if (state == RequestParser::State::need_more) {
      // The body has what is left of the request deadline, counted from accept.
      const std::uint64_t elapsed = uv_now(server->loop_) - accepted_ms;
      const std::uint64_t limit = server->limits_.request_timeout_ms;
      uv_timer_start(&timer, timer_fired, limit > elapsed ? limit - elapsed : 0, 0);
    }
  }
  switch (state) {
    case RequestParser::State::complete: {
      Response r;
      try {
        r = server->handler_(request);
      } catch (const std::exception& e) {
        r = failed(e);
      }
      respond(std::move(r));
      return;
    }
    case RequestParser::State::need_more:
      if (phase == Phase::body && !continue_sent && parser.expects_continue()) {
        continue_sent = true;
        static char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
        uv_buf_t b = uv_buf_init(kContinue, sizeof kContinue - 1);
        uv_write(&continue_req, stream(), &b, 1, [](uv_write_t*, int) {});
      }
      return;
    case RequestParser::State::rejected: {
      const int status = parser.reject_status();
      const std::string& detail = parser.reject_detail();
      respond(error_response(status, detail.empty() ? std::string(reason_phrase(status))
                                                    : "malformed request: " + detail));
      return;
    }
  }
}

void Connection::on_eof() {
  peer_eof = true;
  uv_read_stop(stream());
  switch (phase) {
    case Phase::headers:
    case Phase::body:
      close();  // the request can no longer be completed
      return;
    case Phase::answering:
      return;  // a client may send its FIN right after the request: the answer still goes out whole (written())
    case Phase::lingering:
      close();
      return;
  }
}

void Connection::on_timer() {
  switch (phase) {
    case Phase::headers:
      respond(error_response(408, "the request headers did not arrive in time"));
      return;
    case Phase::body:
      respond(error_response(408, "the request did not arrive in time"));
      return;
    case Phase::answering: {
      // A slow reader is fine as long as the answer moves; one that takes
      // nothing for a whole period would hold its slot for ever.
      const std::size_t left = uv_stream_get_write_queue_size(stream());
      if (left >= unsent) {
        spdlog::debug("admin: the answer to {} has not moved for {} ms: closing", parser.request().peer,
                      server->limits_.write_timeout_ms);
        close();
        return;
      }
      unsent = left;
      return;
    }
    case Phase::lingering:
      close();
      return;
  }
}

void Connection::respond(Response r) {
  if (closing || phase == Phase::answering || phase == Phase::lingering) return;
  phase = Phase::answering;
  uv_timer_stop(&timer);
  const bool head = parser.headers_complete() && parser.request().method == "HEAD";
  out = serialize(r, head);
  uv_buf_t b = uv_buf_init(out.data(), static_cast<unsigned>(out.size()));
  write_req.data = this;
  if (uv_write(&write_req, stream(), &b, 1, [](uv_write_t* w, int status) {
        static_cast<Connection*>(w->data)->written(status);
      }) != 0) {
    close();
    return;
  }
  unsent = uv_stream_get_write_queue_size(stream());
  const std::uint64_t period = server->limits_.write_timeout_ms;
  uv_timer_start(&timer, timer_fired, period, period);
}

void Connection::written(int status) {
  if (status < 0 || closing) {
    close();
    return;
  }
  // Send FIN, then read (and drop) until the client closes, so that unread
  // request bytes never turn the close into a reset that could destroy the
  // answer in flight. Bounded by the linger timer; at once when the client
  // has closed its side already.
  phase = Phase::lingering;
  uv_timer_start(&timer, timer_fired, kLingerMs, 0);
  shutdown_req.data = this;
  if (uv_shutdown(&shutdown_req, stream(), [](uv_shutdown_t* s, int) {
        auto* c = static_cast<Connection*>(s->data);
        if (c->peer_eof) c->close();
      }) != 0) {
    close();
  }
}

void Connection::close() {
  if (closing) return;
  closing = true;
  auto on_closed = [](uv_handle_t* h) {
    auto* c = static_cast<Connection*>(h->data);
    if (--c->open_handles == 0) c->server->finished(c);
  };
  uv_close(as_handle(&tcp), on_closed);
  uv_close(as_handle(&timer), on_closed);
}

HttpServer::HttpServer(uv_loop_t* loop, Handler handler, HttpLimits limits)
    : loop_(loop), handler_(std::move(handler)), limits_(limits) {}

HttpServer::~HttpServer() = default;

std::string HttpServer::listen(const Endpoint& at, int inherited_fd) {
  uv_tcp_init(loop_, &listener_);
  listener_.data = this;
  listening_ = true;
  int rc = inherited_fd >= 0 ? uv_tcp_open(&listener_, inherited_fd)
                             : uv_tcp_bind(&listener_, reinterpret_cast<const sockaddr*>(&at.addr), 0);
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), 64, on_connection);
  if (rc != 0) return std::string("cannot listen on ") + at.text + ": " + uv_strerror(rc);
  sockaddr_storage ss{};
  int len = sizeof ss;
  uv_tcp_getsockname(&listener_, reinterpret_cast<sockaddr*>(&ss), &len);
  bound_ = format_sockaddr(reinterpret_cast<const sockaddr*>(&ss));
  // sin_port and sin6_port sit at the same offset, after the family.
  static_assert(offsetof(sockaddr_in, sin_port) == offsetof(sockaddr_in6, sin6_port));
  std::uint16_t port_be = 0;
  std::memcpy(&port_be, reinterpret_cast<const char*>(&ss) + offsetof(sockaddr_in, sin_port), sizeof port_be);
  bound_port_ = ntohs(port_be);
  return {};
}

int HttpServer::listening_fd() const {
  uv_os_fd_t fd = -1;
  if (!listening_ || uv_fileno(reinterpret_cast<const uv_handle_t*>(&listener_), &fd) != 0) return -1;
  return fd;
}

void HttpServer::on_connection(uv_stream_t* server, int status) {
  auto* self = static_cast<HttpServer*>(server->data);
  if (status < 0 || self->closing_) return;
  auto c = std::make_unique<Connection>(self->limits_);
  Connection* conn = c.get();
  conn->server = self;
  uv_tcp_init(self->loop_, &conn->tcp);
  uv_timer_init(self->loop_, &conn->timer);
  conn->tcp.data = conn;
  conn->timer.data = conn;
  conn->open_handles = 2;
  self->connections_.push_back(std::move(c));
  if (uv_accept(server, conn->stream()) != 0) {
    conn->close();
    return;
  }
  sockaddr_storage ss{};
  int len = sizeof ss;
  if (uv_tcp_getpeername(&conn->tcp, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    conn->parser.request().peer = format_sockaddr(reinterpret_cast<const sockaddr*>(&ss));
  }
  const auto open = static_cast<std::size_t>(std::count_if(
      self->connections_.begin(), self->connections_.end(), [](const auto& p) { return !p->closing; }));
  if (open > self->limits_.max_connections && !self->make_room(conn)) {
    conn->close();  // every other connection is busy with a request: this one is closed at once
    return;
  }
  conn->start();
}

bool HttpServer::make_room(Connection* keep) {
  // Oldest first (connections_ is in accept order): a connection that only
  // waits for the client's FIN loses nothing; then one that has not sent its
  // headers, so an operator who connects and asks at once always gets in.
  Connection* victim = nullptr;
  for (const auto& p : connections_) {
    Connection* c = p.get();
    if (c == keep || c->closing) continue;
    if (c->phase == Connection::Phase::lingering) {
      victim = c;
      break;
    }
    if (c->phase == Connection::Phase::headers && victim == nullptr) victim = c;
  }
  if (victim == nullptr) return false;
  if (victim->phase == Connection::Phase::headers) {
    g_full.warn("admin: " + std::to_string(limits_.max_connections) +
                " connections open: closed the oldest one without a request (from " + victim->parser.request().peer +
                ") to make room");
  }
  victim->close();
  return true;
}

void HttpServer::finished(Connection* c) {
  std::erase_if(connections_, [c](const std::unique_ptr<Connection>& p) { return p.get() == c; });
  maybe_done();
}

void HttpServer::close(std::function<void()> done, bool finish_requests) {
  done_ = std::move(done);
  closing_ = true;
  if (listening_) {
    uv_close(as_handle(&listener_), [](uv_handle_t* h) {
      auto* self = static_cast<HttpServer*>(h->data);
      self->listener_closed_ = true;
      self->maybe_done();
    });
  } else {
    listener_closed_ = true;
  }
  if (!finish_requests) {
    for (auto& c : connections_) c->close();
  }
  maybe_done();
}

void HttpServer::maybe_done() {
  if (closing_ && listener_closed_ && connections_.empty() && done_) {
    auto d = std::move(done_);
    done_ = nullptr;
    d();
  }
}

}  // namespace sluice::admin
