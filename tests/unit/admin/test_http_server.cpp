// The admin HTTP server on a real loop with real loopback sockets (port 0):
// which connection a full server closes to make room, the gate that decides
// before the body, HEAD, and a FIN right after the request. Every test ends
// with every handle closed (uv_loop_close succeeds).
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <uv.h>

#include "admin/http_server.hpp"
#include "config/values.hpp"

using namespace sluice;
using namespace sluice::admin;

namespace {

// A non-blocking client socket connected to `port` on 127.0.0.1; `slow`
// gives it a remote scraper's segment size and a small receive window.
struct Client {
  int fd = -1;
  std::string got;
  bool eof = false;  // FIN or reset seen

  explicit Client(int port, bool slow = false) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    if (slow) {
      const int mss = 1448;
      const int rcvbuf = 4096;
      ::setsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, sizeof mss);
      ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    }
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(static_cast<std::uint16_t>(port));
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin) == 0);
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  ~Client() { ::close(fd); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  void send(const std::string& s) const {
    REQUIRE(::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size()));
  }
  // Reads what has arrived (at most `limit` bytes).
  void pump(std::size_t limit = SIZE_MAX) {
    char buf[4096];
    while (limit > 0) {
      const ssize_t n = ::recv(fd, buf, std::min(sizeof buf, limit), 0);
      if (n > 0) {
        got.append(buf, static_cast<std::size_t>(n));
        limit -= static_cast<std::size_t>(n);
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) eof = true;
      return;
    }
  }
  bool answered() const { return eof && got.find("\r\n\r\n") != std::string::npos; }
  std::string body() const { return got.substr(got.find("\r\n\r\n") + 4); }
};

struct Loop {
  uv_loop_t loop{};
  Loop() { uv_loop_init(&loop); }

  // Runs the loop, reading every client, until `done` (false after 10 s).
  bool run_until(const std::vector<Client*>& clients, const std::function<bool()>& done,
                 std::size_t read_limit = SIZE_MAX) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      uv_run(&loop, UV_RUN_NOWAIT);
      for (Client* c : clients) c->pump(read_limit);
      if (done()) return true;
      ::poll(nullptr, 0, 1);
    }
    return false;
  }

  void finish(HttpServer& server) {
    bool closed = false;
    server.close([&closed] { closed = true; });
    CHECK(run_until({}, [&closed] { return closed; }));
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(uv_loop_close(&loop) == 0);
  }
};

int listen_port(HttpServer& server) {
  std::string err;
  const std::optional<Endpoint> at = parse_address("127.0.0.1:0", true, err);
  REQUIRE(at.has_value());
  REQUIRE(server.listen(*at).empty());
  const std::string& bound = server.bound();
  return std::stoi(bound.substr(bound.rfind(':') + 1));
}

Response echo(const Request& r) {
  Response out;
  out.body = r.path + " " + r.body;
  return out;
}

}  // namespace

TEST_CASE("a full server closes the oldest connection without a request, never one under way") {
  Loop l;
  HttpLimits limits;
  limits.max_connections = 3;
  HttpServer server(&l.loop, echo, limits);
  int gated = 0;
  server.set_gate([&gated](const Request&) {
    ++gated;
    return std::optional<Response>();
  });
  const int port = listen_port(server);

  Client busy(port);  // the oldest: headers in, the body still coming
  busy.send("PUT /w HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab");
  REQUIRE(l.run_until({&busy}, [&] { return gated == 1; }));
  Client idle1(port);
  Client idle2(port);
  Client late(port);  // the fourth: idle1 makes room
  REQUIRE(l.run_until({&busy, &idle1, &idle2, &late}, [&] { return idle1.eof; }));
  CHECK(idle1.got.empty());
  late.send("GET /late HTTP/1.1\r\nHost: x\r\n\r\n");
  REQUIRE(l.run_until({&busy, &idle1, &idle2, &late}, [&] { return late.answered(); }));
  CHECK(late.got.starts_with("HTTP/1.1 200 OK\r\n"));
  CHECK(late.body() == "/late ");
  busy.send("cd");
  REQUIRE(l.run_until({&busy, &idle2}, [&] { return busy.answered(); }));
  CHECK(busy.body() == "/w abcd");
  CHECK_FALSE(idle2.eof);
  l.finish(server);
}

TEST_CASE("a connection that only waits for the client's FIN makes room before an idle one") {
  Loop l;
  HttpLimits limits;
  limits.max_connections = 2;
  HttpServer server(&l.loop, echo, limits);
  const int port = listen_port(server);

  Client idle(port);  // the oldest, without a request
  Client done(port);  // answered; sluice waits for its FIN (it never comes)
  done.send("GET /done HTTP/1.1\r\nHost: x\r\n\r\n");
  REQUIRE(l.run_until({&idle, &done}, [&] { return done.answered(); }));
  Client next(port);
  next.send("GET /next HTTP/1.1\r\nHost: x\r\n\r\n");
  REQUIRE(l.run_until({&idle, &next}, [&] { return next.answered(); }));
  CHECK(next.body() == "/next ");
  CHECK_FALSE(idle.eof);
  l.finish(server);
}

TEST_CASE("the gate answers before the body and before 100 Continue") {
  Loop l;
  HttpServer server(&l.loop, echo);
  server.set_gate([](const Request& r) {
    std::optional<Response> refused;
    if (r.headers.count("authorization") == 0) {
      refused.emplace();
      refused->status = 401;
      refused->body = "no";
    }
    return refused;
  });
  const int port = listen_port(server);

  Client refused(port);
  refused.send("PUT /config HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\nExpect: 100-continue\r\n\r\n");
  REQUIRE(l.run_until({&refused}, [&] { return refused.answered(); }));
  CHECK(refused.got.starts_with("HTTP/1.1 401 Unauthorized\r\n"));
  CHECK(refused.got.find("100 Continue") == std::string::npos);

  Client allowed(port);
  allowed.send("PUT /config HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\nAuthorization: x\r\n\r\n");
  REQUIRE(l.run_until({&allowed}, [&] { return allowed.got.size() >= 25; }));
  CHECK(allowed.got == "HTTP/1.1 100 Continue\r\n\r\n");
  allowed.send("abc");
  REQUIRE(l.run_until({&allowed}, [&] { return allowed.answered(); }));
  CHECK(allowed.got.starts_with("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"));
  CHECK(allowed.got.ends_with("\r\n\r\n/config abc"));
  l.finish(server);
}

TEST_CASE("HEAD answers the headers of GET without the body") {
  Loop l;
  HttpServer server(&l.loop, echo);
  const int port = listen_port(server);
  Client get(port);
  Client head(port);
  get.send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
  head.send("HEAD /x HTTP/1.1\r\nHost: x\r\n\r\n");
  REQUIRE(l.run_until({&get, &head}, [&] { return get.answered() && head.answered(); }));
  CHECK(get.body() == "/x ");
  CHECK(head.body().empty());
  CHECK(head.got == get.got.substr(0, get.got.size() - get.body().size()));
  CHECK(head.got.find("Content-Length: 3\r\n") != std::string::npos);
  l.finish(server);
}

TEST_CASE("a FIN right after the request does not cut a long answer") {
  Loop l;
  const std::string big(512 * 1024, 'x');
  HttpServer server(&l.loop, [&big](const Request&) {
    Response r;
    r.body = big;
    return r;
  });
  const int port = listen_port(server);
  Client c(port, true);
  c.send("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  REQUIRE(::shutdown(c.fd, SHUT_WR) == 0);
  // A slow reader: a little at each turn of the loop.
  REQUIRE(l.run_until({&c}, [&] { return c.eof; }, 2048));
  REQUIRE(c.got.find("\r\n\r\n") != std::string::npos);
  CHECK(c.body().size() == big.size());
  l.finish(server);
}
