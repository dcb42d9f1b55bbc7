#include "admin/http_server.hpp"

#include <exception>

#include <spdlog/spdlog.h>

#include "log/escape.hpp"
#include "sluice/address.hpp"

namespace sluice::admin {

namespace {

uv_handle_t* as_handle(void* h) { return static_cast<uv_handle_t*>(h); }

constexpr std::uint64_t kLingerMs = 1000;  // after the answer: wait for the client's FIN this long

}  // namespace

const char* reason_phrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

std::string serialize(const Response& r) {
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + reason_phrase(r.status) + "\r\n";
  out += "Content-Type: " + r.content_type + "\r\n";
  out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  out += "Cache-Control: no-store\r\nConnection: close\r\n";
  for (const auto& [name, value] : r.headers) out += name + ": " + value + "\r\n";
  out += "\r\n";
  out += r.body;
  return out;
}

struct HttpServer::Connection {
  HttpServer* server = nullptr;
  uv_tcp_t tcp{};
  uv_timer_t timer{};
  uv_write_t write_req{};
  uv_shutdown_t shutdown_req{};
  RequestParser parser;
  bool continue_sent = false;
  uv_write_t continue_req{};
  bool responded = false;
  int open_handles = 0;
  bool closing = false;
  std::string out;
  char buf[16 * 1024];

  void on_data(const char* data, std::size_t n);
  void respond(Response r);
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

}  // namespace

void Connection::on_data(const char* data, std::size_t n) {
  if (responded) return;  // the rest of a refused request, or bytes after the one we answered
  switch (parser.feed(data, n)) {
    case RequestParser::State::complete: {
      const Request& request = parser.request();
      Response r;
      try {
        r = server->handler_(request);
      } catch (const std::exception& e) {
        // The path is the client's bytes: escaped, so it cannot break or forge a log line.
        std::string path;
        append_text_escaped(path, request.path);
        spdlog::error("admin: {} {} failed: {}", request.method, path, e.what());
        r = error_response(500, "internal error");
      }
      respond(std::move(r));
      return;
    }
    case RequestParser::State::need_more:
      if (!continue_sent && parser.expects_continue()) {
        continue_sent = true;
        static char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
        uv_buf_t b = uv_buf_init(kContinue, sizeof kContinue - 1);
        uv_write(&continue_req, reinterpret_cast<uv_stream_t*>(&tcp), &b, 1, [](uv_write_t*, int) {});
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

void Connection::respond(Response r) {
  if (responded || closing) return;
  responded = true;
  uv_timer_stop(&timer);
  out = serialize(r);
  uv_buf_t b = uv_buf_init(out.data(), static_cast<unsigned>(out.size()));
  write_req.data = this;
  if (uv_write(&write_req, reinterpret_cast<uv_stream_t*>(&tcp), &b, 1, [](uv_write_t* w, int status) {
        auto* c = static_cast<Connection*>(w->data);
        if (status < 0 || c->closing) {
          c->close();
          return;
        }
        // Send FIN, then read (and drop) until the client closes, so that
        // unread request bytes never turn the close into a reset that could
        // destroy the answer in flight. Bounded by the linger timer.
        c->shutdown_req.data = c;
        if (uv_shutdown(&c->shutdown_req, reinterpret_cast<uv_stream_t*>(&c->tcp), [](uv_shutdown_t* s, int) {
              auto* cc = static_cast<Connection*>(s->data);
              if (cc->closing) return;
              uv_timer_start(&cc->timer, [](uv_timer_t* t) { static_cast<Connection*>(t->data)->close(); },
                             kLingerMs, 0);
            }) != 0) {
          c->close();
        }
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

std::string HttpServer::listen(const Endpoint& at) {
  uv_tcp_init(loop_, &listener_);
  listener_.data = this;
  listening_ = true;
  int rc = uv_tcp_bind(&listener_, reinterpret_cast<const sockaddr*>(&at.addr), 0);
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), 64, on_connection);
  if (rc != 0) return std::string("cannot listen on ") + at.text + ": " + uv_strerror(rc);
  sockaddr_storage ss{};
  int len = sizeof ss;
  uv_tcp_getsockname(&listener_, reinterpret_cast<sockaddr*>(&ss), &len);
  bound_ = format_sockaddr(reinterpret_cast<const sockaddr*>(&ss));
  return {};
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
  if (uv_accept(server, reinterpret_cast<uv_stream_t*>(&conn->tcp)) != 0) {
    conn->close();
    return;
  }
  if (self->connections_.size() > self->limits_.max_connections) {
    conn->close();  // over the limit: closed at once, the others are untouched
    return;
  }
  sockaddr_storage ss{};
  int len = sizeof ss;
  if (uv_tcp_getpeername(&conn->tcp, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    conn->parser.request().peer = format_sockaddr(reinterpret_cast<const sockaddr*>(&ss));
  }
  uv_timer_start(&conn->timer, [](uv_timer_t* t) {
    auto* cc = static_cast<Connection*>(t->data);
    cc->respond(error_response(408, "the request did not arrive in time"));
  }, self->limits_.request_timeout_ms, 0);
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(&conn->tcp),
      [](uv_handle_t* h, std::size_t, uv_buf_t* b) {
        auto* cc = static_cast<Connection*>(h->data);
        *b = uv_buf_init(cc->buf, sizeof cc->buf);
      },
      [](uv_stream_t* s, ssize_t n, const uv_buf_t* b) {
        auto* cc = static_cast<Connection*>(s->data);
        if (n < 0) {
          cc->close();
          return;
        }
        if (n > 0) cc->on_data(b->base, static_cast<std::size_t>(n));
      });
}

void HttpServer::finished(Connection* c) {
  std::erase_if(connections_, [c](const std::unique_ptr<Connection>& p) { return p.get() == c; });
  maybe_done();
}

void HttpServer::close(std::function<void()> done) {
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
  for (auto& c : connections_) c->close();
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
