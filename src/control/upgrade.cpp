// A binary upgrade, both ends (docs/decisions.md has the design; the states
// are upgrade_state.hpp's):
//
//   old (serving)                          new (started by the old)
//   SIGUSR2 / POST /upgrade   [starting]
//   spawn <exe> <args>, fd 3 = channel ->  parses its configuration
//                                       <- hello (format version, PID)
//   listener x N, service, server x N,     (or "failed": why it cannot start)
//   client x N, counts, admin, go       ->  opens nothing it was given
//                                       <- ready                        [receiving]
//   [handing_over] stops accepting;
//   counts, then released once no      ->  starts its workers: accepting;
//   worker accepts                          pid_file, MAINPID=
//   session (id) x N                    ->  counts and registers it, then
//                                       <- adopted (id)  (or declined)
//   closes its copies; counts every
//   few ms, in both directions          <-> counts
//   exits once it holds none               sees the channel close   [took_over]
//
// Until "ready" the old process still accepts on the very same sockets: a
// new binary that fails (exits, hangs past upgrade_timeout, refuses the
// format) leaves nothing behind and the old one serves on. Afterwards, a
// session's descriptors close here only once the new process has said it
// has the session; should it die first, what it has not acknowledged stays
// here, and this process accepts again. After upgrade_finish_timeout what
// never could move is closed (cause upgrade) and this process exits.
#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>

#include <spdlog/spdlog.h>

#include "control/control.hpp"
#include "net/listener.hpp"
#include "net/worker.hpp"
#include "proxy/fork_guard.hpp"
#include "sluice/address.hpp"
#include "sluice/peak.hpp"
#include "sluice/time.hpp"
#include "sluice/uv_handle.hpp"
#include "sluice/version.hpp"
#include "upgrade/channel.hpp"
#include "upgrade/session_record.hpp"

extern char** environ;

namespace sluice {

namespace {

// Blocking sends to a process that reads at once: a few seconds mean it is
// stuck.
constexpr int kSendTimeoutMs = 5000;
// The most descriptors one message carries (the kernel's SCM_MAX_FD is 253).
constexpr std::size_t kFdsPerMessage = 200;
// A server message: upstream, identity, active state, admin state, weight
// override and its base, then passive health (down?, fails, window age,
// down period left, time down, in ms), then its fence (kind, by whom, why:
// one writer), then its history from kHistoryField on (times down, time
// down in ms, down now?, for how long in ms, since when its active and
// admin states hold (wall clock ms), the active state's reason, the last
// connect (wall clock ms), the last check: type, result, duration in µs,
// when (wall clock ms), reason, then since when passive health's state
// holds (wall clock ms) and why).
constexpr std::size_t kFenceField = 11;
constexpr std::size_t kHistoryField = 14;
constexpr std::size_t kServerFields = 29;
// A service message: the first process's start (wall clock ms), the
// configuration generation, the digest of the configuration text in force,
// reloads that succeeded and failed, then the last reload: attempted?,
// ok?, when (wall clock ms), origin, message.
constexpr std::size_t kServiceFields = 10;
// A client message: the listener's name, then per client address three
// fields: the address (IPv6 text; IPv4 clients IPv4-mapped), its tokens in
// thousandths, the age of its last refill in ms (an age, not a time: the
// two processes' clocks need not agree).
constexpr std::size_t kClientFields = 3;
// Payload bytes after which a client message is sent: well under the
// channel's 64 KiB per message (an entry takes at most ~100 bytes), so
// 65 536 addresses go in a few hundred datagrams.
constexpr std::size_t kClientBatchBytes = 32 * 1024;
// How often the two processes report their figures to each other while
// both hold sessions, and the old one looks whether its workers have
// stopped accepting or hold no session any more.
constexpr std::uint64_t kReportEveryMs = 20;

// What another process said, for a log line and /status: one line, its
// control bytes escaped.
std::string printable(std::string_view text) {
  std::string out;
  for (unsigned char c : text) {
    if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::optional<Cause> cause_named(std::string_view name) {
  for (std::size_t c = 0; c < kCauseCount; ++c) {
    if (to_string(static_cast<Cause>(c)) == name) return static_cast<Cause>(c);
  }
  return std::nullopt;
}

std::string status_text(int64_t status, int signal) {
  return "status " + std::to_string(status) + (signal != 0 ? " (signal " + std::to_string(signal) + ")" : "");
}

std::uint64_t wall_field(std::int64_t ms) { return ms > 0 ? static_cast<std::uint64_t>(ms) : 0; }

}  // namespace

struct Control::Upgrade {
  Control* control = nullptr;
  std::string origin;
  uv_process_t process{};
  uv_poll_t poll{};
  uv_timer_t timer{};    // upgrade_timeout, until the new process takes over
  uv_timer_t report{};   // kReportEveryMs, during the hand-over
  uv_timer_t finish{};   // upgrade_finish_timeout
  std::shared_ptr<upgrade::Channel> channel;  // our end; workers hold it too while they move sessions
  int pid = 0;
  int handles = 0;       // open libuv handles; deleted when the last closes
  bool process_open = false;
  bool poll_open = false;
  bool timer_open = false;
  bool report_open = false;
  bool finish_open = false;
  bool exited = false;
  bool took_over = false;
  bool released = false;  // the new process was told to accept
  bool done = false;      // over (failed, taken back or finished): nothing it says matters any more
  bool fork_guarded = false;  // fork_guard::begin_fork() is in force for it
  std::string said;       // "level: message": why the new process said it cannot start
  upgrade::Tally sent;    // the figures last reported to the new process
  TimePoint started{};

  int fd() const { return channel ? channel->fd() : -1; }

  // The new process's copies of our descriptors are surely gone once it
  // has said hello (it closes what it inherited before anything else), or
  // has exited, or failed to start.
  void end_fork_guard() {
    if (fork_guarded) {
      fork_guarded = false;
      fork_guard::end_fork();
    }
  }

  static void on_closed(uv_handle_t* h) {
    auto* u = static_cast<Upgrade*>(h->data);
    if (--u->handles > 0) return;
    std::erase(u->control->upgrades_, u);
    delete u;
  }
  void start_timer(uv_timer_t& t, bool& open, uv_timer_cb cb, std::uint64_t ms, std::uint64_t repeat) {
    uv_timer_init(control->loop_, &t);
    t.data = this;
    ++handles;
    open = true;
    uv_timer_start(&t, cb, ms, repeat);
  }
  void close_timer(uv_timer_t& t, bool& open) {
    if (open) {
      open = false;
      uv_close(as_handle(&t), on_closed);
    }
  }
  // Stops reading the channel; our end closes once the workers are done
  // with it too (the new process then sees it closed).
  void close_poll() {
    if (poll_open) {
      poll_open = false;
      uv_close(as_handle(&poll), on_closed);
    }
    channel.reset();
  }
  void close_timers() {
    close_timer(timer, timer_open);
    close_timer(report, report_open);
    close_timer(finish, finish_open);
  }
  void close_process() {
    if (process_open) {
      process_open = false;
      uv_close(as_handle(&process), on_closed);
    }
  }
};

void Control::set_command(std::string exe, std::vector<std::string> args, std::string cwd) {
  exe_ = std::move(exe);
  args_ = std::move(args);
  cwd_ = std::move(cwd);
}

void Control::set_upgrade_channel(int fd) {
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  takeover_ = std::make_shared<upgrade::Channel>(fd);
  predecessor_ = static_cast<int>(::getppid());
}

admin::Outcome Control::upgrade(std::string_view origin) {
  // The old process may have gone a moment ago, its channel closed and
  // not yet read: read it first.
  if (upgrade_state_.state() == UpgradeState::receiving && takeover_poll_open_) on_handed_sessions();
  if (std::string why = upgrade_state_.refusal(); !why.empty()) {
    spdlog::warn("received {}: upgrade refused: {}", origin, why);
    return {false, why};
  }
  if (stopping_ || stop_begun_) {
    spdlog::warn("received {} while stopping: upgrade refused", origin);
    return {false, "sluice is stopping: upgrade refused"};
  }
  spdlog::info("received {}: upgrading: starting {}", origin, exe_);
  upgrade_state_.transition(UpgradeState::starting, "starting " + exe_ + " (" + std::string(origin) + ")");
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    const std::string why = std::string("cannot make the hand-over channel: ") + std::strerror(errno);
    spdlog::error("upgrade failed, this process serves on: {}", why);
    upgrade_state_.transition(UpgradeState::failed, why);
    return {false, why};
  }
  std::vector<std::string> arg_text{exe_};
  arg_text.insert(arg_text.end(), args_.begin(), args_.end());
  std::vector<char*> argv;
  for (std::string& a : arg_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The environment as it is, with the channel's descriptor named.
  std::vector<std::string> env_text;
  const std::string prefix = std::string(upgrade::kFdEnv) + "=";
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, prefix.c_str(), prefix.size()) != 0) env_text.emplace_back(*e);
  }
  env_text.push_back(prefix + "3");
  std::vector<char*> env;
  for (std::string& e : env_text) env.push_back(e.data());
  env.push_back(nullptr);

  uv_stdio_container_t stdio[4];
  for (int i = 0; i < 3; ++i) {
    stdio[i].flags = UV_INHERIT_FD;
    stdio[i].data.fd = i;
  }
  stdio[3].flags = UV_INHERIT_FD;
  stdio[3].data.fd = sv[1];

  auto* u = new Upgrade;
  u->control = this;
  u->origin = std::string(origin);
  u->channel = std::make_shared<upgrade::Channel>(sv[0]);
  u->started = Clock::now();
  upgrades_.push_back(u);
  uv_process_options_t o{};
  o.file = exe_.c_str();
  o.args = argv.data();
  o.env = env.data();
  o.cwd = cwd_.empty() ? nullptr : cwd_.c_str();
  o.stdio_count = 4;
  o.stdio = stdio;
  o.exit_cb = [](uv_process_t* p, int64_t status, int signal) {
    auto* up = static_cast<Upgrade*>(p->data);
    up->exited = true;
    // It may have named itself in pid_file before the upgrade failed.
    if (up->done) up->control->reclaim_pid_file();
    up->end_fork_guard();
    up->close_process();
    // What it said before it went ("failed": why) is still in the channel.
    if (!up->done) up->control->on_upgrade_message(*up);
    if (up->done) return;
    const std::string who = "the new process " + std::to_string(up->pid);
    if (up->took_over) {
      up->control->take_back(*up, who + " exited (" + status_text(status, signal) + ") during the hand-over", true);
      return;
    }
    up->control->upgrade_failed(
        *up, who + " exited with " + status_text(status, signal) + " before taking over" +
                 (up->said.empty() ? std::string("; its own messages say why") : ": " + up->said));
  };
  u->process.data = u;
  // The child holds a copy of every descriptor until its exec closes them:
  // until the new process says hello (or exits), workers closing a socket
  // take it out of their epoll sets first (fork_guard.hpp).
  fork_guard::begin_fork();
  u->fork_guarded = true;
  const int rc = uv_spawn(loop_, &u->process, &o);
  ::close(sv[1]);
  ++u->handles;
  u->process_open = true;
  if (rc != 0) {
    u->exited = true;  // uv_spawn reaped the child that could not exec; upgrade_failed ends the guard
    u->close_process();
    upgrade_failed(*u, "cannot start " + exe_ + ": " + uv_strerror(rc));
    return {false, "cannot start " + exe_ + ": " + uv_strerror(rc)};
  }
  u->pid = u->process.pid;

  uv_poll_init(loop_, &u->poll, u->fd());
  u->poll.data = u;
  ++u->handles;
  u->poll_open = true;
  uv_poll_start(&u->poll, UV_READABLE, [](uv_poll_t* h, int, int) {
    auto* up = static_cast<Upgrade*>(h->data);
    up->control->on_upgrade_message(*up);
  });
  const Duration timeout = snapshot_->config->global.upgrade_timeout;
  u->start_timer(u->timer, u->timer_open, [](uv_timer_t* t) {
    auto* up = static_cast<Upgrade*>(t->data);
    const Duration d = up->control->snapshot_->config->global.upgrade_timeout;
    up->control->upgrade_failed(*up, "the new process " + std::to_string(up->pid) + " did not take over within " +
                                         "upgrade_timeout " + format_duration(d) + "; it is killed" +
                                         (up->said.empty() ? std::string() : " (it said: " + up->said + ")"));
  }, static_cast<std::uint64_t>(timeout.count()), 0);
  upgrade_state_.set_message("new process " + std::to_string(u->pid) + " started by " + std::string(origin));
  spdlog::info("upgrade: new process {} started; waiting up to {} for it to take over", u->pid,
               format_duration(timeout));
  return {true, "upgrade started: new process " + std::to_string(u->pid)};
}

void Control::upgrade_failed(Upgrade& u, const std::string& why) {
  u.end_fork_guard();
  if (u.done) return;
  u.done = true;
  spdlog::error("upgrade failed, this process serves on: {}", why);
  upgrade_state_.transition(UpgradeState::failed, why);
  reclaim_pid_file();
  // Killed, not asked: it may hold copies of the listening sockets, and
  // must not accept from them once this process has decided to go on.
  if (!u.exited && u.process_open) uv_process_kill(&u.process, SIGKILL);
  u.close_poll();
  u.close_timers();
  // The process handle closes in its exit callback (which reaps it).
}

void Control::on_upgrade_message(Upgrade& u) {
  while (u.poll_open && !u.done) {
    upgrade::Message m;
    std::string err;
    const upgrade::RecvStatus st = upgrade::receive(u.fd(), m, err);
    if (st == upgrade::RecvStatus::again) return;
    if (st != upgrade::RecvStatus::ok) {
      const std::string who = "the new process " + std::to_string(u.pid);
      if (u.exited) return;  // its exit status says more (the exit callback goes on)
      if (u.took_over) {
        take_back(u, who + " closed the hand-over channel during the hand-over" +
                         (st == upgrade::RecvStatus::error ? ": " + err : std::string()), true);
        return;
      }
      if (st == upgrade::RecvStatus::closed) {
        // It is exiting, most likely: its exit status says more than the
        // closed channel (the exit callback, or upgrade_timeout, ends it).
        uv_poll_stop(&u.poll);
        return;
      }
      upgrade_failed(u, "hand-over channel: " + err);
      return;
    }
    m.close_fds();  // the new process sends none
    if (m.version != upgrade::kFormatVersion) {
      const std::string why = "the new binary speaks hand-over format " + std::to_string(m.version) +
                              ", this one format " + std::to_string(upgrade::kFormatVersion);
      upgrade::Message refuse;
      refuse.kind = upgrade::Kind::refuse;
      refuse.fields = {why};
      upgrade::send(u.fd(), refuse, kSendTimeoutMs);
      if (u.took_over) {
        spdlog::warn("upgrade: a message from the new process {} in format {} ignored", u.pid, m.version);
        continue;
      }
      upgrade_failed(u, why + ": refused");
      return;
    }
    switch (m.kind) {
      case upgrade::Kind::hello: {
        if (u.took_over) break;
        u.end_fork_guard();
        spdlog::info("upgrade: new process {} ({}) checked its configuration; handing over the listening sockets",
                     u.pid, m.fields.size() > 1 ? printable(m.fields[1]) : std::string("?"));
        if (std::string e = send_handover(u.fd()); !e.empty()) {
          upgrade_failed(u, "cannot hand over the listening sockets: " + e);
          return;
        }
        break;
      }
      case upgrade::Kind::ready:
        if (!u.took_over) on_taken_over(u);
        break;
      case upgrade::Kind::adopted:
      case upgrade::Kind::declined: {
        std::uint64_t worker = 0;
        std::uint64_t seq = 0;
        if (!upgrade::read_session_answer(m, worker, seq) || worker >= workers_.size()) break;
        if (m.kind == upgrade::Kind::declined) {
          spdlog::info("upgrade: the new process declined a session ({}); it stays here",
                       m.fields.size() > 2 ? printable(m.fields[2]) : std::string("no reason given"));
        }
        WorkerCommand c = WorkerCommand::of(WorkerCommand::Kind::answer);
        c.seq = seq;
        c.adopted = m.kind == upgrade::Kind::adopted;
        workers_[worker]->post(std::move(c));
        break;
      }
      case upgrade::Kind::counts: {
        std::vector<upgrade::Figure> figures;
        if (upgrade::read_counts(m, figures)) fold_in(figures);
        break;
      }
      case upgrade::Kind::failed:
        // Logged with the outcome (its exit, or upgrade_timeout).
        u.said = printable(m.fields.empty() ? "error" : m.fields[0]) + ": " +
                 printable(m.fields.size() > 1 ? m.fields[1] : std::string("?"));
        break;
      case upgrade::Kind::stopping:
        if (u.took_over) {
          spdlog::info("upgrade: the new process {} is stopping: this process stops too", u.pid);
          take_back(u, "the new process " + std::to_string(u.pid) + " was told to stop during the hand-over", false);
          begin_stop(false);
          return;
        }
        break;
      default:
        break;
    }
  }
}

std::string Control::send_handover(int fd) {
  std::string send_error;
  for (const auto& s : sockets_) {
    for (std::size_t at = 0; at < s->dups.size() && send_error.empty(); at += kFdsPerMessage) {
      upgrade::Message l;
      l.kind = upgrade::Kind::listener;
      l.fields = {s->key, s->listener, s->bound};
      const std::size_t end = std::min(s->dups.size(), at + kFdsPerMessage);
      l.fds.assign(s->dups.begin() + static_cast<long>(at), s->dups.begin() + static_cast<long>(end));
      send_error = upgrade::send(fd, l, kSendTimeoutMs);
    }
  }
  if (send_error.empty()) send_error = upgrade::send(fd, service_message(), kSendTimeoutMs);
  // Server state, so that the new process neither checks from scratch nor
  // forgets a drain, a weight set through the admin API, a server passive
  // health keeps out, or what the server has been through.
  const TimePoint now = Clock::now();
  for (const auto& server : registry_.servers()) {
    if (!send_error.empty()) break;
    const PassiveHealth::Saved passive = server->save_passive(now);
    const ServerState::History h = server->history(now);
    upgrade::Message sm;
    sm.kind = upgrade::Kind::server;
    sm.fields = {server->upstream,
                 server_identity(server->address),
                 upgrade::field(static_cast<std::uint64_t>(server->active_state())),
                 upgrade::field(static_cast<std::uint64_t>(server->admin())),
                 upgrade::field(server->weight_override()),
                 upgrade::field(server->weight_override_base()),
                 upgrade::field(passive.state == PassiveHealth::State::up ? 0 : 1),
                 upgrade::field(passive.fails),
                 upgrade::field(static_cast<std::uint64_t>(passive.window_age.count())),
                 upgrade::field(static_cast<std::uint64_t>(passive.down_left.count())),
                 upgrade::field(static_cast<std::uint64_t>(passive.down_age.count())),
                 // One writer: a fenced server stays fenced in the new process.
                 upgrade::field(static_cast<std::uint64_t>(server->fence_kind())),
                 server->fenced_by(),
                 server->status(now).fence_reason,
                 upgrade::field(h.down_count),
                 upgrade::field(static_cast<std::uint64_t>(h.downtime.count())),
                 upgrade::field(h.down ? 1 : 0),
                 upgrade::field(static_cast<std::uint64_t>(h.down_for.count())),
                 upgrade::field(wall_field(h.active_since_ms)),
                 upgrade::field(wall_field(h.admin_since_ms)),
                 h.active_reason,
                 upgrade::field(wall_field(server->last_connect_ms.load(std::memory_order_relaxed))),
                 h.last_check.type,
                 upgrade::field(static_cast<std::uint64_t>(h.last_check.result)),
                 upgrade::field(static_cast<std::uint64_t>(h.last_check.seconds * 1e6)),
                 upgrade::field(wall_field(h.last_check.at_ms)),
                 h.last_check.reason,
                 upgrade::field(wall_field(h.passive_since_ms)),
                 h.passive_reason};
    send_error = upgrade::send(fd, sm, kSendTimeoutMs);
  }
  if (send_error.empty()) send_error = send_client_buckets(fd);
  // The counts and totals as they are now; kept current from the
  // hand-over's start (on_handover_tick).
  if (send_error.empty()) {
    upgrade::Tally first;
    send_error = report_figures(fd, true, first, true);
  }
  if (send_error.empty() && admin_http_ && admin_http_->listening_fd() >= 0) {
    upgrade::Message a;
    a.kind = upgrade::Kind::admin;
    a.fields = {admin_http_->bound()};
    a.fds = {admin_http_->listening_fd()};
    send_error = upgrade::send(fd, a, kSendTimeoutMs);
  }
  if (send_error.empty()) {
    upgrade::Message go;
    go.kind = upgrade::Kind::go;
    send_error = upgrade::send(fd, go, kSendTimeoutMs);
  }
  return send_error;
}

void Control::on_taken_over(Upgrade& u) {
  u.took_over = true;
  u.close_timer(u.timer, u.timer_open);
  const auto took = std::chrono::duration_cast<Duration>(Clock::now() - u.started);
  spdlog::info("upgrade: new process {} serves now (took over in {}); this process stops accepting and hands its "
               "sessions over",
               u.pid, format_duration(took));
  upgrade_state_.transition(UpgradeState::handing_over,
                            "new process " + std::to_string(u.pid) + " serves; handing the sessions over");
  mainpid_moved_ = true;
  stopping_ = true;
  update_watch();  // off: the new process watches the file now
  // The listening sockets' duplicates stay until the hand-over is over:
  // should the new process die, this one accepts on them again.
  uv_unref(as_handle(&signal_poll_));
  uv_unref(as_handle(&tick_));
  if (u.poll_open) uv_unref(as_handle(&u.poll));
  if (u.process_open) uv_unref(as_handle(&u.process));
  // The new process answers on the same admin socket; a copy stays here
  // for the same reason.
  if (admin_http_) {
    if (admin_http_->listening_fd() >= 0) admin_dup_ = ::fcntl(admin_http_->listening_fd(), F_DUPFD_CLOEXEC, 3);
    // A request this process accepted from the shared socket is answered
    // here, not reset (the new process never sees it).
    admin_http_->close([] {}, true);
    retired_admin_.push_back(std::move(admin_http_));
  }
  for (auto& w : workers_) {
    WorkerCommand c = WorkerCommand::of(WorkerCommand::Kind::hand_over);
    c.channel = u.channel;
    w->post(std::move(c));
  }
  // The first look soon: the workers stop accepting within a round, and
  // clients wait in the listen queue until the new process accepts.
  u.start_timer(u.report, u.report_open, [](uv_timer_t* t) {
    auto* up = static_cast<Upgrade*>(t->data);
    up->control->on_handover_tick(*up);
  }, 2, kReportEveryMs);
  const Duration finish = snapshot_->config->global.upgrade_finish_timeout;
  u.start_timer(u.finish, u.finish_open, [](uv_timer_t* t) {
    auto* up = static_cast<Upgrade*>(t->data);
    up->control->on_finish_deadline(*up);
  }, static_cast<std::uint64_t>(finish.count()), 0);
}

void Control::on_handover_tick(Upgrade& u) {
  if (u.done) return;
  // Read before the report: a session's figures are counted before it
  // leaves its worker's count, so the report holds whatever ended by then.
  bool stopped = true;
  std::size_t left = 0;
  for (const auto& w : workers_) {
    stopped = stopped && w->handed_over();
    left += w->live_sessions();
  }
  // Never waiting for room: the loop reads the new process's answers, and
  // a full channel only means the new process is behind. A broken channel
  // shows on the poll.
  const bool reported = u.fd() >= 0 && report_figures(u.fd(), true, u.sent, false).empty();
  if (!u.released && stopped && reported) {
    // Every count above was taken with no worker here accepting: from now
    // on this process's counts only go down, and the new process counts
    // them with its own before it accepts anyone. No room: the next tick
    // reports and says it again.
    upgrade::Message r;
    r.kind = upgrade::Kind::released;
    std::string err;
    if (upgrade::try_send(u.fd(), r, err) == upgrade::SendStatus::ok) {
      u.released = true;
      spdlog::info("upgrade: this process no longer accepts; the new process {} does; {} session(s) to hand over",
                   u.pid, left);
    }
  }
  if (!u.released || left > 0) return;
  // The hand-over is over: nothing here any more.
  u.done = true;
  upgrade_state_.transition(UpgradeState::handed_over, "every session moved to process " + std::to_string(u.pid) +
                                                           " or ended here");
  spdlog::info("upgrade: every session moved to process {} or ended here; exiting", u.pid);
  u.close_timers();
  for (auto& s : sockets_) s->close_dups();
  if (admin_dup_ >= 0) {
    ::close(admin_dup_);
    admin_dup_ = -1;
  }
  for (auto& w : workers_) w->post(WorkerCommand::of(WorkerCommand::Kind::stop));
}

void Control::on_finish_deadline(Upgrade& u) {
  if (u.done) return;
  u.close_timer(u.finish, u.finish_open);
  std::size_t left = 0;
  for (const auto& w : workers_) left += w->live_sessions();
  const GlobalConfig& g = snapshot_->config->global;
  // Many sessions may end here at once: one by one over close_spread,
  // when it is set, as at the end of shutdown_timeout.
  const Duration spread = g.close_spread_set ? g.close_spread : Duration{0};
  std::string why = "upgrade_finish_timeout " + format_duration(g.upgrade_finish_timeout) + " passed: closing the " +
                    std::to_string(left) + " session(s) that did not move (cause upgrade)";
  if (spread.count() > 0) why += " one by one over close_spread " + format_duration(spread);
  spdlog::warn("upgrade: {}", why);
  upgrade_state_.transition(UpgradeState::finishing, why);
  for (auto& w : workers_) {
    WorkerCommand c = WorkerCommand::of(WorkerCommand::Kind::close_rest);
    c.cause = Cause::upgrade;
    c.spread = spread;
    w->post(std::move(c));
  }
}

void Control::take_back(Upgrade& u, const std::string& why, bool serve) {
  if (u.done) {
    if (u.took_over) spdlog::info("upgrade: {} (the hand-over was over)", why);
    return;
  }
  u.done = true;
  u.close_poll();
  u.close_timers();
  drop_remote();  // the new process's sessions count no more here
  serve = serve && !stop_begun_;
  const std::string message =
      why + "; the sessions it had not acknowledged stay here" + (serve ? ", and this process accepts again" : "");
  if (serve) {
    spdlog::error("upgrade failed, this process serves on: {}", message);
  } else {
    spdlog::info("upgrade: {}", message);
  }
  upgrade_state_.transition(UpgradeState::failed, message);
  reclaim_pid_file();
  if (serve) {
    serve_again();
    return;
  }
  for (auto& w : workers_) w->post(WorkerCommand::of(WorkerCommand::Kind::recall));
}

void Control::serve_again() {
  stopping_ = false;
  mainpid_moved_ = false;
  uv_ref(as_handle(&signal_poll_));
  uv_ref(as_handle(&tick_));
  std::vector<std::pair<std::uint64_t, std::string>> names;
  for (auto& s : sockets_) names.emplace_back(s->id, s->listener);
  for (std::size_t w = 0; w < workers_.size(); ++w) {
    WorkerCommand c = WorkerCommand::of(WorkerCommand::Kind::recall);
    c.snapshot = snapshot_;
    c.names = names;
    // As apply() gave them out: socket i's copy j to worker j % workers.
    for (auto& s : sockets_) {
      for (std::size_t j = w; j < s->dups.size(); j += workers_.size()) {
        const int fd = ::fcntl(s->dups[j], F_DUPFD_CLOEXEC, 3);
        if (fd >= 0) c.open.emplace_back(s->id, fd);
      }
    }
    workers_[w]->post(std::move(c));
  }
  if (admin_dup_ >= 0) {
    const int fd = admin_dup_;
    admin_dup_ = -1;
    if (std::string err = start_admin_http(fd); !err.empty()) spdlog::error("admin API: {}", err);
  }
  write_pid_file();
  notify_systemd("MAINPID=" + std::to_string(::getpid()) + "\nREADY=1\nSTATUS=running (an upgrade failed), "
                 "configuration generation " + std::to_string(generation_));
}

void Control::upgrade_stop_begun() {
  for (Upgrade* u : std::vector<Upgrade*>(upgrades_)) {
    if (!u->done && !u->took_over) upgrade_failed(*u, "a stop began before the new process took over");
  }
  if (upgrade_state_.state() == UpgradeState::receiving && takeover_) {
    upgrade::Message m;
    m.kind = upgrade::Kind::stopping;
    upgrade::send(takeover_->fd(), m, kSendTimeoutMs);
  }
  start_workers();
}

void Control::close_takeover() {
  if (takeover_poll_open_) {
    takeover_poll_open_ = false;
    uv_close(as_handle(&takeover_poll_), nullptr);
  }
  if (takeover_timer_open_) {
    takeover_timer_open_ = false;
    uv_close(as_handle(&takeover_timer_), nullptr);
  }
  // Workers answering a session still hold it; closed with the last.
  takeover_.reset();
}

void Control::close_upgrade() {
  close_takeover();
  if (admin_dup_ >= 0) {
    ::close(admin_dup_);
    admin_dup_ = -1;
  }
  for (Upgrade* u : std::vector<Upgrade*>(upgrades_)) {
    u->end_fork_guard();
    u->done = true;
    u->close_poll();
    u->close_timers();
    u->close_process();
  }
}

// ---- the new process -------------------------------------------------------

std::string Control::receive_handover() {
  const int fd = takeover_->fd();
  upgrade::Message hello;
  hello.kind = upgrade::Kind::hello;
  hello.fields = {std::to_string(::getpid()), std::string("sluice ") + sluice::version()};
  if (std::string err = upgrade::send(fd, hello, kSendTimeoutMs); !err.empty()) return "cannot greet the serving process: " + err;
  const TimePoint deadline = Clock::now() + initial_->global.upgrade_timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return "the serving process handed nothing over in time";
    upgrade::Message m;
    std::string err;
    const upgrade::RecvStatus st = upgrade::receive_wait(fd, m, err, static_cast<int>(left));
    if (st == upgrade::RecvStatus::again) continue;
    if (st == upgrade::RecvStatus::closed) return "the serving process closed the hand-over channel";
    if (st == upgrade::RecvStatus::error) return "hand-over channel: " + err;
    if (m.version != upgrade::kFormatVersion) {
      m.close_fds();
      return "the serving process speaks hand-over format " + std::to_string(m.version) + ", this binary format " +
             std::to_string(upgrade::kFormatVersion);
    }
    switch (m.kind) {
      case upgrade::Kind::listener:
        if (m.fields.empty()) {
          m.close_fds();
          break;
        }
        for (int f : m.fds) inherited_[m.fields[0]].push_back(f);
        m.fds.clear();
        break;
      case upgrade::Kind::admin:
        if (!m.fds.empty() && inherited_admin_ < 0) {
          inherited_admin_ = m.fds[0];
          m.fds.erase(m.fds.begin());
        }
        m.close_fds();
        break;
      case upgrade::Kind::server:
        m.close_fds();
        if (m.fields.size() == kServerFields) inherited_servers_.push_back(std::move(m.fields));
        break;
      case upgrade::Kind::service:
        m.close_fds();
        if (m.fields.size() != kServiceFields) return "a malformed service message: " + std::to_string(m.fields.size()) + " fields";
        inherited_service_ = std::move(m.fields);
        break;
      case upgrade::Kind::counts:
        m.close_fds();
        if (!upgrade::read_counts(m, inherited_figures_)) return "a malformed counts message";
        break;
      case upgrade::Kind::client:
        m.close_fds();
        if (std::string bad = restore_client_buckets(m.fields); !bad.empty()) return "a malformed client message: " + bad;
        break;
      case upgrade::Kind::go:
        if (buckets_restored_ > 0) {
          spdlog::info("upgrade: the client_rate_limit buckets of {} client address(es) carried over",
                       buckets_restored_);
        }
        return {};
      case upgrade::Kind::refuse:
        return "refused by the serving process: " + (m.fields.empty() ? std::string("?") : printable(m.fields[0]));
      default:
        m.close_fds();
        break;
    }
  }
}

upgrade::Message Control::service_message() const {
  upgrade::Message m;
  m.kind = upgrade::Kind::service;
  m.fields = {upgrade::field(wall_field(service_started_at_ms_)),
              upgrade::field(generation_),
              upgrade::field(config_digest_),
              upgrade::field(reloads_ok_),
              upgrade::field(reloads_failed_),
              upgrade::field(last_reload_.attempted ? 1 : 0),
              upgrade::field(last_reload_.ok ? 1 : 0),
              upgrade::field(wall_field(last_reload_.time_ms)),
              last_reload_.origin,
              last_reload_.message};
  return m;
}

// Before the first apply(): the new process goes on from the service's
// figures. Its configuration is the old one's generation when the file says
// the same as what the old process ran, and the next one when it differs
// (an upgrade applies the file as it is on disk).
void Control::restore_service(const std::vector<std::string>& f) {
  if (f.size() != kServiceFields) return;
  const auto started = static_cast<std::int64_t>(upgrade::number(f[0]));
  if (started > 0) service_started_at_ms_ = started;
  const std::uint64_t generation = upgrade::number(f[1]);
  const bool same_text = upgrade::number(f[2]) == config_digest_ && config_digest_ != 0;
  if (generation > 0) generation_ = same_text ? generation - 1 : generation;
  reloads_ok_ = upgrade::number(f[3]);
  reloads_failed_ = upgrade::number(f[4]);
  last_reload_.attempted = upgrade::number(f[5]) != 0;
  last_reload_.ok = upgrade::number(f[6]) != 0;
  last_reload_.time_ms = static_cast<std::int64_t>(upgrade::number(f[7]));
  last_reload_.origin = f[8];
  last_reload_.message = f[9];
}

void Control::restore_servers() {
  std::size_t restored = 0;
  const TimePoint now = Clock::now();
  for (const auto& st : registry_.servers()) {
    const std::string id = server_identity(st->address);
    for (const auto& f : inherited_servers_) {
      if (f[0] != st->upstream || f[1] != id) continue;
      const auto active = static_cast<ActiveState>(upgrade::number(f[2]));
      const auto admin = static_cast<AdminState>(upgrade::number(f[3]));
      if (active == ActiveState::up || active == ActiveState::down || active == ActiveState::standby) {
        st->set_active(active, "as the previous process had it");
      }
      const auto fence = static_cast<FenceKind>(upgrade::number(f[kFenceField]));
      if (fence == FenceKind::lost || fence == FenceKind::waiting || fence == FenceKind::failover) {
        st->fence(fence, f[kFenceField + 1], f[kFenceField + 2] + " (as the previous process had it)");
        if (fence == FenceKind::failover) {
          expire_failover_fence(st);
          if (sentinels_) {
            const std::string address = format_sockaddr(reinterpret_cast<const sockaddr*>(&st->address.addr));
            sentinels_->resume_failover(st->upstream, address, f[kFenceField + 1]);
          }
        }
      }
      if (admin == AdminState::drain || admin == AdminState::disabled) st->set_admin(admin);
      if (const std::uint64_t w = upgrade::number(f[4]); w != 0) {
        st->set_weight_override(static_cast<std::uint32_t>(w), static_cast<std::uint32_t>(upgrade::number(f[5])));
      }
      PassiveHealth::Saved passive;
      passive.state = upgrade::number(f[6]) == 0 ? PassiveHealth::State::up : PassiveHealth::State::down;
      passive.fails = static_cast<std::uint32_t>(upgrade::number(f[7]));
      passive.window_age = Duration(static_cast<Duration::rep>(upgrade::number(f[8])));
      passive.down_left = Duration(static_cast<Duration::rep>(upgrade::number(f[9])));
      passive.down_age = Duration(static_cast<Duration::rep>(upgrade::number(f[10])));
      st->restore_passive(passive, now);
      ServerState::History h;
      h.down_count = upgrade::number(f[kHistoryField + 0]);
      h.downtime = Duration(static_cast<Duration::rep>(upgrade::number(f[kHistoryField + 1])));
      h.down = upgrade::number(f[kHistoryField + 2]) != 0;
      h.down_for = Duration(static_cast<Duration::rep>(upgrade::number(f[kHistoryField + 3])));
      h.active_since_ms = static_cast<std::int64_t>(upgrade::number(f[kHistoryField + 4]));
      h.admin_since_ms = static_cast<std::int64_t>(upgrade::number(f[kHistoryField + 5]));
      h.active_reason = f[kHistoryField + 6];
      h.last_check.type = f[kHistoryField + 8];
      const std::uint64_t result = upgrade::number(f[kHistoryField + 9]);
      h.last_check.result = result <= static_cast<std::uint64_t>(CheckResult::local_error)
                                ? static_cast<CheckResult>(result)
                                : CheckResult::none;
      h.last_check.seconds = static_cast<double>(upgrade::number(f[kHistoryField + 10])) / 1e6;
      h.last_check.at_ms = static_cast<std::int64_t>(upgrade::number(f[kHistoryField + 11]));
      h.last_check.reason = f[kHistoryField + 12];
      h.passive_since_ms = static_cast<std::int64_t>(upgrade::number(f[kHistoryField + 13]));
      h.passive_reason = f[kHistoryField + 14];
      st->restore_history(h, now);
      if (const std::uint64_t at = upgrade::number(f[kHistoryField + 7]); at != 0) {
        st->last_connect_ms.store(static_cast<std::int64_t>(at), std::memory_order_relaxed);
      }
      ++restored;
      break;
    }
  }
  spdlog::info("upgrade: the state of {} server(s) carried over", restored);
  inherited_servers_.clear();
}
std::string Control::send_client_buckets(int fd) {
  uv_update_time(loop_);
  const std::uint64_t now_ms = uv_now(loop_);  // the workers' clock (uv_now of their loops)
  std::size_t buckets = 0;
  std::size_t messages = 0;
  for (const ListenerView& lv : snapshot_->listeners) {
    const double per_second = lv.config->client_rate_limit.per_second;
    upgrade::Message m;
    m.kind = upgrade::Kind::client;
    std::size_t bytes = 0;
    auto flush = [&] {
      if (m.fields.size() == 1) return std::string();
      buckets += (m.fields.size() - 1) / kClientFields;
      ++messages;
      std::string err = upgrade::send(fd, m, kSendTimeoutMs);
      m.fields.resize(1);
      bytes = 0;
      return err;
    };
    m.fields.push_back(lv.config->name);
    for (const ClientTable::SavedBucket& b : lv.stats->clients.save_buckets(per_second, now_ms)) {
      char text[INET6_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET6, b.addr.data(), text, sizeof text);
      m.fields.emplace_back(text);
      m.fields.push_back(upgrade::field(b.tokens_milli));
      m.fields.push_back(upgrade::field(b.age_ms));
      for (std::size_t i = m.fields.size() - kClientFields; i < m.fields.size(); ++i) bytes += 4 + m.fields[i].size();
      if (bytes >= kClientBatchBytes) {
        if (std::string err = flush(); !err.empty()) return err;
      }
    }
    if (std::string err = flush(); !err.empty()) return err;
  }
  if (buckets > 0) {
    spdlog::info("upgrade: handed over the client_rate_limit buckets of {} client address(es) in {} message(s)",
                 buckets, messages);
  }
  return {};
}

std::string Control::restore_client_buckets(const std::vector<std::string>& fields) {
  if (fields.size() < 1 + kClientFields || (fields.size() - 1) % kClientFields != 0) {
    return std::to_string(fields.size()) + " fields";
  }
  // A listener this configuration does not have (or without a rate limit
  // now): its buckets mean nothing here. The message is still checked whole.
  const ListenerConfig* l = nullptr;
  for (const ListenerConfig& c : initial_->listeners) {
    if (c.name == fields[0] && c.client_rate_limit.per_second > 0) l = &c;
  }
  std::vector<ClientTable::SavedBucket> buckets;
  for (std::size_t i = 1; i < fields.size(); i += kClientFields) {
    ClientTable::SavedBucket b;
    if (fields[i].find('\0') != std::string::npos || ::inet_pton(AF_INET6, fields[i].c_str(), b.addr.data()) != 1 ||
        !upgrade::parse_number(fields[i + 1], b.tokens_milli) || !upgrade::parse_number(fields[i + 2], b.age_ms)) {
      return "entry " + std::to_string((i - 1) / kClientFields + 1) + " is not an address, tokens and age";
    }
    buckets.push_back(b);
  }
  if (l == nullptr) return {};
  // Created here, before the first Snapshot: it finds this one by name.
  ClientTable& table = registry_.listener(l->name)->clients;
  uv_update_time(loop_);
  const std::uint64_t now_ms = uv_now(loop_);
  for (const ClientTable::SavedBucket& b : buckets) {
    if (table.restore_bucket(b, l->client_rate_limit.per_second, now_ms)) ++buckets_restored_;
  }
  return {};
}

bool Control::take_inherited(const ListenerConfig& l, const std::string& key, std::vector<int>& fds,
                             std::string& bound) {
  auto it = inherited_.find(key);
  if (it == inherited_.end()) return false;
  std::vector<int> given = std::move(it->second);
  inherited_.erase(it);
  ListeningSockets ls = adopt_listening_sockets(l, std::move(given), nworkers_);
  fds = std::move(ls.fds);
  bound = std::move(ls.bound);
  return true;
}

void Control::announce_takeover() {
  // An admin socket the configuration no longer has.
  if (inherited_admin_ >= 0) {
    ::close(inherited_admin_);
    inherited_admin_ = -1;
  }
  upgrade_state_.transition(UpgradeState::receiving, "process " + std::to_string(predecessor_) +
                                                         " hands its sessions over; an upgrade waits until it has gone");
  upgrade::Message ready;
  ready.kind = upgrade::Kind::ready;
  if (std::string err = upgrade::send(takeover_->fd(), ready, kSendTimeoutMs); !err.empty()) {
    spdlog::warn("upgrade: cannot tell the old process that this one serves: {}", err);
  }
  spdlog::info("upgrade: this process ({}) serves now; it accepts once process {} has stopped accepting",
               ::getpid(), predecessor_);
  takeover_since_ = Clock::now();
  uv_poll_init(loop_, &takeover_poll_, takeover_->fd());
  takeover_poll_.data = this;
  takeover_poll_open_ = true;
  uv_poll_start(&takeover_poll_, UV_READABLE, [](uv_poll_t* h, int, int) {
    static_cast<Control*>(h->data)->on_handed_sessions();
  });
  uv_timer_init(loop_, &takeover_timer_);
  takeover_timer_.data = this;
  takeover_timer_open_ = true;
  uv_timer_start(&takeover_timer_, [](uv_timer_t* t) {
    auto* c = static_cast<Control*>(t->data);
    if (c->takeover_) c->report_figures(c->takeover_->fd(), false, c->sent_, false);
    // The old process should say "released" within milliseconds; if it
    // does not within upgrade_timeout, clients have waited long enough in
    // the listen queue.
    if (!c->workers_started_ && Clock::now() - c->takeover_since_ > c->snapshot_->config->global.upgrade_timeout) {
      spdlog::warn("upgrade: process {} has not said it stopped accepting within upgrade_timeout; accepting now",
                   c->predecessor_);
      c->start_workers();
    }
  }, kReportEveryMs, kReportEveryMs);
}

void Control::start_workers() {
  if (workers_started_) return;
  workers_started_ = true;
  for (auto& w : workers_) w->start();
  pin_threads();
  // Started by an upgrade: this process names itself once it accepts, which
  // is after the old one stopped answering on the shared admin socket too.
  // Whoever reads pid_file (or MAINPID) from then on reaches this process.
  if (predecessor_ != 0) {
    write_pid_file();
    notify_systemd("MAINPID=" + std::to_string(::getpid()) +
                   "\nREADY=1\nSTATUS=running (upgraded), configuration generation " + std::to_string(generation_));
  }
}

void Control::on_handed_sessions() {
  while (takeover_poll_open_) {
    upgrade::Message m;
    std::string err;
    const upgrade::RecvStatus st = upgrade::receive(takeover_->fd(), m, err);
    if (st == upgrade::RecvStatus::again) return;
    if (st != upgrade::RecvStatus::ok) {
      if (st == upgrade::RecvStatus::error) spdlog::warn("upgrade: hand-over channel: {}", err);
      finish_receiving();
      return;
    }
    if (m.version != upgrade::kFormatVersion) {
      m.close_fds();
      continue;
    }
    switch (m.kind) {
      case upgrade::Kind::session: {
        upgrade::on_session_received();
        if (workers_.empty() || m.fds.size() < 2 || m.fds.size() > 3) {
          m.close_fds();
          break;
        }
        WorkerCommand c = WorkerCommand::of(WorkerCommand::Kind::adopt);
        c.record = std::move(m.fields);
        c.channel = takeover_;
        for (int fd : m.fds) c.open.push_back({0, fd});
        workers_[next_adopter_++ % workers_.size()]->post(std::move(c));
        ++sessions_adopted_;
        break;
      }
      case upgrade::Kind::counts: {
        std::vector<upgrade::Figure> figures;
        if (upgrade::read_counts(m, figures)) fold_in(figures);
        break;
      }
      case upgrade::Kind::released:
        if (!workers_started_) {
          spdlog::info("upgrade: process {} stopped accepting; this one accepts now", predecessor_);
          start_workers();
        }
        break;
      default:
        m.close_fds();
        break;
    }
  }
}

void Control::finish_receiving() {
  close_takeover();
  // The old process has exited (or gave up): every session it handed
  // over is here, and what it still counted has gone with it.
  drop_remote();
  start_workers();
  spdlog::info("upgrade: the old process {} is done; {} session(s) handed over", predecessor_, sessions_adopted_);
  upgrade_state_.transition(UpgradeState::took_over, "took over from process " + std::to_string(predecessor_) +
                                                         " with " + std::to_string(sessions_adopted_) + " session(s)");
}

// ---- figures both ways ------------------------------------------------------

std::vector<upgrade::Figure> Control::own_figures(bool all) const {
  std::vector<upgrade::Figure> out;
  // Ours only: what the other process told us is folded into the same
  // counters and taken out here.
  auto own = [this](upgrade::Figure f, std::uint64_t counted) {
    const std::uint64_t theirs = remote_.last(f);
    f.value = counted > theirs ? counted - theirs : 0;
    return f;
  };
  auto add = [&out](std::string scope, std::string name, std::string sub, std::string counter, std::uint64_t v) {
    out.push_back({std::move(scope), std::move(name), std::move(sub), std::move(counter), v});
  };
  for (const auto& st : registry_.servers()) {
    const std::string id = server_identity(st->address);
    out.push_back(own({"server", st->upstream, id, "active", 0}, st->active.load(std::memory_order_relaxed)));
    if (!all) continue;
    add("server", st->upstream, id, "sessions", st->total_sessions.load(std::memory_order_relaxed));
    add("server", st->upstream, id, "failures", st->total_failures.load(std::memory_order_relaxed));
    add("server", st->upstream, id, "bytes_in", st->bytes_in.load(std::memory_order_relaxed));
    add("server", st->upstream, id, "bytes_out", st->bytes_out.load(std::memory_order_relaxed));
    add("server", st->upstream, id, "check_failures", st->check_failures.load(std::memory_order_relaxed));
    add("server", st->upstream, id, "peak", st->peak_active.load(std::memory_order_relaxed));
  }
  if (!all || !snapshot_) return out;
  auto causes = [&add](const std::string& scope, const std::string& name, const CauseCounters& closed) {
    for (std::size_t c = 0; c < kCauseCount; ++c) {
      if (const std::uint64_t n = closed.get(static_cast<Cause>(c)); n != 0) {
        add(scope, name, "", "closed." + std::string(to_string(static_cast<Cause>(c))), n);
      }
    }
  };
  for (const ListenerView& lv : snapshot_->listeners) {
    const std::string& name = lv.config->name;
    const ListenerStats& ls = *lv.stats;
    out.push_back(own({"listener", name, "", "active", 0}, ls.active.load(std::memory_order_relaxed)));
    add("listener", name, "", "accepted", ls.accepted.load(std::memory_order_relaxed));
    add("listener", name, "", "bytes_in", ls.bytes_in.load(std::memory_order_relaxed));
    add("listener", name, "", "bytes_out", ls.bytes_out.load(std::memory_order_relaxed));
    add("listener", name, "", "peak", ls.peak_active.load(std::memory_order_relaxed));
    causes("listener", name, ls.closed);
    if (lv.config->client_max_connections == 0) continue;
    for (const auto& [addr, open] : ls.clients.open_counts()) {
      upgrade::Figure f = own({"client", name, std::string(addr.begin(), addr.end()), "open", 0}, open);
      if (f.value != 0) out.push_back(std::move(f));
    }
  }
  const ProcessCounters& pc = registry_.counters();
  out.push_back(own({"process", "", "", "connections", 0}, pc.connections.load(std::memory_order_relaxed)));
  causes("process", "", pc.closed);
  add("process", "", "", "accept_pauses", pc.accept_pauses.load(std::memory_order_relaxed));
  add("process", "", "", "local_errors", pc.local_errors.load(std::memory_order_relaxed));
  return out;
}

// Figures travel as absolute values (the receiver works out what changed),
// so a report sent twice changes nothing: what was sent counts as sent only
// once every message of the report has gone, and a report the channel had
// no room for goes whole with the next.
std::string Control::report_figures(int fd, bool all, upgrade::Tally& sent, bool wait) const {
  upgrade::Tally next = sent;
  const std::vector<upgrade::Figure> changed = next.changed(own_figures(all));
  for (const upgrade::Message& m : upgrade::counts_messages(changed)) {
    std::string err;
    if (wait) {
      err = upgrade::send(fd, m, kSendTimeoutMs);
    } else {
      upgrade::try_send(fd, m, err);
    }
    if (!err.empty()) return err;
  }
  sent = std::move(next);
  return {};
}

namespace {

// Adds `delta` (which may be negative) to a counter.
template <class T>
void add_to(std::atomic<T>& counter, std::int64_t delta) {
  if (delta >= 0) {
    counter.fetch_add(static_cast<T>(delta), std::memory_order_relaxed);
  } else {
    counter.fetch_sub(static_cast<T>(-delta), std::memory_order_relaxed);
  }
}

// Adds to a closed-by-cause counter; false for another counter's name.
bool add_closed(CauseCounters& closed, std::string_view counter, std::int64_t delta) {
  if (counter.substr(0, 7) != "closed.") return false;
  if (const std::optional<Cause> c = cause_named(counter.substr(7)); c && delta > 0) {
    closed.by_cause[static_cast<std::size_t>(*c)].fetch_add(static_cast<std::uint64_t>(delta),
                                                           std::memory_order_relaxed);
  }
  return true;
}

}  // namespace

void Control::fold_in(const std::vector<upgrade::Figure>& figures) {
  if (!snapshot_) return;
  std::map<std::pair<std::string, std::string>, std::shared_ptr<ServerState>> servers;
  for (const auto& st : registry_.servers()) servers[{st->upstream, server_identity(st->address)}] = st;
  bool freed = false;
  for (const upgrade::Figure& f : figures) {
    const upgrade::FigureKind kind = upgrade::figure_kind(f.counter);
    std::int64_t delta = kind == upgrade::FigureKind::peak ? 0 : remote_.update(f);
    // A total never goes back (a listener the other process dropped
    // reports 0): what it counted stays counted.
    if (kind == upgrade::FigureKind::total && delta < 0) continue;
    if (f.scope == "server") {
      auto it = servers.find({f.name, f.sub});
      ServerState* st = it != servers.end() ? it->second.get() : nullptr;
      if (f.counter == "active") {
        // What was folded into a state a reload has since replaced went
        // with it: the whole figure goes into the one in use now.
        std::weak_ptr<ServerState>& into = remote_servers_[f.key()];
        const std::shared_ptr<ServerState> was = into.lock();
        if (st != nullptr && was.get() != st) delta = static_cast<std::int64_t>(f.value);
        into = st != nullptr ? it->second : std::weak_ptr<ServerState>();
        if (st == nullptr || delta == 0) continue;
        const std::uint32_t now_active = st->active.load(std::memory_order_relaxed);
        if (delta < 0) freed = true;
        add_to(st->active, delta);
        if (delta > 0) raise_peak(st->peak_active, now_active + static_cast<std::uint32_t>(delta));
        st->notify();  // the pools read the count again at their next pick
        continue;
      }
      if (st == nullptr) continue;
      if (f.counter == "sessions") add_to(st->total_sessions, delta);
      if (f.counter == "failures") add_to(st->total_failures, delta);
      if (f.counter == "bytes_in") add_to(st->bytes_in, delta);
      if (f.counter == "bytes_out") add_to(st->bytes_out, delta);
      if (f.counter == "check_failures") add_to(st->check_failures, delta);
      if (f.counter == "peak") raise_peak(st->peak_active, static_cast<std::uint32_t>(f.value));
      continue;
    }
    if (f.scope == "listener" || f.scope == "client") {
      const long view = snapshot_->find_listener(f.name);
      if (view < 0) continue;
      ListenerStats& ls = *snapshot_->listeners[static_cast<std::size_t>(view)].stats;
      if (f.scope == "client") {
        std::array<std::uint8_t, 16> addr{};
        if (f.sub.size() != addr.size()) continue;
        std::memcpy(addr.data(), f.sub.data(), addr.size());
        ls.clients.add_open(addr, delta);
        continue;
      }
      if (f.counter == "active") {
        add_to(ls.active, delta);
        if (delta > 0) raise_peak(ls.peak_active, ls.active.load(std::memory_order_relaxed));
      }
      if (f.counter == "accepted") add_to(ls.accepted, delta);
      if (f.counter == "bytes_in") add_to(ls.bytes_in, delta);
      if (f.counter == "bytes_out") add_to(ls.bytes_out, delta);
      if (f.counter == "peak") raise_peak(ls.peak_active, f.value);
      add_closed(ls.closed, f.counter, delta);
      continue;
    }
    if (f.scope == "process") {
      ProcessCounters& pc = registry_.counters();
      if (f.counter == "connections") add_to(pc.connections, delta);
      if (f.counter == "accept_pauses") add_to(pc.accept_pauses, delta);
      if (f.counter == "local_errors") add_to(pc.local_errors, delta);
      add_closed(pc.closed, f.counter, delta);
    }
  }
  // A slot the other process gave back goes to this one's waiters at once.
  if (freed) {
    for (const auto& [name, up] : snapshot_->upstreams) {
      if (WaitQueue* q = up->queue()) q->serve(Clock::now());
    }
  }
}

void Control::drop_remote() {
  std::vector<upgrade::Figure> gone;
  for (upgrade::Figure f : remote_.figures()) {
    if (upgrade::figure_kind(f.counter) != upgrade::FigureKind::gauge) continue;
    f.value = 0;
    gone.push_back(std::move(f));
  }
  fold_in(gone);
  remote_.clear();
  remote_servers_.clear();
}

void Control::write_pid_file() {
  const std::string& path = snapshot_->config->global.pid_file;
  if (path.empty()) return;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const std::string text = std::to_string(::getpid()) + "\n";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (fd >= 0) ok = ::close(fd) == 0 && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    spdlog::warn("cannot write pid_file {}: {}", path, std::strerror(errno));
    ::unlink(tmp.c_str());
    return;
  }
  pid_file_ = path;
}

void Control::reclaim_pid_file() {
  // Only a process that wrote it, and only while no other serves.
  if (pid_file_.empty() || upgrade_state_.state() != UpgradeState::failed) return;
  write_pid_file();
}

void Control::remove_pid_file() {
  if (pid_file_.empty()) return;
  // Only while it names this process: after an upgrade it names the new one.
  std::ifstream in(pid_file_);
  long pid = 0;
  if (in >> pid && pid == static_cast<long>(::getpid())) ::unlink(pid_file_.c_str());
}

}  // namespace sluice
