// One kind of active check against one server, driven by the control loop.
// A probe runs at most one check at a time; each check ends with exactly one
// result (a verdict + a human-readable reason such as "connection refused",
// "HTTP 503", "role is replica, want master", "timeout after 1s"), unless
// the probe is closed first. The timeout covers the whole check: connect,
// authentication, request and reply.
#pragma once

#include <uv.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "health/handles.hpp"
#include "health/one_writer.hpp"
#include "sluice/config.hpp"

namespace sluice::health {

class Probe {
 public:
  // How a check ended. `local_error`: sluice could not run it for want of
  // its own resources (socket() or connect() failing with EMFILE, ENFILE,
  // EADDRNOTAVAIL, ENOBUFS, ENOMEM). That says nothing about the server: it
  // is neither a pass nor a failure.
  enum class Verdict { pass, fail, local_error };
  using Result = std::function<void(Verdict verdict, std::string reason)>;

  // `target` is the address to probe (the server's, or its health port).
  Probe(uv_loop_t* loop, const HealthConfig& config, const Endpoint& target);
  Probe(const Probe&) = delete;
  Probe& operator=(const Probe&) = delete;
  virtual ~Probe();

  // Starts one check; `result` is called once, on a later loop turn of its
  // own (never from inside start() or a library's callback, so it may start
  // the next check or close the probe). Ignored while a check is in flight
  // or after close().
  void start(Result result);
  bool busy() const { return static_cast<bool>(result_); }

  // Drops any check in flight (no result) and closes every handle; `closed`
  // runs once the last one has closed. Only then may the probe be deleted.
  void close(std::function<void()> closed);

  const Endpoint& target() const { return target_; }
  const HealthConfig& config() const { return config_; }
  // What the last check read about the server's role and history (role
  // checks only; `answered` false otherwise).
  const RoleFacts& facts() const { return role_facts_; }

 protected:
  // Opens what the check needs and eventually calls finish() (at once too:
  // the result is delivered later anyway).
  virtual void begin() = 0;
  // Releases whatever a check holds (closing handles through handles_),
  // without a result. Called by finish(), timeouts and close().
  virtual void abort() = 0;

  // Decides the check in flight (no-op when none or already decided):
  // abort() now, the result on the next loop turn.
  void finish(bool ok, std::string reason) { finish(ok ? Verdict::pass : Verdict::fail, std::move(reason)); }
  void finish(Verdict verdict, std::string reason);
  // The verdict of a check that failed with libuv's `uv_err` on socket() or
  // connect(): local_error when the error is sluice's own, else fail.
  static Verdict failed_with(int uv_err);
  // The same for client libraries that report a failed socket() or connect()
  // only as text (libpq, hiredis): local_error when `message` is one of
  // those errors' texts (see names_local_resource_error), else fail.
  static Verdict failed_with_message(std::string_view message);
  // The reason logged for a connect that failed with libuv's `uv_err`:
  // "connect refused", "connect timed out", else "connect failed: TEXT".
  static std::string connect_reason(int uv_err);
  // The same for a client library's message: "connect refused: MESSAGE"
  // when it says so, else the message.
  static std::string connect_reason(std::string message);
  // The password from password_file (read at every check, so a rotated
  // secret needs no reload); "" when none is configured. When the file
  // cannot be read, fails the check and returns false.
  bool read_password(std::string& out);
  // A check is running and not yet decided.
  bool in_flight() const { return result_ && !decided_; }
  // For probes whose client library reads the socket and would buffer a
  // reply of any size (hiredis, libpq): fails the check when the server has
  // sent more than kMaxReplyBytes on `fd` in all, and returns true. Called
  // after each time the library read, so the library holds at most the cap
  // plus one read.
  bool over_reply_cap(int fd);
  // Why a check failed at the cap: "reply over the 64 KiB cap".
  static std::string reply_cap_reason();

  uv_loop_t* loop_;
  RoleFacts role_facts_;  // reset at each start()
  const HealthConfig config_;
  const Endpoint target_;
  HandleTracker handles_;

 private:
  using Timer = Handle<uv_timer_t, Probe>;
  static void on_timeout(uv_timer_t* t);

  Timer* timer_ = nullptr;
  Result result_;
  bool decided_ = false;  // the timer now delivers the result, not the timeout
  Verdict verdict_ = Verdict::fail;
  std::string reason_;
  bool closing_ = false;
};

// The probe for `config.type`. `server` is the server's address; a non-zero
// config.port replaces its port.
std::unique_ptr<Probe> make_probe(uv_loop_t* loop, const HealthConfig& config, const Endpoint& server);

// `server` with another port (0 = unchanged), in the address and the text.
Endpoint with_port(const Endpoint& server, std::uint16_t port);

// The first line of a secret file (a password), without its line end. On
// failure returns "" and sets `error`.
std::string read_secret(const std::string& path, std::string& error);

}  // namespace sluice::health
