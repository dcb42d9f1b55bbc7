// A worker: one thread, its own Reactor (the epoll set of its sessions' and
// listeners' sockets) with a libuv loop inside it for timers and the
// mailbox, its own listening socket per listener (SO_REUSEPORT, so the
// kernel spreads accepts), its own buffer pool and the list of its live
// sessions. Sessions never cross workers.
//
// The control loop talks to a worker only through its mailbox (a locked queue
// plus an eventfd): a new Snapshot with listener changes, "close the
// sessions of server X", or "stop". Nothing else reaches into a worker.
//
// Not a uv_async_t: libuv's uv_async_send marks the handle busy, writes its
// descriptor, then marks it done, and the receiving loop spins (and calls
// sched_yield) while it is busy. A worker woken by that write on the
// sender's core preempts the sender between the two marks and then spins
// until the sender runs again: measured, every reload cost the worker's
// clients that wait (docs/decisions.md, "The mailbox is an eventfd").
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <uv.h>

#include "proxy/buffer_pool.hpp"
#include "proxy/reactor.hpp"
#include "proxy/session_host.hpp"
#include "proxy/timer_queue.hpp"
#include "sluice/cause.hpp"
#include "sluice/config.hpp"
#include "upgrade/channel.hpp"

namespace sluice {

class Session;
class ServerState;

class Snapshot;
class Worker;

struct WorkerCommand {
  enum class Kind { update, close_sessions, stop, stop_now, hand_over, adopt, answer, recall, close_rest };
  Kind kind = Kind::update;

  // update: the Snapshot new sessions use from now on, the listening sockets
  // to start (socket id, this worker's fd) and to stop (socket id), and which
  // listener (by name) each socket id serves in `snapshot`.
  std::shared_ptr<const Snapshot> snapshot;
  std::vector<std::pair<std::uint64_t, int>> open;
  std::vector<std::uint64_t> close;
  std::vector<std::pair<std::uint64_t, std::string>> names;

  // close_sessions: end the sessions on `server` (every session of the
  // worker when null) with `cause`, one by one over `spread` from now (0 =
  // at once): the facility for any path that would otherwise close many
  // sessions in the same instant ([global] close_spread; see
  // Worker::close_spread).
  // stop: stop accepting, let sessions finish up to shutdown_timeout.
  // stop_now: as stop, and close every session at once (cause shutdown).
  //
  // Binary upgrade, the old process:
  // hand_over: a new binary serves on the same sockets now: stop accepting,
  // send each session over `channel` once it may move, and keep running
  // (sessions or not) until the control loop says otherwise: `stop` once
  // the hand-over is over, `recall` if the new process failed.
  // answer: the new process's word on session `seq` of this worker:
  // `adopted` (its descriptors here close) or not (it carries on here).
  // recall: every session still waiting for the new process's word stays
  // here, and no more move; with `snapshot` (and `open`, `names` as for
  // update) this worker accepts again.
  // close_rest: upgrade_finish_timeout has passed: sessions still waiting
  // for the new process's word are left to it, the rest end with `cause`
  // (upgrade) within `spread`.
  //
  // The new process:
  // adopt: a session the old process handed over: its record, and its
  // client and server sockets (and the memory file of its pending bytes,
  // when it has any) as the entries of `open` (so that a command dropped
  // unread closes them like any other socket); the answer goes on
  // `channel`.
  std::shared_ptr<upgrade::Channel> channel;
  std::vector<std::string> record;
  std::uint64_t seq = 0;
  bool adopted = false;
  std::shared_ptr<const ServerState> server;
  Cause cause = Cause::none;
  Duration spread{0};

  static WorkerCommand of(Kind k) {
    WorkerCommand c;
    c.kind = k;
    return c;
  }
};

class Worker final : public SessionHost {
 public:
  // `stopped` (on the control loop) is signalled once this worker's loop has
  // ended after a stop.
  Worker(unsigned id, uv_async_t* stopped);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void start();  // spawns the thread
  // The thread, once started (to pin it to CPUs).
  std::thread::native_handle_type native_handle() { return thread_.native_handle(); }
  void join();
  // Thread-safe; the only way in once the thread runs. Valid until the
  // Worker is destroyed: once the worker's loop has ended after a stop, a
  // command is dropped (a stopped worker has nothing left to update or
  // close).
  void post(WorkerCommand command);

  unsigned id() const { return id_; }
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  // Binary upgrade, for the control loop: this worker has stopped accepting
  // for a hand-over; the sessions it holds (those on their way included).
  bool handed_over() const { return handed_over_.load(std::memory_order_acquire); }
  std::size_t live_sessions() const { return live_sessions_.load(std::memory_order_acquire); }

  // SessionHost
  uv_loop_t* loop() override { return &loop_; }
  Reactor& reactor() override { return *reactor_; }
  BufferPool& pool() override { return pool_; }
  TimerQueue& timers() override { return *timers_; }
  void link(Session& s) override;
  void unlink(Session& s) override;
  void retire(Session& s) override { retired_.push_back(&s); }
  void run_on_loop(std::function<void()> f) override;

 private:
  struct Listener;
  // libuv's own epoll descriptor, in the Reactor: readable when a libuv
  // handle (the mailbox above all) has something to say. libuv gets its
  // turn right then, in the order the events came: a Snapshot posted before
  // a client connected is in place before that client is accepted.
  struct LoopWatcher final : IoWatcher {
    uv_loop_t* loop = nullptr;
    void on_io(std::uint32_t /*events*/) override { uv_run(loop, UV_RUN_NOWAIT); }
  };

  void run();
  void drain_mailbox();
  void apply_update(WorkerCommand& c);
  void close_sessions(const WorkerCommand& c);
  // Ends the sessions on `only` (every session when null) that are not
  // already closing with `cause`, one by one over `window` from now (all at
  // once when it is 0), evenly (CloseSpread): none at or after the
  // window's end. A session already due to close earlier keeps its time.
  // Returns how many it scheduled.
  std::size_t close_spread(const ServerState* only, Cause cause, Duration window);
  void begin_stop();
  void begin_hand_over(std::shared_ptr<upgrade::Channel> channel);
  void move_sessions();
  void answer(const WorkerCommand& c);
  // The new process: sends the answers waiting for room on the channel,
  // in order; an adopted session runs once its answer has gone.
  void flush_answers();
  static void on_answer_timer(uv_timer_t* t);
  void recall(WorkerCommand& c);
  void close_rest(const WorkerCommand& c);
  void adopt(WorkerCommand& c);
  // Runs an adopted session whose answer has gone, or ends it when its
  // server's sessions were ended meanwhile.
  void start_adopted(Session& s);
  static void on_move_timer(uv_timer_t* t);
  void maybe_finish_stop();
  void close_all();
  bool listen_on(Listener& l, int fd);
  void pause_accepting(Listener& l, int err);
  void close_listener(Listener& l);
  void accept_on(Listener& l);
  // `f` may end the session it is given (which then leaves the list).
  template <class F>
  void each_session(F f);

  void wake();
  static void on_mailbox(uv_poll_t* p, int status, int events);
  static void on_shutdown_timer(uv_timer_t* t);
  static void on_resume_timer(uv_timer_t* t);
  // Every kLiveBytesMs: live sessions' bytes reach the counters (see
  // Session::count_live_bytes).
  static void on_live_bytes_timer(uv_timer_t* t);
  static constexpr std::uint64_t kLiveBytesMs = 5000;
  static void on_listener_handle_closed(uv_handle_t* h);

  unsigned id_;
  uv_async_t* stopped_;
  std::atomic<bool> finished_{false};
  uv_loop_t loop_{};
  int mailbox_fd_ = -1;  // eventfd: written after a post, read before a drain
  uv_poll_t mailbox_poll_{};  // keeps the loop alive until close_all()
  uv_timer_t shutdown_timer_{};
  uv_timer_t live_bytes_timer_{};
  uv_timer_t move_timer_{};  // binary upgrade: paces the moves
  std::optional<Reactor> reactor_;  // made once loop_ is initialised
  LoopWatcher loop_watcher_;
  std::uint64_t iteration_ = 0;  // rounds of the worker's loop so far
  std::vector<Session*> retired_;  // finished this round; deleted after it
  // Listeners whose last handle closed this round; deleted after it (an
  // event of the round may still name one).
  std::vector<std::unique_ptr<Listener>> retired_listeners_;
  std::mutex mu_;
  std::deque<WorkerCommand> mailbox_;  // under mu_
  std::vector<std::function<void()>> calls_;  // under mu_: run_on_loop's
  // Under mu_: set (on the worker's thread) once the loop ends; from then
  // on post() drops what it is given.
  bool mailbox_closed_ = false;
  std::shared_ptr<const Snapshot> snapshot_;
  std::vector<std::unique_ptr<Listener>> listeners_;
  BufferPool pool_;
  std::optional<TimerQueue> timers_;  // made once loop_ is initialised
  std::thread thread_;
  Session* sessions_ = nullptr;
  std::size_t session_count_ = 0;
  std::uint64_t rng_ = 0x9E3779B97F4A7C15ULL;
  bool stopping_ = false;
  bool closed_ = false;
  // Binary upgrade (the old process): the hand-over began; the loop runs on
  // without sessions until the control loop's stop (or recall).
  bool holding_ = false;
  std::shared_ptr<upgrade::Channel> channel_;  // where sessions go; null: nowhere (now)
  std::uint64_t move_seq_ = 0;
  std::unordered_map<std::uint64_t, Session*> moving_;  // by seq: sent, no word yet
  std::uint64_t full_since_ms_ = 0;  // the channel has had no room since (0: it has)
  bool move_waited_ = false;         // said so for this wait
  // Binary upgrade (the new process): answers the channel had no room for
  // yet. `session` (adopted; null when declined) waits, untouched, until
  // its answer has gone: the old process lets go of it only then.
  struct PendingAnswer {
    Session* session = nullptr;
    std::shared_ptr<upgrade::Channel> channel;
    upgrade::Message message;
    std::uint64_t worker = 0;  // the old process's worker and seq, should it be declined after all
    std::uint64_t seq = 0;
  };
  std::deque<PendingAnswer> answers_;
  uv_timer_t answer_timer_{};  // retries answers_ while the channel is full
  std::atomic<bool> handed_over_{false};
  std::atomic<std::size_t> live_sessions_{0};
};

}  // namespace sluice
