// What a session needs from the thread that runs it: its loop, its buffer
// pool, its timer queue and its list of live sessions. The worker (net/)
// implements it; proxy/ never includes net/.
#pragma once

#include <uv.h>

namespace sluice {

class BufferPool;
class Session;
class TimerQueue;

class SessionHost {
 public:
  virtual uv_loop_t* loop() = 0;
  virtual BufferPool& pool() = 0;
  // One timer for the deadlines of all the host's sessions.
  virtual TimerQueue& timers() = 0;
  // A session joins the list when it starts and leaves it from its last close
  // callback (the host may be waiting for its sessions to end).
  virtual void link(Session& s) = 0;
  virtual void unlink(Session& s) = 0;

 protected:
  ~SessionHost() = default;
};

// Every handle's `data` points at one of these, so a close callback finds its
// session without guessing which handle fired.
struct HandleOwner {
  Session* session = nullptr;
};

}  // namespace sluice
