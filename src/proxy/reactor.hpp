// A worker's own epoll set, for the data path.
//
// libuv's stream handles cost system calls a proxy does not need: an ioctl
// to make an accepted socket non-blocking (accept4 already did), an epoll
// MOD when a connect's POLLOUT is dropped, and, because libuv stops watching
// a socket lazily, a wake-up plus an epoll DEL after every EOF and a second
// DEL at close. Here every session socket is added once, edge-triggered,
// for reading and writing (nginx's way), and leaves the set when close(2)
// removes it: one epoll_ctl per socket.
//
// libuv keeps what it is good at (timers, the mailbox's async handle, the
// listeners' back-off timers): its own epoll descriptor sits in this set, and
// the worker runs libuv's loop for one non-blocking turn when that
// descriptor's event comes (in its place among the others) or a libuv timer
// is due. The worker's loop is then: wait here, dispatch the events, run the
// deferred work, maybe one libuv turn for timers, free what was retired.
//
// Edge-triggered means an event is reported once per change; whoever gets it
// must remember that a socket is readable (or writable) until a read (or a
// write) says EAGAIN, or until a read returns less than asked (new bytes
// bring a new edge). Work that stops before that, to be fair to the other
// sessions, is deferred: it runs after this round's events, and the next
// wait does not block while any is queued.
#pragma once

#include <sys/epoll.h>

#include <cstdint>

#include <uv.h>

namespace sluice {

// Something in a Reactor's set, told which events a wait reported for it.
class IoWatcher {
 public:
  virtual void on_io(std::uint32_t events) = 0;

 protected:
  ~IoWatcher() = default;
};

// Work that runs after the current round's events without waiting for an
// edge. Queued at most once; leaves the queue when it runs, when cancelled,
// or when destroyed.
class Deferred {
 public:
  virtual void run_deferred() = 0;
  bool deferred() const { return queued_; }

 protected:
  Deferred() = default;
  virtual ~Deferred();
  Deferred(const Deferred&) = delete;
  Deferred& operator=(const Deferred&) = delete;

 private:
  friend class Reactor;
  Deferred* prev_ = nullptr;
  Deferred* next_ = nullptr;
  Deferred** head_ = nullptr;  // the list it is queued in, while queued
  bool queued_ = false;
  void unlink();
};

class Reactor {
 public:
  // What every session socket is registered for, once.
  static constexpr std::uint32_t kStream = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  // Events per wait at most; the rest come with the next wait.
  static constexpr int kMaxEvents = 256;

  // `loop`: its clock is brought up to date after every wait, so that
  // uv_now() is right inside the callbacks.
  explicit Reactor(uv_loop_t* loop);
  ~Reactor();
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;

  // 0, or a libuv error code (a negative errno).
  int add(int fd, std::uint32_t events, IoWatcher* w);
  int remove(int fd);

  void defer(Deferred& d);
  void cancel(Deferred& d) { d.unlink(); }
  bool has_deferred() const { return deferred_ != nullptr; }

  // Waits up to `timeout_ms` (-1: until something happens; 0 when work is
  // deferred), dispatches every event, then runs the deferred work queued
  // before it started. Returns the number of events (0 on a timeout or
  // EINTR).
  int run_once(int timeout_ms);

  // With timing on ([global] log_phases), each wait's end is read from the
  // monotonic clock (uv_hrtime) for the sessions accepted in its turn.
  void set_timing(bool on) { timing_ = on; }
  std::uint64_t woke_ns() const { return woke_ns_; }  // 0 until a timed wait ended
  int last_events() const { return last_events_; }  // of the last timed wait

 private:
  int epfd_ = -1;
  uv_loop_t* loop_;
  Deferred* deferred_ = nullptr;
  std::uint64_t woke_ns_ = 0;
  int last_events_ = 0;
  bool timing_ = false;
};

}  // namespace sluice
