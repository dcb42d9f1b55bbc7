#include "health/redis_probe.hpp"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "health/match.hpp"
#include "sluice/address.hpp"

namespace sluice::health {

std::pair<bool, std::string> judge_redis_role(const std::string& role, RedisRole want) {
  // Servers before 5.0 only say "slave"; newer ones still do in ROLE.
  const std::string name = role == "slave" || role == "replica" ? "replica" : role;
  std::string reason = "role is " + name;
  switch (want) {
    case RedisRole::any:
      return {name == "master" || name == "replica", reason};
    case RedisRole::master:
      return {name == "master", name == "master" ? reason : reason + ", want master"};
    case RedisRole::replica:
      return {name == "replica", name == "replica" ? reason : reason + ", want replica"};
  }
  return {false, reason};
}

namespace {

// hiredis's error for the context, or `fallback` when it has none.
std::string error_of(const redisAsyncContext* ac, const char* fallback) {
  return ac->errstr[0] != '\0' ? lower_first(ac->errstr) : fallback;
}

std::string reply_error(const redisReply* r) {
  return std::string(r->str != nullptr ? r->str : "", r->str != nullptr ? r->len : 0);
}

}  // namespace

// hiredis's event hooks for one connection, on a poll handle of ours.
struct RedisProbe::Events : Handle<uv_poll_t, RedisProbe> {
  using Handle::Handle;
  static Events* from(void* p) { return static_cast<Events*>(static_cast<HandleRecord*>(p)); }
  void want(int add, int remove) {
    events = (events | add) & ~remove;
    if (events != 0) {
      uv_poll_start(&uv, events, &RedisProbe::on_poll);
    } else {
      uv_poll_stop(&uv);
    }
  }
  redisAsyncContext* ac = nullptr;  // null once hiredis let go of it
  int events = 0;
};

bool RedisProbe::attach(redisAsyncContext* ac) {
  auto* ev = handles_.add(new Events(this));
  if (uv_poll_init_socket(loop_, &ev->uv, ac->c.fd) != 0) {
    handles_.forget(ev);
    return false;
  }
  ev->ac = ac;
  ac->ev.data = static_cast<HandleRecord*>(ev);
  ac->ev.addRead = [](void* p) { Events::from(p)->want(UV_READABLE, 0); };
  ac->ev.delRead = [](void* p) { Events::from(p)->want(0, UV_READABLE); };
  ac->ev.addWrite = [](void* p) { Events::from(p)->want(UV_WRITABLE, 0); };
  ac->ev.delWrite = [](void* p) { Events::from(p)->want(0, UV_WRITABLE); };
  ac->ev.cleanup = [](void* p) {  // hiredis is freeing the context (the socket closes after this)
    Events* e = Events::from(p);
    e->ac = nullptr;
    HandleTracker::close(e);
  };
  return true;
}

void RedisProbe::on_poll(uv_poll_t* h, int status, int events) {
  auto* ev = Events::from(h->data);
  // On an error libuv stops the handle; hiredis finds the cause itself.
  const int ready = status < 0 ? ev->events : events;
  if (ev->ac != nullptr && (ready & UV_READABLE) != 0) {
    // hiredis keeps an unfinished reply whole ("$2000000000" and then
    // bytes): it reads 16 KiB a turn, so checking after each read bounds it.
    const int fd = ev->ac->c.fd;
    redisAsyncHandleRead(ev->ac);
    RedisProbe* self = ev->owner;
    if (ev->ac != nullptr && self->ac_ == ev->ac && self->in_flight() && self->over_reply_cap(fd)) return;
  }
  if (ev->ac != nullptr && (ready & UV_WRITABLE) != 0) redisAsyncHandleWrite(ev->ac);
}

RedisProbe::~RedisProbe() { abort(); }

RedisProbe* RedisProbe::live(const redisAsyncContext* ac) {
  auto* self = static_cast<RedisProbe*>(ac->data);
  return self != nullptr && self->ac_ == ac && self->in_flight() ? self : nullptr;
}

void RedisProbe::begin() {
  role_read_ = false;
  role_ok_ = false;
  role_reason_.clear();
  std::string password;
  if (!read_password(password)) return;
  const std::string ip = format_ip(reinterpret_cast<const sockaddr*>(&target_.addr));
  redisAsyncContext* ac = redisAsyncConnect(ip.c_str(), target_.port);
  if (ac == nullptr) {
    finish(Verdict::local_error, "out of memory");
    return;
  }
  if (ac->err != 0) {
    std::string reason = error_of(ac, "connect failed");
    redisAsyncFree(ac);
    finish(failed_with_message(reason), reason);
    return;
  }
  if (!attach(ac)) {
    redisAsyncFree(ac);
    finish(false, "cannot watch the redis socket");
    return;
  }
  ac->data = this;
  ac_ = ac;
  redisAsyncSetConnectCallback(ac, &RedisProbe::on_connect);
  redisAsyncSetDisconnectCallback(ac, &RedisProbe::on_disconnect);
  // Queued now, written once connected; replies come in order.
  if (!password.empty()) {
    redisAsyncCommand(ac, &RedisProbe::on_auth, nullptr, "AUTH %b", password.data(), password.size());
  }
  redisAsyncCommand(ac, &RedisProbe::on_role, nullptr, "ROLE");
  // The replication ids (which node took over from which: one writer) and
  // a replica's lag. A server that refuses INFO still has its verdict.
  redisAsyncCommand(ac, &RedisProbe::on_info, nullptr, "INFO replication");
}

void RedisProbe::abort() {
  redisAsyncContext* ac = ac_;
  if (ac == nullptr) return;
  // Cleared first: freeing runs the pending callbacks (with no reply) and
  // the disconnect callback, which must see the check as over.
  ac_ = nullptr;
  ac->data = nullptr;
  redisAsyncFree(ac);  // inside a hiredis callback this only marks it; hiredis frees it after
}

void RedisProbe::on_connect(const redisAsyncContext* ac, int status) {
  if (status == REDIS_OK) return;
  RedisProbe* self = live(ac);
  if (self == nullptr) return;
  // hiredis frees the context itself after this callback.
  self->ac_ = nullptr;
  std::string reason = error_of(ac, "connect failed");
  const Verdict verdict = failed_with_message(reason);
  self->finish(verdict, connect_reason(std::move(reason)));
}

void RedisProbe::on_disconnect(const redisAsyncContext* ac, int) {
  RedisProbe* self = live(ac);
  if (self == nullptr) return;
  self->ac_ = nullptr;  // freed by hiredis after this callback
  self->finish(false, error_of(ac, "connection closed"));
}

void RedisProbe::on_auth(redisAsyncContext* ac, void* r, void*) {
  RedisProbe* self = live(ac);
  if (self == nullptr) return;
  const auto* reply = static_cast<const redisReply*>(r);
  if (reply == nullptr) {
    self->finish(false, error_of(ac, "connection closed"));
  } else if (reply->type == REDIS_REPLY_ERROR) {
    self->finish(false, "AUTH failed: " + quote_bytes(reply_error(reply), 80));
  }
}

void RedisProbe::on_role(redisAsyncContext* ac, void* r, void*) {
  RedisProbe* self = live(ac);
  if (self == nullptr) return;
  const auto* reply = static_cast<const redisReply*>(r);
  if (reply == nullptr) {
    self->finish(false, error_of(ac, "connection closed"));
    return;
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    self->finish(false, "ROLE failed: " + quote_bytes(reply_error(reply), 80));
    return;
  }
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements == 0 ||
      (reply->element[0]->type != REDIS_REPLY_STRING && reply->element[0]->type != REDIS_REPLY_STATUS)) {
    self->finish(false, "unexpected reply to ROLE");
    return;
  }
  const redisReply* first = reply->element[0];
  const std::string role(first->str, first->len);
  auto [ok, reason] = judge_redis_role(role, self->config_.redis_role);
  self->role_facts_.answered = role == "master" || role == "slave" || role == "replica";
  self->role_facts_.primary = role == "master";
  self->role_facts_.role = role == "master" ? "master" : self->role_facts_.answered ? "replica" : role;
  self->role_ok_ = ok;
  self->role_reason_ = std::move(reason);
  self->role_read_ = true;
}

void RedisProbe::on_info(redisAsyncContext* ac, void* r, void*) {
  RedisProbe* self = live(ac);
  if (self == nullptr) return;
  const auto* reply = static_cast<const redisReply*>(r);
  if (reply == nullptr) {
    self->finish(false, error_of(ac, "connection closed"));
    return;
  }
  if (!self->role_read_) return;  // ROLE's answer decided already
  if (reply->type == REDIS_REPLY_STRING) {
    const std::string_view info(reply->str, reply->len);
    RoleFacts& f = self->role_facts_;
    f.replid = info_field(info, "master_replid");
    f.replid2 = info_field(info, "master_replid2");
    if (!f.primary && info_field(info, "master_link_status") == "up") {
      const std::string io = info_field(info, "master_last_io_seconds_ago");
      if (!io.empty()) f.lag_seconds = std::max(0.0, std::strtod(io.c_str(), nullptr));
    }
  }
  self->finish(self->role_ok_, std::move(self->role_reason_));
}

}  // namespace sluice::health
