// A binary upgrade, both ends (docs/decisions.md has the design):
//
//   old (serving)                          new (started by the old)
//   SIGUSR2 / POST /upgrade
//   spawn <exe> <args>, fd 3 = channel ->  parses its configuration
//                                       <- hello (format version, PID)
//   listener x N, server x N,
//   client x N, admin, go               ->  opens nothing it was given
//                                           starts its workers: accepting
//                                       <- ready (pid_file, MAINPID=)
//   stops accepting, hands its sessions
//   over, exits once it holds none
//
// Until "ready" the old process still accepts on the very same sockets: a
// new binary that fails (exits, hangs past upgrade_timeout, refuses the
// format) leaves nothing behind and the old one serves on.
#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include <spdlog/spdlog.h>

#include "control/control.hpp"
#include "net/listener.hpp"
#include "net/worker.hpp"
#include "proxy/fork_guard.hpp"
#include "sluice/address.hpp"
#include "sluice/time.hpp"
#include "sluice/version.hpp"
#include "upgrade/channel.hpp"

extern char** environ;

namespace sluice {

namespace {

uv_handle_t* as_handle(void* h) { return static_cast<uv_handle_t*>(h); }

// Blocking sends to a process that reads at once: a few seconds mean it is
// stuck.
constexpr int kSendTimeoutMs = 5000;
// The most descriptors one message carries (the kernel's SCM_MAX_FD is 253).
constexpr std::size_t kFdsPerMessage = 200;
// A server message: upstream, identity, active state, admin state, weight
// override and its base, then passive health (down?, fails, window age,
// down period left, time down, in ms).
constexpr std::size_t kServerFields = 11;
// A client message: the listener's name, then per client address three
// fields: the address (IPv6 text; IPv4 clients IPv4-mapped), its tokens in
// thousandths, the age of its last refill in ms (an age, not a time: the
// two processes' clocks need not agree).
constexpr std::size_t kClientFields = 3;
// Payload bytes after which a client message is sent: well under the
// channel's 64 KiB per message (an entry takes at most ~100 bytes), so
// 65 536 addresses go in a few hundred datagrams.
constexpr std::size_t kClientBatchBytes = 32 * 1024;

}  // namespace

struct Control::Upgrade {
  Control* control = nullptr;
  std::string origin;
  uv_process_t process{};
  uv_poll_t poll{};
  uv_timer_t timer{};
  int fd = -1;           // our end of the channel
  int pid = 0;
  int handles = 0;       // open libuv handles; deleted when the last closes
  bool process_open = false;
  bool poll_open = false;
  bool timer_open = false;
  bool exited = false;
  bool took_over = false;
  bool done = false;     // failed: nothing it says matters any more
  bool fork_guarded = false;  // fork_guard::begin_fork() is in force for it
  TimePoint started{};

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
    if (--u->handles == 0) delete u;
  }
  // Once the new process has taken over, the workers send sessions on `fd`
  // until they finish: it is closed only then (close_upgrade).
  void close_poll(bool close_fd = true) {
    if (poll_open) {
      poll_open = false;
      uv_close(as_handle(&poll), on_closed);
    }
    if (close_fd && fd >= 0) {
      ::close(fd);
      fd = -1;
    }
  }
  void close_timer() {
    if (timer_open) {
      timer_open = false;
      uv_close(as_handle(&timer), on_closed);
    }
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

admin::Outcome Control::upgrade(std::string_view origin) {
  if (stopping_ || handed_over_) {
    spdlog::warn("received {} while stopping: upgrade refused", origin);
    return {false, "sluice is stopping: upgrade refused"};
  }
  if (upgrade_ != nullptr) {
    spdlog::warn("received {}: an upgrade is already under way (new process {}); refused", origin, upgrade_->pid);
    return {false, "an upgrade is already under way (new process " + std::to_string(upgrade_->pid) + ")"};
  }
  spdlog::info("received {}: upgrading: starting {}", origin, exe_);
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    const std::string why = std::string("cannot make the hand-over channel: ") + std::strerror(errno);
    spdlog::error("upgrade failed, this process serves on: {}", why);
    upgrade_state_ = "failed";
    upgrade_message_ = why;
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
  u->fd = sv[0];
  u->started = Clock::now();
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
    up->end_fork_guard();
    up->close_process();
    if (up->done || up->took_over) {
      if (up->took_over && !up->done) {
        spdlog::warn("upgrade: the new process {} exited (status {}{}) after taking over", up->pid, status,
                     signal != 0 ? ", signal " + std::to_string(signal) : std::string());
      }
      return;
    }
    up->control->upgrade_failed(*up, "the new process " + std::to_string(up->pid) + " exited with status " +
                                         std::to_string(status) +
                                         (signal != 0 ? " (signal " + std::to_string(signal) + ")" : std::string()) +
                                         " before taking over; its own messages say why");
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
  upgrade_ = u;

  uv_poll_init(loop_, &u->poll, u->fd);
  u->poll.data = u;
  ++u->handles;
  u->poll_open = true;
  uv_poll_start(&u->poll, UV_READABLE, [](uv_poll_t* h, int, int) {
    auto* up = static_cast<Upgrade*>(h->data);
    up->control->on_upgrade_message(*up);
  });
  uv_timer_init(loop_, &u->timer);
  u->timer.data = u;
  ++u->handles;
  u->timer_open = true;
  const Duration timeout = snapshot_->config->global.upgrade_timeout;
  uv_timer_start(&u->timer, [](uv_timer_t* t) {
    auto* up = static_cast<Upgrade*>(t->data);
    const Duration d = up->control->snapshot_->config->global.upgrade_timeout;
    up->control->upgrade_failed(*up, "the new process " + std::to_string(up->pid) + " did not take over within " +
                                         "upgrade_timeout " + format_duration(d) + "; it is killed");
  }, static_cast<std::uint64_t>(timeout.count()), 0);
  upgrade_state_ = "starting";
  upgrade_message_ = "new process " + std::to_string(u->pid) + " started by " + std::string(origin);
  spdlog::info("upgrade: new process {} started; waiting up to {} for it to take over", u->pid,
               format_duration(timeout));
  return {true, "upgrade started: new process " + std::to_string(u->pid)};
}

void Control::upgrade_failed(Upgrade& u, const std::string& why) {
  u.end_fork_guard();
  if (u.done) return;
  u.done = true;
  spdlog::error("upgrade failed, this process serves on: {}", why);
  upgrade_state_ = "failed";
  upgrade_message_ = why;
  if (upgrade_ == &u) upgrade_ = nullptr;
  // Killed, not asked: it may hold copies of the listening sockets, and
  // must not accept from them once this process has decided to go on.
  if (!u.exited && u.process_open) uv_process_kill(&u.process, SIGKILL);
  u.close_poll();
  u.close_timer();
  // The process handle closes in its exit callback (which reaps it).
}

void Control::on_upgrade_message(Upgrade& u) {
  while (u.fd >= 0) {
    upgrade::Message m;
    std::string err;
    const upgrade::RecvStatus st = upgrade::receive(u.fd, m, err);
    if (st == upgrade::RecvStatus::again) return;
    if (st != upgrade::RecvStatus::ok) {
      if (u.took_over) {
        spdlog::warn("upgrade: the new process {} closed the hand-over channel; sessions not yet handed over end "
                     "here", u.pid);
        u.close_poll(false);
        return;
      }
      if (st == upgrade::RecvStatus::closed && !u.exited) {
        // It is exiting, most likely: its exit status says more than the
        // closed channel (the exit callback, or upgrade_timeout, ends it).
        u.close_poll();
        return;
      }
      upgrade_failed(u, st == upgrade::RecvStatus::closed
                            ? "the new process " + std::to_string(u.pid) + " closed the hand-over channel"
                            : "hand-over channel: " + err);
      return;
    }
    m.close_fds();  // the new process sends none
    if (m.version != upgrade::kFormatVersion) {
      const std::string why = "the new binary speaks hand-over format " + std::to_string(m.version) +
                              ", this one format " + std::to_string(upgrade::kFormatVersion);
      upgrade::Message refuse;
      refuse.kind = upgrade::Kind::refuse;
      refuse.fields = {why};
      upgrade::send(u.fd, refuse, kSendTimeoutMs);
      upgrade_failed(u, why + ": refused");
      return;
    }
    if (m.kind == upgrade::Kind::hello) {
      u.end_fork_guard();
      spdlog::info("upgrade: new process {} ({}) checked its configuration; handing over the listening sockets",
                   u.pid, m.fields.size() > 1 ? m.fields[1] : std::string("?"));
      std::string send_error;
      for (const auto& s : sockets_) {
        for (std::size_t at = 0; at < s->dups.size() && send_error.empty(); at += kFdsPerMessage) {
          upgrade::Message l;
          l.kind = upgrade::Kind::listener;
          l.fields = {s->key, s->listener, s->bound};
          const std::size_t end = std::min(s->dups.size(), at + kFdsPerMessage);
          l.fds.assign(s->dups.begin() + static_cast<long>(at), s->dups.begin() + static_cast<long>(end));
          send_error = upgrade::send(u.fd, l, kSendTimeoutMs);
        }
      }
      // Server state, so that the new process neither checks from scratch
      // nor forgets a drain, a weight set through the admin API or a server
      // passive health keeps out.
      const TimePoint now = Clock::now();
      for (const auto& server : registry_.servers()) {
        if (!send_error.empty()) break;
        const PassiveHealth::Saved passive = server->save_passive(now);
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
                     // One writer: a fenced server stays fenced in the new
                     // process (fields a process before them does without).
                     upgrade::field(static_cast<std::uint64_t>(server->fence_kind())),
                     server->fenced_by(),
                     server->status(now).fence_reason};
        send_error = upgrade::send(u.fd, sm, kSendTimeoutMs);
      }
      if (send_error.empty()) send_error = send_client_buckets(u.fd);
      if (send_error.empty() && admin_http_ && admin_http_->listening_fd() >= 0) {
        upgrade::Message a;
        a.kind = upgrade::Kind::admin;
        a.fields = {admin_http_->bound()};
        a.fds = {admin_http_->listening_fd()};
        send_error = upgrade::send(u.fd, a, kSendTimeoutMs);
      }
      if (send_error.empty()) {
        upgrade::Message go;
        go.kind = upgrade::Kind::go;
        send_error = upgrade::send(u.fd, go, kSendTimeoutMs);
      }
      if (!send_error.empty()) {
        upgrade_failed(u, "cannot hand over the listening sockets: " + send_error);
        return;
      }
      continue;
    }
    if (m.kind == upgrade::Kind::ready && !u.took_over) {
      on_taken_over(u);
      continue;
    }
  }
}

void Control::on_taken_over(Upgrade& u) {
  u.took_over = true;
  u.close_timer();
  const auto took = std::chrono::duration_cast<Duration>(Clock::now() - u.started);
  spdlog::info("upgrade: new process {} serves now (took over in {}); this process stops accepting and finishes "
               "its sessions",
               u.pid, format_duration(took));
  upgrade_state_ = "handed_over";
  upgrade_message_ = "new process " + std::to_string(u.pid) + " serves";
  handed_over_ = true;
  stopping_ = true;
  update_watch();  // off: the new process watches the file now
  // The new process holds the same sockets: nothing is refused when these
  // copies close.
  for (auto& s : sockets_) s->close_dups();
  uv_unref(as_handle(&signal_poll_));
  uv_unref(as_handle(&tick_));
  if (u.poll_open) uv_unref(as_handle(&u.poll));
  if (u.process_open) uv_unref(as_handle(&u.process));
  // Closed once (its handles close asynchronously; the object stays until
  // the loop has ended). The new process answers on the same socket.
  if (admin_http_) admin_http_->close([] {});
  for (auto& w : workers_) {
    WorkerCommand c = WorkerCommand::of(WorkerCommand::Kind::hand_over);
    c.channel = u.fd;
    w->post(std::move(c));
  }
}

void Control::close_upgrade() {
  if (takeover_poll_open_) {
    takeover_poll_open_ = false;
    uv_close(as_handle(&takeover_poll_), nullptr);
  }
  if (takeover_fd_ >= 0) {
    ::close(takeover_fd_);
    takeover_fd_ = -1;
  }
  if (upgrade_ == nullptr) return;
  upgrade_->end_fork_guard();
  upgrade_->done = true;
  upgrade_->close_poll();
  upgrade_->close_timer();
  upgrade_->close_process();
  upgrade_ = nullptr;
}

// ---- the new process -------------------------------------------------------

std::string Control::receive_handover() {
  const int fd = takeover_fd_;
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
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
        if (m.fields.size() >= kServerFields) inherited_servers_.push_back(std::move(m.fields));
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
        return "refused by the serving process: " + (m.fields.empty() ? std::string("?") : m.fields[0]);
      default:
        m.close_fds();
        break;
    }
  }
}

void Control::restore_servers() {
  std::size_t restored = 0;
  for (const auto& st : registry_.servers()) {
    const std::string id = server_identity(st->address);
    for (const auto& f : inherited_servers_) {
      if (f[0] != st->upstream || f[1] != id) continue;
      const auto active = static_cast<ActiveState>(upgrade::number(f[2]));
      const auto admin = static_cast<AdminState>(upgrade::number(f[3]));
      if (active == ActiveState::up || active == ActiveState::down || active == ActiveState::standby) {
        st->set_active(active, "as the previous process had it");
      }
      if (f.size() >= kServerFields + 3) {
        const auto fence = static_cast<FenceKind>(upgrade::number(f[kServerFields]));
        if (fence == FenceKind::lost || fence == FenceKind::waiting || fence == FenceKind::failover) {
          st->fence(fence, f[kServerFields + 1], f[kServerFields + 2] + " (as the previous process had it)");
          if (fence == FenceKind::failover) {
            expire_failover_fence(st);
            if (sentinels_) {
              const std::string address = format_sockaddr(reinterpret_cast<const sockaddr*>(&st->address.addr));
              sentinels_->resume_failover(st->upstream, address, f[kServerFields + 1]);
            }
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
      st->restore_passive(passive, Clock::now());
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
  write_pid_file();
  notify_systemd("MAINPID=" + std::to_string(::getpid()) + "\nREADY=1\nSTATUS=running (upgraded), configuration generation " +
                 std::to_string(generation_));
  upgrade::Message ready;
  ready.kind = upgrade::Kind::ready;
  if (std::string err = upgrade::send(takeover_fd_, ready, kSendTimeoutMs); !err.empty()) {
    spdlog::warn("upgrade: cannot tell the old process that this one serves: {}", err);
  }
  spdlog::info("upgrade: this process ({}) serves now", ::getpid());
  uv_poll_init(loop_, &takeover_poll_, takeover_fd_);
  takeover_poll_.data = this;
  takeover_poll_open_ = true;
  uv_poll_start(&takeover_poll_, UV_READABLE, [](uv_poll_t* h, int, int) {
    static_cast<Control*>(h->data)->on_handed_sessions();
  });
  upgrade_state_ = "took_over";
  upgrade_message_ = "this process took over from the previous one";
}

void Control::on_handed_sessions() {
  while (takeover_poll_open_) {
    upgrade::Message m;
    std::string err;
    const upgrade::RecvStatus st = upgrade::receive(takeover_fd_, m, err);
    if (st == upgrade::RecvStatus::again) return;
    if (st != upgrade::RecvStatus::ok) {
      // The old process has exited (or gave up): every session it handed
      // over is here.
      if (st == upgrade::RecvStatus::error) spdlog::warn("upgrade: hand-over channel: {}", err);
      spdlog::info("upgrade: the old process is done; {} session(s) handed over", sessions_adopted_);
      takeover_poll_open_ = false;
      uv_close(as_handle(&takeover_poll_), nullptr);
      ::close(takeover_fd_);
      takeover_fd_ = -1;
      upgrade_message_ = "took over from the previous process with " + std::to_string(sessions_adopted_) +
                         " session(s)";
      return;
    }
    if (m.version != upgrade::kFormatVersion || m.kind != upgrade::Kind::session || m.fds.size() < 2 ||
        m.fds.size() > 3 || workers_.empty() || stopping_) {
      m.close_fds();
      continue;
    }
    WorkerCommand c = WorkerCommand::of(WorkerCommand::Kind::adopt);
    c.record = std::move(m.fields);
    for (int fd : m.fds) c.open.push_back({0, fd});
    workers_[next_adopter_++ % workers_.size()]->post(std::move(c));
    ++sessions_adopted_;
  }
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

void Control::remove_pid_file() {
  if (pid_file_.empty()) return;
  // Only while it names this process: after an upgrade it names the new one.
  std::ifstream in(pid_file_);
  long pid = 0;
  if (in >> pid && pid == static_cast<long>(::getpid())) ::unlink(pid_file_.c_str());
}

}  // namespace sluice
