// `loadgen serve`: the backend every benchmark load talks to through the proxy.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "commands.hpp"
#include "integrity.hpp"
#include "net.hpp"
#include "stop_signal.hpp"

namespace loadgen {
namespace {

// echo_close: echoes the first read, then closes (the server sends FIN first,
// as HTTP/1.0 servers and database logouts do). integrity: the backend side
// of the integrity protocol (integrity.hpp).
enum class Mode { echo, sink, source, banner, echo_close, integrity };

struct ServerContext {
  Poller* poller = nullptr;
  Mode mode = Mode::echo;
  SSL_CTX* tls = nullptr;
  std::string banner;
};

constexpr std::size_t kEchoBuffer = 16 * 1024;
constexpr std::size_t kSourceChunk = 256 * 1024;

// Shared bytes the source mode sends over and over.
const char* source_bytes() {
  static const std::vector<char> bytes = [] {
    std::vector<char> b(kSourceChunk);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>('a' + i % 26);
    return b;
  }();
  return bytes.data();
}

// A plain-TCP connection in one of the four modes.
class PlainConn : public Handler {
 public:
  PlainConn(ServerContext& ctx, int fd) : ctx_(ctx), fd_(fd) {
    if (ctx_.mode == Mode::source) {
      ctx_.poller->add(fd_, EPOLLIN | EPOLLOUT, this);
      return;
    }
    if (ctx_.mode == Mode::banner) {
      // A banner is a few bytes on a fresh socket; a short send is not worth handling.
      if (send(fd_, ctx_.banner.data(), ctx_.banner.size(), MSG_NOSIGNAL) < 0) {
        fd_ = -1;
        close(fd);
        return;
      }
    }
    ctx_.poller->add(fd_, EPOLLIN, this);
  }
  bool alive() const { return fd_ >= 0; }

  void on_event(std::uint32_t events) override {
    switch (ctx_.mode) {
      case Mode::source: return on_source(events);
      case Mode::sink: return on_sink();
      case Mode::echo:
      case Mode::banner:
      case Mode::echo_close: return on_echo(events);
      case Mode::integrity: return;  // served by integrity::serve_connection
    }
  }

 private:
  void finish() {
    close(fd_);
    delete this;
  }

  void on_source(std::uint32_t events) {
    if (events & EPOLLIN) {
      char scratch[4096];
      ssize_t n = read(fd_, scratch, sizeof scratch);
      if (n == 0 || (n < 0 && errno != EAGAIN)) return finish();
    }
    if (events & EPOLLOUT) {
      for (int i = 0; i < 4; ++i) {
        ssize_t w = send(fd_, source_bytes(), kSourceChunk, MSG_NOSIGNAL);
        if (w < 0) {
          if (errno == EAGAIN) return;
          return finish();
        }
      }
    } else if (events & (EPOLLERR | EPOLLHUP)) {
      return finish();
    }
  }

  void on_sink() {
    char scratch[64 * 1024];
    for (int i = 0; i < 4; ++i) {
      ssize_t n = read(fd_, scratch, sizeof scratch);
      if (n == 0 || (n < 0 && errno != EAGAIN)) return finish();
      if (n < 0) return;
    }
  }

  void on_echo(std::uint32_t events) {
    if (pending_ > 0) {
      if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
      ssize_t w = send(fd_, buf_.data() + offset_, pending_, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EAGAIN) return;
        return finish();
      }
      offset_ += static_cast<std::size_t>(w);
      pending_ -= static_cast<std::size_t>(w);
      if (pending_ == 0 && ctx_.mode == Mode::echo_close) return finish();
      if (pending_ == 0) ctx_.poller->modify(fd_, EPOLLIN, this);
      return;
    }
    if (buf_.empty()) buf_.resize(kEchoBuffer);
    ssize_t n = read(fd_, buf_.data(), buf_.size());
    if (n == 0) return finish();
    if (n < 0) {
      if (errno == EAGAIN) return;
      return finish();
    }
    ssize_t w = send(fd_, buf_.data(), static_cast<std::size_t>(n), MSG_NOSIGNAL);
    if (w < 0) {
      if (errno != EAGAIN) return finish();
      w = 0;
    }
    if (w < n) {
      offset_ = static_cast<std::size_t>(w);
      pending_ = static_cast<std::size_t>(n - w);
      ctx_.poller->modify(fd_, EPOLLOUT, this);
    } else if (ctx_.mode == Mode::echo_close) {
      finish();
    }
  }

  ServerContext& ctx_;
  int fd_;
  std::vector<char> buf_;
  std::size_t offset_ = 0;
  std::size_t pending_ = 0;
};

// A TLS connection: full server handshake, then echo of decrypted bytes.
class TlsConn : public Handler {
 public:
  TlsConn(ServerContext& ctx, int fd) : ctx_(ctx), fd_(fd), ssl_(SSL_new(ctx.tls)) {
    SSL_set_fd(ssl_, fd_);
    SSL_set_accept_state(ssl_);
    ctx_.poller->add(fd_, EPOLLIN, this);
  }

  void on_event(std::uint32_t /*events*/) override {
    if (!handshaken_) {
      int rc = SSL_do_handshake(ssl_);
      if (rc != 1) return wait_or_finish(rc);
      handshaken_ = true;
    }
    if (pending_ > 0) {
      int rc = SSL_write(ssl_, buf_.data(), static_cast<int>(pending_));
      if (rc <= 0) return wait_or_finish(rc);
      pending_ = 0;
    }
    if (buf_.empty()) buf_.resize(kEchoBuffer);
    // Drain what OpenSSL already decrypted: epoll cannot see it.
    for (int i = 0; i < 64; ++i) {
      int n = SSL_read(ssl_, buf_.data(), static_cast<int>(buf_.size()));
      if (n <= 0) return wait_or_finish(n);
      int rc = SSL_write(ssl_, buf_.data(), n);
      if (rc <= 0) {
        pending_ = static_cast<std::size_t>(n);
        return wait_or_finish(rc);
      }
    }
  }

 private:
  void wait_or_finish(int rc) {
    switch (SSL_get_error(ssl_, rc)) {
      case SSL_ERROR_WANT_READ: return interest(EPOLLIN);
      case SSL_ERROR_WANT_WRITE: return interest(EPOLLOUT);
      default: break;
    }
    ERR_clear_error();
    if (handshaken_) SSL_shutdown(ssl_);
    SSL_free(ssl_);
    close(fd_);
    delete this;
  }

  void interest(std::uint32_t events) {
    if (events != events_) {
      events_ = events;
      ctx_.poller->modify(fd_, events, this);
    }
  }

  ServerContext& ctx_;
  int fd_;
  SSL* ssl_;
  bool handshaken_ = false;
  std::vector<char> buf_;
  std::size_t pending_ = 0;
  std::uint32_t events_ = EPOLLIN;
};

class Listener : public Handler {
 public:
  Listener(ServerContext& ctx, int fd) : ctx_(ctx), fd_(fd) {
    if (ctx_.mode == Mode::integrity) {
      // Accepted sockets inherit it: a kill between accept() and the
      // connection's own setting must reset, not end with a clean FIN.
      integrity::set_linger(fd_, true);
    }
    ctx_.poller->add(fd_, EPOLLIN, this);
  }
  ~Listener() override { close(fd_); }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  void on_event(std::uint32_t /*events*/) override {
    for (int i = 0; i < 64; ++i) {
      int fd = accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or EMFILE: try again on the next wakeup
      set_nodelay(fd);
      if (ctx_.tls != nullptr) {
        new TlsConn(ctx_, fd);
      } else if (ctx_.mode == Mode::integrity) {
        integrity::serve_connection(*ctx_.poller, fd);
      } else {
        auto* conn = new PlainConn(ctx_, fd);
        if (!conn->alive()) delete conn;
      }
    }
  }

 private:
  ServerContext& ctx_;
  int fd_;
};

SSL_CTX* make_server_tls(const std::string& cert, const std::string& key) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return nullptr;
  if (SSL_CTX_use_certificate_chain_file(ctx, cert.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    SSL_CTX_free(ctx);
    return nullptr;
  }
  // Every handshake in the benchmark must be a full one.
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return ctx;
}

}  // namespace

int run_serve(const Options& opts) {
  ServerContext ctx;
  std::string mode = opts.str("mode", "echo");
  if (mode == "echo") {
    ctx.mode = Mode::echo;
  } else if (mode == "sink") {
    ctx.mode = Mode::sink;
  } else if (mode == "source") {
    ctx.mode = Mode::source;
  } else if (mode == "banner") {
    ctx.mode = Mode::banner;
  } else if (mode == "echo_close") {
    ctx.mode = Mode::echo_close;
  } else if (mode == "integrity") {
    ctx.mode = Mode::integrity;
  } else {
    std::fprintf(stderr, "loadgen serve: --mode must be echo, echo_close, sink, source, banner or integrity\n");
    return 2;
  }
  if (opts.has("tls")) {
    const auto& files = opts.values("tls");
    if (files.size() != 2) {
      std::fprintf(stderr, "loadgen serve: --tls takes CERT KEY\n");
      return 2;
    }
    if (ctx.mode != Mode::echo) {
      std::fprintf(stderr, "loadgen serve: --tls works with --mode echo only\n");
      return 2;
    }
    ctx.tls = make_server_tls(files[0], files[1]);
    if (ctx.tls == nullptr) {
      std::fprintf(stderr, "loadgen serve: cannot load %s / %s\n", files[0].c_str(), files[1].c_str());
      return 1;
    }
  }
  raise_fd_limit();
  Poller poller;
  ctx.poller = &poller;
  StopSignal stop(poller, false);

  std::string host = opts.str("host", "127.0.0.1");
  auto port = static_cast<std::uint16_t>(opts.count("port", 0));
  auto count = opts.count("listeners", 1);
  if (count < 1 || count > 64) {
    std::fprintf(stderr, "loadgen serve: --listeners must be 1..64\n");
    return 2;
  }
  std::vector<std::unique_ptr<Listener>> listeners;
  for (std::uint64_t i = 0; i < count; ++i) {
    std::uint16_t bound = 0;
    int fd = listen_on(host, port == 0 ? 0 : static_cast<std::uint16_t>(port + i), bound);
    if (fd < 0) {
      std::fprintf(stderr, "loadgen serve: cannot listen on %s:%u: %s\n", host.c_str(),
                   static_cast<unsigned>(port), std::strerror(errno));
      return 1;
    }
    if (listeners.empty()) ctx.banner = "loadgen " + std::to_string(bound) + "\n";
    listeners.push_back(std::make_unique<Listener>(ctx, fd));
    std::printf("listening %u\n", static_cast<unsigned>(bound));
  }
  std::fflush(stdout);
  while (!stop.stopped()) poller.poll(1000);
  // Open connections are left to the kernel at exit; the process is ending.
  if (ctx.tls != nullptr) SSL_CTX_free(ctx.tls);
  return 0;
}

}  // namespace loadgen
