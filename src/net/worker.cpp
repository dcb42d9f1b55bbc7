#include "net/worker.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include <spdlog/spdlog.h>

#include "net/close_spread.hpp"
#include "proxy/session.hpp"
#include "proxy/socket_options.hpp"
#include "runtime/snapshot.hpp"
#include "sluice/time.hpp"
#include "sluice/uv_handle.hpp"
#include "upgrade/channel.hpp"
#include "upgrade/session_record.hpp"

namespace sluice {

namespace {

constexpr unsigned kFirstBackoffMs = 100;
// accept4() calls per wakeup at most (a burst, aborted connections included),
// so that one busy listener cannot starve the sessions of this worker.
constexpr int kAcceptBatch = 64;
constexpr unsigned kMaxBackoffMs = 500;
// Binary upgrade: how often the worker looks for quiet sessions to move
// (and tries again to send what found no room on the channel), and how
// many it moves per look. A send never waits for room: a slow new process
// delays the hand-over, never this loop's sessions, and never makes this
// process give a session up (upgrade_finish_timeout bounds the wait).
constexpr std::uint64_t kMoveEveryMs = 5;
constexpr int kMovesPerTurn = 256;
// A channel full for this long is worth a line in the log.
constexpr std::uint64_t kSlowTakerMs = 1000;

}  // namespace

// One listening socket of this worker, in the worker's Reactor
// (level-triggered). The worker accepts on it itself rather than through
// uv_listen: libuv's
// answer to EMFILE is to close a reserve descriptor and accept-and-drop every
// queued connection, which several loops in one process (one fd table) turn
// into a busy loop, and which throws away clients that could have waited.
// Here, out of descriptors, the worker stops polling the socket for a short
// back-off (as nginx does) and the kernel keeps the queue. accept4 also
// yields the peer address, so no getpeername is needed later.
struct Worker::Listener final : IoWatcher {
  Worker* worker = nullptr;
  std::uint64_t id = 0;
  long view = -1;         // index into worker->snapshot_->listeners, -1 = none
  int fd = -1;            // the listening socket (ours)
  bool watched = false;   // in the Reactor's set
  uv_timer_t resume{};
  bool paused = false;
  bool single = false;    // the last batch found one connection: take one, don't ask again
  std::uint64_t woke_at = 0;  // loop iteration of the last wakeup
  bool episode = false;   // an EMFILE/ENFILE episode is being reported
  unsigned backoff_ms = kFirstBackoffMs;
  std::uint64_t episode_start_ms = 0;
  std::uint64_t failed_accepts = 0;
  bool removing = false;
  int open_handles = 0;   // the resume timer, until its close callback

  void on_io(std::uint32_t /*events*/) override { worker->accept_on(*this); }

  const char* name() const {
    const auto& snap = worker->snapshot_;
    return view >= 0 && snap ? snap->listeners[static_cast<std::size_t>(view)].config->name.c_str() : "?";
  }
};

template <class F>
void Worker::each_session(F f) {
  for (Session* s = sessions_; s != nullptr;) {
    Session* next = s->next;
    f(*s);
    s = next;
  }
}

Worker::Worker(unsigned id, uv_async_t* stopped) : id_(id), stopped_(stopped) {
  uv_loop_init(&loop_);
  // Everything is set up here, before the thread exists; the thread only runs
  // the loop. post() may be called as soon as the constructor returns.
  mailbox_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (mailbox_fd_ < 0) {
    const int err = errno;
    uv_loop_close(&loop_);
    throw std::runtime_error(std::string("worker: cannot create its mailbox: ") + std::strerror(err));
  }
  uv_poll_init(&loop_, &mailbox_poll_, mailbox_fd_);
  mailbox_poll_.data = this;
  uv_poll_start(&mailbox_poll_, UV_READABLE, on_mailbox);
  uv_timer_init(&loop_, &shutdown_timer_);
  shutdown_timer_.data = this;
  uv_timer_init(&loop_, &live_bytes_timer_);
  live_bytes_timer_.data = this;
  uv_timer_start(&live_bytes_timer_, on_live_bytes_timer, kLiveBytesMs, kLiveBytesMs);
  uv_timer_init(&loop_, &move_timer_);
  move_timer_.data = this;
  uv_timer_init(&loop_, &answer_timer_);
  answer_timer_.data = this;
  timers_.emplace(&loop_, &Session::fire_timer);
  reactor_.emplace(&loop_);
  loop_watcher_.loop = &loop_;
  if (int r = reactor_->add(uv_backend_fd(&loop_), EPOLLIN, &loop_watcher_); r < 0) {
    // Without it the mailbox would be heard only when a socket wakes the
    // worker: nothing could work.
    throw std::runtime_error(std::string("worker: cannot watch the loop's descriptor: ") + uv_strerror(r));
  }
}

Worker::~Worker() {
  join();
  if (mailbox_fd_ >= 0) ::close(mailbox_fd_);
}

void Worker::start() {
  thread_ = std::thread([this] { run(); });
}

void Worker::join() {
  if (thread_.joinable()) thread_.join();
}

void Worker::post(WorkerCommand command) {
  {
    std::lock_guard lock(mu_);
    if (mailbox_closed_) {
      // The loop has ended (or is ending) after a stop: there is nothing
      // left to update or close. Sockets handed over must not leak.
      for (auto& [id, fd] : command.open) ::close(fd);
      return;
    }
    mailbox_.push_back(std::move(command));
  }
  wake();
}

// After the lock is released: the write may wake the worker on this very
// core, and it must then find nothing held by the thread it preempted. The
// descriptor lives as long as the Worker, so a write after the loop ended
// is harmless; a counter that cannot grow (EAGAIN) is already readable.
void Worker::wake() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(mailbox_fd_, &one, sizeof one);
}

void Worker::on_mailbox(uv_poll_t* p, int /*status*/, int /*events*/) {
  auto* w = static_cast<Worker*>(p->data);
  std::uint64_t count = 0;
  [[maybe_unused]] const ssize_t n = ::read(w->mailbox_fd_, &count, sizeof count);
  w->drain_mailbox();
}

// Each round: wait in the Reactor for the sockets and libuv's descriptor,
// handle what came in order (libuv's descriptor by a non-blocking turn of
// libuv's loop), give libuv a turn too if a timer is due, then delete what
// finished. libuv's next timer bounds the wait. Ends once every handle is
// closed after a stop.
void Worker::run() {
  while (!closed_ || uv_loop_alive(&loop_)) {
    ++iteration_;
    reactor_->run_once(uv_backend_timeout(&loop_));
    // Timers due, or close callbacks pending (libuv's descriptor says
    // nothing of either).
    if (uv_backend_timeout(&loop_) == 0) uv_run(&loop_, UV_RUN_NOWAIT);
    for (Session* s : retired_) Session::dispose(s);
    retired_.clear();
    retired_listeners_.clear();
  }
  // Every handle has been closed by now; a non-zero result would mean a leak.
  if (int r = uv_loop_close(&loop_); r != 0) {
    spdlog::error("worker {}: loop closed with live handles: {}", id_, uv_strerror(r));
  }
  SPDLOG_DEBUG("worker {}: stopped", id_);
  finished_.store(true, std::memory_order_release);
  if (stopped_ != nullptr) uv_async_send(stopped_);
}

void Worker::run_on_loop(std::function<void()> f) {
  {
    std::lock_guard lock(mu_);
    if (mailbox_closed_) return;
    calls_.push_back(std::move(f));
  }
  wake();
}

void Worker::drain_mailbox() {
  std::deque<WorkerCommand> batch;
  std::vector<std::function<void()>> calls;
  {
    std::lock_guard lock(mu_);
    batch.swap(mailbox_);
    calls.swap(calls_);
  }
  if (!closed_) {
    for (auto& f : calls) f();
  }
  for (WorkerCommand& c : batch) {
    if (closed_) {
      // The loop is ending; sockets handed over must not leak.
      for (auto& [id, fd] : c.open) ::close(fd);
      continue;
    }
    switch (c.kind) {
      case WorkerCommand::Kind::update: apply_update(c); break;
      case WorkerCommand::Kind::close_sessions: close_sessions(c); break;
      case WorkerCommand::Kind::stop: begin_stop(); break;
      case WorkerCommand::Kind::hand_over: begin_hand_over(std::move(c.channel)); break;
      case WorkerCommand::Kind::adopt: adopt(c); break;
      case WorkerCommand::Kind::answer: answer(c); break;
      case WorkerCommand::Kind::recall: recall(c); break;
      case WorkerCommand::Kind::close_rest: close_rest(c); break;
      case WorkerCommand::Kind::stop_now:
        begin_stop();
        each_session([](Session& s) { s.terminate(Cause::shutdown); });
        break;
    }
  }
}

// ---- listeners -------------------------------------------------------------

bool Worker::listen_on(Listener& l, int fd) {
  l.fd = fd;
  if (int r = reactor_->add(fd, EPOLLIN, &l); r < 0) {
    spdlog::error("worker {}: listener \"{}\": {}", id_, l.name(), uv_strerror(r));
    return false;
  }
  l.watched = true;
  return true;
}

void Worker::apply_update(WorkerCommand& c) {
  if (stopping_) {
    for (auto& [id, fd] : c.open) ::close(fd);
    return;
  }
  snapshot_ = std::move(c.snapshot);
  reactor_->set_timing(snapshot_->config->global.log_phases);
  for (std::uint64_t id : c.close) {
    for (auto& l : listeners_) {
      if (l->id == id && !l->removing) close_listener(*l);
    }
  }
  for (auto& [id, fd] : c.open) {
    auto l = std::make_unique<Listener>();
    l->worker = this;
    l->id = id;
    uv_timer_init(&loop_, &l->resume);
    l->resume.data = l.get();
    ++l->open_handles;
    listeners_.push_back(std::move(l));
    Listener& ref = *listeners_.back();
    for (const auto& [nid, name] : c.names) {
      if (nid == id) ref.view = snapshot_->find_listener(name);
    }
    listen_on(ref, fd);
  }
  for (auto& l : listeners_) {
    l->view = -1;
    for (const auto& [nid, name] : c.names) {
      if (nid == l->id) l->view = snapshot_->find_listener(name);
    }
    // A kept socket takes the listener's new options (accepted sockets inherit
    // them) and backlog.
    if (l->view >= 0 && l->fd >= 0) {
      const ListenerConfig& lc = *snapshot_->listeners[static_cast<std::size_t>(l->view)].config;
      set_keepalive(l->fd, lc);
      ::listen(l->fd, static_cast<int>(lc.backlog));
    }
  }
}

void Worker::on_listener_handle_closed(uv_handle_t* h) {
  auto* l = static_cast<Listener*>(h->data);
  if (--l->open_handles > 0) return;
  Worker* w = l->worker;
  for (auto& x : w->listeners_) {
    if (x.get() == l) w->retired_listeners_.push_back(std::move(x));
  }
  std::erase_if(w->listeners_, [](const std::unique_ptr<Listener>& x) { return !x; });
  w->maybe_finish_stop();
}

void Worker::close_listener(Listener& l) {
  l.removing = true;
  if (l.fd >= 0) {
    // Out of the set first: after a binary upgrade (or while the control
    // loop holds a duplicate) the socket outlives this descriptor, and
    // close(2) alone would leave it in the set, pointing at a freed Listener.
    if (l.watched) reactor_->remove(l.fd);
    ::close(l.fd);
    l.fd = -1;
    l.watched = false;
  }
  if (!uv_is_closing(as_handle(&l.resume))) uv_close(as_handle(&l.resume), on_listener_handle_closed);
}

void Worker::accept_on(Listener& listener) {
  Listener* l = &listener;
  Worker* w = this;
  if (l->fd < 0 || l->removing) return;
  if (l->view < 0 || !w->snapshot_) {
    // No listener of the current configuration uses this socket (cannot
    // happen while the control loop keeps ids and names in step).
    spdlog::error("worker {}: listening socket {} has no listener in configuration {}", w->id_, l->id,
                  w->snapshot_ ? w->snapshot_->generation : 0);
    if (l->watched) reactor_->remove(l->fd);
    l->watched = false;
    return;
  }
  // A batch ends with an accept4() that says EAGAIN: one wasted call per
  // connection when connections come one at a time. So after a batch that
  // found a single connection, a wakeup takes one and stops (nginx's default,
  // multi_accept off). The socket is level-triggered: if it was not empty it
  // wakes us again on the very next loop iteration, which means a queue is
  // building, and that wakeup takes a batch again. Taking one per wakeup
  // under load would cap accepts at one per iteration (measured: a fifth
  // fewer connections per second when servers close first).
  const bool again = w->iteration_ == l->woke_at + 1;
  l->woke_at = w->iteration_;
  const int limit = l->single && !again ? 1 : kAcceptBatch;
  int accepted = 0;
  for (int i = 0; i < kAcceptBatch && accepted < limit && !l->paused && !l->removing; ++i) {
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    const int fd = ::accept4(l->fd, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        l->single = accepted <= 1;
        return;
      }
      if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        w->pause_accepting(*l, -err);
        return;
      }
      spdlog::warn("worker {}: listener \"{}\": accept error: {}", w->id_, l->name(), std::strerror(err));
      return;
    }
    Session::accept(*w, w->snapshot_, w->snapshot_->listeners[static_cast<std::size_t>(l->view)], fd,
                    reinterpret_cast<const sockaddr*>(&peer));
    if (l->episode) {
      l->episode = false;
      l->backoff_ms = kFirstBackoffMs;
      // The episode's one line was its start; the end is for debugging.
      spdlog::debug("worker {}: listener \"{}\": accepting again after {} ms ({} accept(s) failed for lack of "
                   "descriptors or memory)",
                   w->id_, l->name(), uv_now(&w->loop_) - l->episode_start_ms, l->failed_accepts);
      l->failed_accepts = 0;
    }
    ++accepted;
  }
  if (accepted == kAcceptBatch) l->single = false;
}

// Out of descriptors (or kernel memory): stop polling this socket on this
// worker for a short back-off, then try again; the kernel keeps queued
// connections meanwhile. One log line per episode.
void Worker::pause_accepting(Listener& l, int err) {
  ++l.failed_accepts;
  if (l.paused || l.removing || stopping_) return;
  l.paused = true;
  snapshot_->registry->counters().accept_pauses.fetch_add(1, std::memory_order_relaxed);
  if (!l.episode) {
    l.episode = true;
    l.episode_start_ms = uv_now(&loop_);
    spdlog::warn("worker {}: listener \"{}\": cannot accept: {}; pausing accepts on this worker for {} ms and "
                 "retrying until descriptors are free",
                 id_, l.name(), uv_strerror(err), l.backoff_ms);
  }
  if (l.watched) reactor_->remove(l.fd);
  l.watched = false;
  uv_timer_start(&l.resume, on_resume_timer, l.backoff_ms, 0);
  l.backoff_ms = std::min(l.backoff_ms * 2, kMaxBackoffMs);
}

void Worker::on_resume_timer(uv_timer_t* t) {
  auto* l = static_cast<Listener*>(t->data);
  Worker* w = l->worker;
  if (l->removing || w->stopping_ || !l->paused) return;
  l->paused = false;
  if (l->fd >= 0 && w->reactor_->add(l->fd, EPOLLIN, l) == 0) l->watched = true;
}

// ---- sessions --------------------------------------------------------------

void Worker::link(Session& s) {
  s.next = sessions_;
  if (sessions_) sessions_->prev = &s;
  sessions_ = &s;
  ++session_count_;
  live_sessions_.store(session_count_, std::memory_order_release);
}

void Worker::unlink(Session& s) {
  if (s.prev) s.prev->next = s.next;
  if (s.next) s.next->prev = s.prev;
  if (sessions_ == &s) sessions_ = s.next;
  s.prev = s.next = nullptr;
  --session_count_;
  live_sessions_.store(session_count_, std::memory_order_release);
  // Adopted, and closed here before its answer went (a stop): the old
  // process is told it was not taken, and carries on with it.
  for (PendingAnswer& a : answers_) {
    if (a.session != &s) continue;
    a.session = nullptr;
    a.message = upgrade::session_answer(upgrade::Kind::declined, a.worker, a.seq, "closed before it ran here");
  }
  maybe_finish_stop();
}

void Worker::close_sessions(const WorkerCommand& c) { close_spread(c.server.get(), c.cause, c.spread); }

std::size_t Worker::close_spread(const ServerState* only, Cause cause, Duration window) {
  // An adopted session whose answer has not gone yet is left alone when one
  // server's sessions end: closed now, it would go back to the old process,
  // which carries on with it. It reads its server's mark once it starts.
  std::vector<const Session*> unanswered;
  if (only != nullptr) {
    for (const PendingAnswer& a : answers_) {
      if (a.session != nullptr) unanswered.push_back(a.session);
    }
    std::sort(unanswered.begin(), unanswered.end());
  }
  auto wanted = [only, &unanswered](const Session& s) {
    return !s.closing() && (only == nullptr || s.server() == only) &&
           !std::binary_search(unanswered.begin(), unanswered.end(), &s);
  };
  const auto ms = static_cast<std::uint64_t>(std::max<Duration::rep>(window.count(), 0));
  if (ms == 0) {
    std::size_t n = 0;
    each_session([&](Session& s) {
      if (!wanted(s)) return;
      s.terminate(cause);
      ++n;
    });
    return n;
  }
  std::size_t n = 0;
  each_session([&](Session& s) { n += wanted(s) ? 1 : 0; });
  // Each worker its own seed: their closes interleave rather than fall on
  // one grid.
  rng_ += 0x9E3779B97F4A7C15ULL + id_;
  CloseSpread when(n, ms, rng_);
  const std::uint64_t now = uv_now(&loop_);
  each_session([&](Session& s) {
    if (wanted(s)) s.close_at(now + when.next(), cause);
  });
  return n;
}

// ---- stopping --------------------------------------------------------------

void Worker::begin_stop() {
  // During a hand-over this is either its end (nothing left here) or a
  // stop asked for meanwhile: sessions still move while they may, and the
  // rest get shutdown_timeout.
  if (stopping_ && !holding_) return;
  holding_ = false;
  stopping_ = true;
  for (auto& l : listeners_) {
    if (!l->removing) close_listener(*l);
  }
  if (session_count_ > 0) {
    spdlog::info("worker {}: stopped accepting; waiting for {} session(s)", id_, session_count_);
    const auto ms = snapshot_ ? static_cast<std::uint64_t>(snapshot_->config->global.shutdown_timeout.count()) : 0;
    uv_timer_start(&shutdown_timer_, on_shutdown_timer, ms, 0);
  }
  maybe_finish_stop();
}

void Worker::begin_hand_over(std::shared_ptr<upgrade::Channel> channel) {
  if (stopping_) return;
  stopping_ = true;
  move_waited_ = false;
  full_since_ms_ = 0;
  holding_ = true;
  channel_ = std::move(channel);
  for (auto& l : listeners_) {
    if (!l->removing) close_listener(*l);
  }
  handed_over_.store(true, std::memory_order_release);
  if (session_count_ > 0) spdlog::info("worker {}: stopped accepting; handing {} session(s) over", id_, session_count_);
  if (channel_) uv_timer_start(&move_timer_, on_move_timer, 0, kMoveEveryMs);
}

void Worker::on_move_timer(uv_timer_t* t) { static_cast<Worker*>(t->data)->move_sessions(); }

// Each session at its first quiet moment; one still prereading or
// connecting finishes that step here first, one half closed ends here
// (within its fin_timeout). A session sent waits, untouched, for the new
// process's word (answer()).
void Worker::move_sessions() {
  int moved = 0;
  bool full = false;
  each_session([&](Session& s) {
    if (!channel_ || full || moved >= kMovesPerTurn || !s.movable()) return;
    upgrade::Message m;
    const std::uint64_t seq = move_seq_ + 1;
    if (!s.hand_over_message(m, id_, seq)) return;  // no memory file for its pending bytes now: a later turn
    std::string err;
    const upgrade::SendStatus st = upgrade::try_send(channel_->fd(), m, err);
    if (m.fds.size() > 2) ::close(m.fds[2]);  // the pending bytes' file: the new process has its own copy
    if (st == upgrade::SendStatus::full) {
      // The new process has not read what went before: this session and
      // the rest go on a later turn (nothing of this message was sent).
      // The channel holds fewer messages than a turn sends, so a short
      // wait is usual; one that lasts is said once per wait.
      full = true;
      const std::uint64_t now = uv_now(&loop_);
      if (full_since_ms_ == 0) full_since_ms_ = now;
      if (!move_waited_ && now - full_since_ms_ >= kSlowTakerMs) {
        move_waited_ = true;
        spdlog::info("worker {}: the new process has taken no session for {} ms ({} on their way); the others wait "
                     "for room",
                     id_, now - full_since_ms_, moving_.size());
      }
      return;
    }
    full_since_ms_ = 0;
    move_waited_ = false;
    if (st == upgrade::SendStatus::error) {
      // The new process is gone: what has not gone stays here (the control
      // loop decides what happens to it).
      spdlog::warn("worker {}: cannot hand sessions over ({}); the {} left stay here for now", id_, err,
                   session_count_ - moving_.size());
      channel_.reset();
      uv_timer_stop(&move_timer_);
      return;
    }
    move_seq_ = seq;
    s.begin_move();
    moving_.emplace(seq, &s);
    ++moved;
  });
}

void Worker::answer(const WorkerCommand& c) {
  auto it = moving_.find(c.seq);
  if (it == moving_.end()) return;  // left to the new process already (close_rest)
  Session* s = it->second;
  moving_.erase(it);
  if (c.adopted) {
    s->moved();
  } else {
    s->stay(true);
  }
}

void Worker::recall(WorkerCommand& c) {
  channel_.reset();
  uv_timer_stop(&move_timer_);
  // Stay calls back into the session list only to end sessions, which
  // leave moving_ untouched.
  if (!moving_.empty()) {
    spdlog::info("worker {}: the {} session(s) on their way to the new process stay here", id_, moving_.size());
  }
  for (auto& [seq, s] : moving_) s->stay(false);
  moving_.clear();
  // This hand-over is over: a later one may offer every session again.
  each_session([](Session& s) { s.may_move_again(); });
  if (!c.snapshot) {
    for (auto& [id, fd] : c.open) ::close(fd);
    maybe_finish_stop();
    return;
  }
  // Serving again: as before the hand-over.
  holding_ = false;
  stopping_ = false;
  handed_over_.store(false, std::memory_order_release);
  apply_update(c);
  if (session_count_ > 0) spdlog::info("worker {}: accepting again; {} session(s) here", id_, session_count_);
}

void Worker::close_rest(const WorkerCommand& c) {
  channel_.reset();
  uv_timer_stop(&move_timer_);
  // Those on their way: the new process holds their sockets; these copies
  // go without a word to either peer.
  for (auto& [seq, s] : moving_) s->moved();
  moving_.clear();
  close_spread(nullptr, c.cause, c.spread);
}

void Worker::adopt(WorkerCommand& c) {
  upgrade::Message m;
  m.kind = upgrade::Kind::session;
  m.fields = std::move(c.record);
  for (auto& [unused, fd] : c.open) m.fds.push_back(fd);
  c.open.clear();
  upgrade::SessionRecord r;
  const bool whole = upgrade::SessionRecord::from_message(m, r);
  const long view = whole && snapshot_ ? snapshot_->find_listener(r.listener) : -1;
  std::string why;
  Session* s = nullptr;
  if (!whole) {
    why = "not a whole session record";
  } else if (stopping_) {
    why = "this process is stopping";
  } else if (view < 0) {
    why = "no listener \"" + r.listener + "\" in this configuration";
  } else {
    s = Session::adopt(*this, snapshot_, snapshot_->listeners[static_cast<std::size_t>(view)], m.fds[0], m.fds[1],
                       m.fds.size() > 2 ? m.fds[2] : -1, r);
    if (s == nullptr) why = "its sockets cannot be registered or its pending bytes read here";
  }
  if (m.fds.size() > 2) {
    ::close(m.fds[2]);  // the pending bytes are read (or the session is not taken)
    m.fds.pop_back();
  }
  if (s == nullptr) {
    // These are copies: the old process carries on with the session.
    m.close_fds();
    spdlog::warn("worker {}: a session handed over is declined ({}); it stays with the old process", id_, why);
    if (whole && c.channel) {
      answers_.push_back({nullptr, c.channel, upgrade::session_answer(upgrade::Kind::declined, r.worker, r.seq, why),
                          r.worker, r.seq});
      flush_answers();
    }
    return;
  }
  if (!c.channel) {
    start_adopted(*s);
    return;
  }
  // Counted and registered here, untouched yet: once the answer has gone
  // the old process may let go, and the session runs here.
  upgrade::before_adopted_answer();
  answers_.push_back({s, c.channel, upgrade::session_answer(upgrade::Kind::adopted, r.worker, r.seq), r.worker, r.seq});
  flush_answers();
}

void Worker::flush_answers() {
  while (!answers_.empty()) {
    PendingAnswer& a = answers_.front();
    std::string err;
    const upgrade::SendStatus st = upgrade::try_send(a.channel->fd(), a.message, err);
    if (st == upgrade::SendStatus::full) {
      // The old process has not read the answers before: again shortly.
      if (!uv_is_active(as_handle(&answer_timer_))) uv_timer_start(&answer_timer_, on_answer_timer, kMoveEveryMs, 0);
      return;
    }
    if (st == upgrade::SendStatus::error) {
      // The old process has gone (the usual reason): nobody else has it.
      SPDLOG_DEBUG("worker {}: the old process did not hear that a session was adopted: {}", id_, err);
    }
    Session* s = a.session;
    answers_.pop_front();
    if (s != nullptr) start_adopted(*s);
  }
}

void Worker::start_adopted(Session& s) {
  // Its server's sessions were ended while it was on its way (a check saw
  // the server go down, lose its role or be fenced): it ends as those did,
  // before it carries one more byte.
  if (const ServerState* server = s.server(); server != nullptr) {
    if (const Cause cause = server->ended_since(s.start_ms()); cause != Cause::none) {
      s.terminate(cause);
      return;
    }
  }
  s.run_adopted();
}

void Worker::on_answer_timer(uv_timer_t* t) { static_cast<Worker*>(t->data)->flush_answers(); }

void Worker::on_shutdown_timer(uv_timer_t* t) {
  auto* w = static_cast<Worker*>(t->data);
  const Duration spread = w->snapshot_ ? w->snapshot_->config->global.close_spread : Duration{0};
  if (spread.count() > 0) {
    spdlog::info("worker {}: shutdown_timeout reached; closing {} session(s) one by one over close_spread {}", w->id_,
                 w->session_count_, format_duration(spread));
  } else {
    spdlog::info("worker {}: shutdown_timeout reached; closing {} session(s)", w->id_, w->session_count_);
  }
  w->close_spread(nullptr, Cause::shutdown, spread);
}

void Worker::on_live_bytes_timer(uv_timer_t* t) {
  static_cast<Worker*>(t->data)->each_session([](Session& s) { s.count_live_bytes(); });
}

void Worker::maybe_finish_stop() {
  if (stopping_ && !holding_ && session_count_ == 0 && listeners_.empty()) close_all();
}

void Worker::close_all() {
  if (closed_) return;
  closed_ = true;
  std::deque<WorkerCommand> left;
  {
    std::lock_guard lock(mu_);
    mailbox_closed_ = true;
    left.swap(mailbox_);
  }
  // Posted after the last drain: nothing to do but not to leak their sockets.
  for (WorkerCommand& c : left) {
    for (auto& [id, fd] : c.open) ::close(fd);
  }
  uv_close(as_handle(&mailbox_poll_), nullptr);
  uv_close(as_handle(&shutdown_timer_), nullptr);
  uv_close(as_handle(&live_bytes_timer_), nullptr);
  uv_close(as_handle(&move_timer_), nullptr);
  uv_close(as_handle(&answer_timer_), nullptr);
  answers_.clear();
  channel_.reset();
  timers_->close();
}

}  // namespace sluice
