// What a session needs from the thread that runs it: its loop's clock, its
// Reactor (the sockets' events), its buffer pool, its timer queue and its
// list of live sessions. The worker (net/) implements it; proxy/ never
// includes net/.
#pragma once

#include <functional>

#include <uv.h>

namespace sluice {

class BufferPool;
class Reactor;
class Session;
class TimerQueue;

class SessionHost {
 public:
  virtual uv_loop_t* loop() = 0;
  virtual Reactor& reactor() = 0;
  virtual BufferPool& pool() = 0;
  // One timer for the deadlines of all the host's sessions.
  virtual TimerQueue& timers() = 0;
  // A session joins the list when it starts and leaves it when it finishes
  // (the host may be waiting for its sessions to end).
  virtual void link(Session& s) = 0;
  virtual void unlink(Session& s) = 0;
  // A finished session: the host deletes it (Session::dispose) once the
  // current round of events and libuv callbacks is over, so that nothing
  // still on the stack, and no event of this round, can reach freed memory.
  virtual void retire(Session& s) = 0;
  // Runs `f` on the host's thread soon. Callable from any thread: a wait
  // queue's slot is handed over by whichever thread freed it. Dropped once
  // the host has stopped (no session is left to hear it).
  virtual void run_on_loop(std::function<void()> f) = 0;

 protected:
  ~SessionHost() = default;
};

}  // namespace sluice
