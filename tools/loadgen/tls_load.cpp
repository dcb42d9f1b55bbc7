// `loadgen tls`: many short TLS connections — full handshake with SNI (no
// session resumption), one echo round trip, close.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include "commands.hpp"
#include "slot_driver.hpp"

namespace loadgen {
namespace {

struct TlsLoad : SlotLoad {
  SSL_CTX* ctx = nullptr;
  std::vector<std::string> names;
  std::size_t next_name = 0;
  bool verify_name = false;
  std::vector<char> payload;
};

std::string ssl_error_text(const char* what) {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return std::string(what) + ": " + (errno != 0 ? std::strerror(errno) : "connection closed");
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return std::string(what) + ": " + buf;
}

class TlsSlot : public Handler {
 public:
  enum class State { idle, connecting, handshaking, writing, reading };

  explicit TlsSlot(TlsLoad& load) : load_(load) {}
  ~TlsSlot() override { reset(); }
  TlsSlot(const TlsSlot&) = delete;
  TlsSlot& operator=(const TlsSlot&) = delete;

  bool ready_to_start(Clock::time_point now) const { return state_ == State::idle && now >= retry_at_; }

  void start() {
    if (!load_.running) return;
    started_ = Clock::now();
    got_ = 0;
    fd_ = start_connect(load_.target);
    if (fd_ < 0) return fail(errno_text("connect", errno));
    state_ = State::connecting;
    events_ = EPOLLOUT;
    load_.poller.add(fd_, EPOLLOUT, this);
  }

  void on_event(std::uint32_t /*events*/) override {
    if (state_ == State::connecting) {
      int err = connect_result(fd_);
      if (err != 0) return fail(errno_text("connect", err));
      ssl_ = SSL_new(load_.ctx);
      name_ = load_.names[load_.next_name++ % load_.names.size()];
      SSL_set_fd(ssl_, fd_);
      // SSL_set_tlsext_host_name() is a macro with a C cast; this is what it expands to.
      SSL_ctrl(ssl_, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
               const_cast<char*>(name_.c_str()));
      SSL_set_connect_state(ssl_);
      state_ = State::handshaking;
    }
    if (state_ == State::handshaking) {
      errno = 0;
      int rc = SSL_do_handshake(ssl_);
      if (rc != 1) return wait_or_fail(rc, "handshake");
      if (load_.verify_name && !peer_matches()) {
        return fail("certificate does not match SNI " + name_ + " (routed to the wrong backend)");
      }
      state_ = State::writing;
    }
    if (state_ == State::writing) {
      errno = 0;
      int rc = SSL_write(ssl_, load_.payload.data(), static_cast<int>(load_.payload.size()));
      if (rc <= 0) return wait_or_fail(rc, "write");
      state_ = State::reading;
    }
    char buf[4096];
    for (;;) {
      errno = 0;
      int n = SSL_read(ssl_, buf, sizeof buf);
      if (n <= 0) return wait_or_fail(n, "read");
      got_ += static_cast<std::size_t>(n);
      if (got_ >= load_.payload.size()) break;
    }
    auto now = Clock::now();
    SSL_shutdown(ssl_);  // sends close_notify; the reply is not awaited
    reset();
    if (!load_.running) return;
    ++load_.ops;
    load_.latency.add(now - started_);
    start();
  }

  void abandon() { reset(); }

 private:
  void reset() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    ssl_ = nullptr;
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    state_ = State::idle;
  }

  bool peer_matches() {
    X509* cert = SSL_get1_peer_certificate(ssl_);
    if (cert == nullptr) return false;
    bool ok = X509_check_host(cert, name_.c_str(), name_.size(), 0, nullptr) == 1;
    X509_free(cert);
    return ok;
  }

  void wait_or_fail(int rc, const char* what) {
    int err = SSL_get_error(ssl_, rc);
    std::uint32_t want = 0;
    if (err == SSL_ERROR_WANT_READ) want = EPOLLIN;
    if (err == SSL_ERROR_WANT_WRITE) want = EPOLLOUT;
    if (want == 0) return fail(ssl_error_text(what));
    if (want != events_) {
      events_ = want;
      load_.poller.modify(fd_, want, this);
    }
  }

  void fail(const std::string& why) {
    reset();
    retry_at_ = Clock::now() + kRetryDelay;
    if (load_.running) load_.errors.add(why);
  }

  TlsLoad& load_;
  State state_ = State::idle;
  int fd_ = -1;
  SSL* ssl_ = nullptr;
  std::string name_;
  std::uint32_t events_ = EPOLLOUT;
  std::size_t got_ = 0;
  Clock::time_point started_;
  Clock::time_point retry_at_;
};

SSL_CTX* make_client_tls() {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) return nullptr;
  // Self-signed benchmark certificates; the name check is done by hand.
  SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
  // Every connection must be a full handshake.
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
  return ctx;
}

}  // namespace

int run_tls(const Options& opts) {
  auto load = std::make_unique<TlsLoad>();
  if (!target_option(opts, "tls", load->target)) return 2;
  std::stringstream names(opts.str("sni"));
  for (std::string name; std::getline(names, name, ',');) {
    if (!name.empty()) load->names.push_back(name);
  }
  if (load->names.empty()) {
    std::fprintf(stderr, "loadgen tls: --sni NAME[,NAME...] is required\n");
    return 2;
  }
  auto o = slot_options(opts, "tls", 16, {"payload", 32, 16384, "16384"});
  if (!o) return 2;
  load->verify_name = opts.has("verify-name");
  load->payload.assign(o->size, 't');
  load->ctx = make_client_tls();
  if (load->ctx == nullptr) {
    std::fprintf(stderr, "loadgen tls: cannot create a TLS context\n");
    return 1;
  }
  raise_fd_limit();
  StopSignal stop(load->poller, false);

  double elapsed = drive_slots<TlsSlot>(*load, stop, o->concurrency, o->duration);
  SSL_CTX_free(load->ctx);
  return report_slot_load("tls", *load, o->concurrency, elapsed, "ops", [](JsonLine&) {});
}

}  // namespace loadgen
