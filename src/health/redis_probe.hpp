// type = "redis": AUTH (when password_file is set), then ROLE and INFO
// replication (for the replication ids and a replica's lag), with
// hiredis's asynchronous API on the control loop. The libuv glue is ours,
// not hiredis 0.14's adapters/libuv.h: that one drops libuv's error status
// (a refused connect arrives as POLLERR, which libuv reports as UV_EBADF),
// so a refused connection would only show at the timeout; later hiredis
// releases fixed it the same way (hand the error to hiredis's read/write
// handlers). Ours also counts its poll handle with the probe's handles. role = "master" wants
// "master", "replica" wants "slave" (the reply's name for a replica), "any"
// accepts either.
#pragma once

#include <string>

#include "health/probe.hpp"

struct redisAsyncContext;
struct redisReply;

namespace sluice::health {

// The verdict on ROLE's first element: ok, and the reason.
std::pair<bool, std::string> judge_redis_role(const std::string& role, RedisRole want);

class RedisProbe final : public Probe {
 public:
  using Probe::Probe;
  ~RedisProbe() override;

 private:
  void begin() override;
  void abort() override;

  struct Events;
  bool attach(redisAsyncContext* ac);
  static void on_poll(uv_poll_t* h, int status, int events);
  static void on_connect(const redisAsyncContext* ac, int status);
  static void on_disconnect(const redisAsyncContext* ac, int status);
  static void on_auth(redisAsyncContext* ac, void* reply, void* privdata);
  static void on_role(redisAsyncContext* ac, void* reply, void* privdata);
  static void on_info(redisAsyncContext* ac, void* reply, void* privdata);
  // The probe a hiredis callback belongs to, or null when its check is over.
  static RedisProbe* live(const redisAsyncContext* ac);

  redisAsyncContext* ac_ = nullptr;  // null when no connection is open
  // ROLE's verdict, given once INFO replication has answered too.
  bool role_read_ = false;
  bool role_ok_ = false;
  std::string role_reason_;
};

}  // namespace sluice::health
