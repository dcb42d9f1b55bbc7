#include "control/control.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <exception>
#include <optional>
#include <set>
#include <stdexcept>

#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>
#include <xxhash.h>

#include "control/affinity.hpp"
#include "log/access_log.hpp"
#include "net/listener.hpp"
#include "net/worker.hpp"
#include "sluice/address.hpp"
#include "sluice/time.hpp"
#include "sluice/uv_handle.hpp"
#include "sluice/version.hpp"
#include "upgrade/channel.hpp"

namespace sluice {

namespace {

constexpr int kHandledSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2};

sigset_t handled_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kHandledSignals) sigaddset(&set, sig);
  return set;
}

std::string socket_key(const ListenerConfig& l) {
  if (l.listen.port == 0) return "name:" + l.name;
  return format_sockaddr(reinterpret_cast<const sockaddr*>(&l.listen.addr));
}

// Raises the open-file limit to the hard limit and warns (once, with the
// numbers) when even that is below what the configuration needs.
void raise_nofile(const Config& config, unsigned workers) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit want = rl;
    want.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &want) == 0) rl = want;
  }
  // Two descriptors per session (client and server), the listening sockets
  // and their spares, and a margin for logs, the admin API and health checks.
  const std::uint64_t need =
      2 * config.global.max_connections + 2ULL * workers * config.listeners.size() + 64;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
    spdlog::warn("open-file limit is {} (hard limit {}), but max_connections = {} needs about {}: connections "
                 "beyond the limit will fail with cause local_resource; raise the limit (ulimit -n, LimitNOFILE=) "
                 "or lower max_connections",
                 rl.rlim_cur, rl.rlim_max, config.global.max_connections, need);
  }
}

// Writes `text` to a new file at `path` (the mode of `like`, when it
// exists) and flushes it to disk. Returns "" or the error.
std::string write_file_synced(const std::string& path, std::string_view text, const std::string& like) {
  struct stat st {};
  const mode_t mode = ::stat(like.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0644;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return std::strerror(errno);
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string err = std::strerror(errno);
      ::close(fd);
      return err;
    }
    done += static_cast<std::size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const std::string err = synced ? std::string() : std::strerror(errno);
  if (::close(fd) != 0 && synced) return std::strerror(errno);
  return err;
}

// The file `path` names once every symbolic link in its last component is
// followed (a relative link is relative to the link's directory). A link
// that points nowhere yields where it points; a loop of links yields the last
// name reached.
std::string through_links(std::string path) {
  for (int hops = 0; hops < 40; ++hops) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return path;
    std::string to(static_cast<std::size_t>(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
    const ssize_t n = ::readlink(path.c_str(), to.data(), to.size());
    if (n < 0 || static_cast<std::size_t>(n) >= to.size()) return path;
    to.resize(static_cast<std::size_t>(n));
    if (to.empty()) return path;
    if (to.front() != '/') {
      const std::size_t slash = path.rfind('/');
      to = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + to;
    }
    path = std::move(to);
  }
  return path;
}

// What a configuration file says, as a number: an upgrade compares the
// file the new process read with the text the old one ran. 0 when it
// cannot be read.
std::uint64_t text_digest(std::string_view text) { return ConfigWatch::digest(text); }

std::uint64_t file_digest(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  char buf[16384];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) XXH3_64bits_update(st, buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  const std::uint64_t d = n == 0 ? XXH3_64bits_digest(st) : 0;
  XXH3_freeState(st);
  return d;
}

// What loading a configuration read beyond its text: the admin token and
// the addresses its host names resolved to. The same text with the same
// of these is the same configuration (a reload of it is a no-op).
std::uint64_t outside_digest(const Config& c) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  const auto add = [st](const Endpoint& e) { XXH3_64bits_update(st, &e.addr, e.addr_len); };
  XXH3_64bits_update(st, c.admin.token.data(), c.admin.token.size());
  add(c.admin.listen);
  for (const ListenerConfig& l : c.listeners) add(l.listen);
  for (const auto& [name, u] : c.upstreams) {
    for (const ServerConfig& sc : u.servers) add(sc.address);
    if (u.sentinel) {
      for (const Endpoint& e : u.sentinel->addresses) add(e);
    }
  }
  for (const Endpoint& e : c.resolver.nameservers) add(e);
  const std::uint64_t d = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return d;
}

}  // namespace

struct Control::Drain {
  uv_timer_t timer{};
  Control* control = nullptr;
  std::vector<std::shared_ptr<const ServerState>> servers;
  Duration spread{0};
};

void Control::block_signals() {
  const sigset_t set = handled_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

Control::Control(std::string config_path, std::shared_ptr<const Config> config)
    : config_path_(std::move(config_path)), initial_(std::move(config)), loop_(uv_default_loop()) {}

Control::~Control() = default;

int Control::run() {
  if (!start()) {
    remove_pid_file();  // a new process that named itself before its takeover failed
    return 1;
  }
  uv_run(loop_, UV_RUN_DEFAULT);
  for (auto& w : workers_) w->join();
  workers_.clear();
  snapshot_.reset();
  uv_loop_close(loop_);
  // Handed over: pid_file is the new process's, which names itself about
  // now (a check of the file's content then removal would race with it).
  if (upgrade_state_.state() != UpgradeState::handed_over && upgrade_state_.state() != UpgradeState::finishing) {
    remove_pid_file();
  }
  spdlog::info(upgrade_state_.state() == UpgradeState::handed_over ? "stopped: the new process serves" : "stopped");
  return exit_status_;
}

bool Control::start() {
  const Config& config = *initial_;
  nworkers_ = config.global.workers != 0 ? config.global.workers : uv_available_parallelism();
  raise_nofile(config, nworkers_);

  started_at_ms_ = wall_ms();
  service_started_at_ms_ = started_at_ms_;
  config_digest_ = file_digest(config_path_);
  outside_digest_ = outside_digest(config);
  health_ = std::make_unique<HealthChecker>(
      loop_, [this](std::shared_ptr<ServerState> server, const HealthConfig&, HealthChecker::SessionAction action) {
        // on_down = "close_sessions" or a role change: the server's live
        // sessions end now; on_down = "drain": after drain_timeout.
        if (action == HealthChecker::SessionAction::drain) {
          drain_down(std::move(server));
        } else {
          close_sessions(std::move(server), action == HealthChecker::SessionAction::fence ? Cause::fenced
                                                                                          : Cause::server_down);
        }
      });
  health_->set_on_up([this](const std::shared_ptr<ServerState>& server) { serve_queue(server->upstream); });
  start_discovery(config);
  start_sentinels(config);
  uv_async_init(loop_, &stopped_async_, on_stopped_async);
  stopped_async_.data = this;
  for (unsigned w = 0; w < nworkers_; ++w) workers_.push_back(std::make_unique<Worker>(w, &stopped_async_));

  // Read before the first listener opens: a caller that sees "listening"
  // and sends SIGUSR1 or SIGHUP finds it handled once the loop runs. The
  // signals were blocked before any thread started (see block_signals).
  const sigset_t handled = handled_signals();
  signal_fd_ = ::signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd_ < 0) throw std::runtime_error(std::string("cannot create a signalfd: ") + std::strerror(errno));
  uv_poll_init(loop_, &signal_poll_, signal_fd_);
  signal_poll_.data = this;
  // Started by a binary upgrade: the listening sockets come from the
  // process that serves now, which goes on serving if this start fails.
  const std::string handover_error = takeover_ ? receive_handover() : std::string();
  // The service goes on: its start, its configuration generation, its reloads.
  if (handover_error.empty() && !inherited_service_.empty()) restore_service(inherited_service_);
  ReloadResult r = handover_error.empty() ? apply(initial_) : ReloadResult{false, "upgrade: " + handover_error};
  // The old process's counts and totals, now that the Registry has this
  // configuration's servers and listeners.
  if (r.ok && !inherited_figures_.empty()) {
    fold_in(inherited_figures_);
    inherited_figures_.clear();
  }
  for (auto& [key, fds] : inherited_) {
    for (int fd : fds) ::close(fd);  // the configuration no longer has them
  }
  inherited_.clear();
  if (r.ok) wait_first_checks();
  // Signals that came meanwhile wait in the signalfd and are read now.
  uv_poll_start(&signal_poll_, UV_READABLE, on_signal_fd);
  if (r.ok) {
    if (std::string err = start_admin(config); !err.empty()) r = {false, err};
  }
  if (!r.ok) {
    close_signal_fd();
    if (admin_http_) admin_http_->close([] {});
    if (discovery_) discovery_->stop([] {});
    if (sentinels_) sentinels_->stop();
    spdlog::critical("{}", r.message);
    // The old process logs why this one did not take over.
    if (takeover_) upgrade::tell_failure(takeover_->fd(), "critical", r.message);
    for (auto& w : workers_) w->post(WorkerCommand::of(WorkerCommand::Kind::stop));
    for (auto& w : workers_) w->start();
    for (auto& w : workers_) w->join();
    workers_.clear();
    uv_close(as_handle(&stopped_async_), nullptr);
    uv_run(loop_, UV_RUN_DEFAULT);
    return false;
  }
  uv_timer_init(loop_, &tick_);
  tick_.data = this;
  uv_timer_start(&tick_, on_tick, 1000, 1000);
  update_watch();
  // Started by an upgrade: the workers accept once the old process has
  // stopped (its counts are then here, and only go down).
  if (!takeover_) start_workers();
  spdlog::info("sluice {} started: {} worker(s), {} listener(s)", sluice::version(), nworkers_,
               config.listeners.size());
  if (takeover_) {
    announce_takeover();
  } else {
    write_pid_file();
    notify_systemd("READY=1\nSTATUS=running, configuration generation " + std::to_string(generation_));
  }
  return true;
}

ReloadResult Control::reload_from_file() {
  const std::uint64_t before = file_digest(config_path_);
  std::shared_ptr<const Config> config;
  try {
    config = std::make_shared<const Config>(load_config(config_path_));
  } catch (const ConfigError& e) {
    ReloadResult bad{false, e.what()};
    bad.file_digest = before;
    return bad;
  }
  const std::uint64_t outside = outside_digest(*config);
  const std::uint64_t after = file_digest(config_path_);
  // The same bytes (read before and after loading them) and the same token
  // and addresses: the running configuration is this file already, and
  // building it again would only cost the workers a rebuild of their tables.
  if (snapshot_ && before != 0 && before == config_digest_ && outside == outside_digest_ && after == before) {
    ReloadResult same{true, "configuration unchanged (same bytes, same token and addresses): nothing to apply, generation " +
                                std::to_string(generation_) + " stays"};
    same.file_digest = before;
    return same;
  }
  ReloadResult r = apply(std::move(config));
  if (r.ok) {
    // Should the file have changed while it was loaded, what runs is not
    // known to be either content: neither counts as loaded, and the watch
    // (or the next reload) loads it again.
    config_digest_ = after == before ? before : 0;
    outside_digest_ = outside;
  }
  r.file_digest = after == before ? before : 0;
  return r;
}

ReloadResult Control::apply(std::shared_ptr<const Config> config) {
  ReloadResult result;
  const unsigned want_workers = config->global.workers != 0 ? config->global.workers : uv_available_parallelism();
  // Settings only a restart changes keep their running values; the answer
  // and the log list them.
  std::vector<std::string> waiting;
  if (snapshot_ && want_workers != nworkers_) {
    result.restart_required.push_back("global.workers");
    waiting.push_back("global.workers (still " + std::to_string(nworkers_) + ")");
  }
  if (snapshot_ && config->global.control_cpu != control_cpu_) {
    result.restart_required.push_back("global.control_cpu");
    waiting.push_back("global.control_cpu (still " + (control_cpu_ < 0 ? std::string("unset") : std::to_string(control_cpu_)) + ")");
  }

  // A new error_log is opened before anything else is: a path that cannot
  // be opened fails the reload, and the error log stays where it was.
  std::optional<LogOutput> error_log;
  if (snapshot_ && config->global.error_log != snapshot_->config->global.error_log) {
    try {
      error_log.emplace(config->global.error_log);
    } catch (const std::exception& e) {
      return {false, "[global] error_log \"" + config->global.error_log + "\" cannot be opened: " + e.what()};
    }
  }

  // Match listeners to the sockets already open (by address), open the rest.
  std::vector<std::unique_ptr<Socket>> fresh;
  std::vector<std::vector<int>> fresh_fds;  // at least one per worker; socket i goes to worker i % workers
  std::vector<std::pair<Socket*, std::string>> kept;  // socket, its (new) listener name
  std::set<Socket*> used;
  auto close_fresh = [&] {
    for (auto& fds : fresh_fds) {
      for (int fd : fds) ::close(fd);
    }
  };
  for (const ListenerConfig& l : config->listeners) {
    const std::string key = socket_key(l);
    auto it = std::find_if(sockets_.begin(), sockets_.end(),
                           [&](const std::unique_ptr<Socket>& s) { return s->key == key && !used.count(s.get()); });
    if (it != sockets_.end()) {
      used.insert(it->get());
      kept.emplace_back(it->get(), l.name);
      continue;
    }
    try {
      ListeningSockets ls;
      if (!take_inherited(l, key, ls.fds, ls.bound)) ls = open_listening_sockets(l, nworkers_);
      auto s = std::make_unique<Socket>();
      s->id = next_socket_id_++;
      s->key = key;
      s->bound = ls.bound;
      s->listener = l.name;
      fresh.push_back(std::move(s));
      fresh_fds.push_back(std::move(ls.fds));
    } catch (const std::exception& e) {
      close_fresh();
      return {false, e.what()};
    }
  }

  std::shared_ptr<const Snapshot> snap;
  try {
    snap = Snapshot::build(with_discovered(config), registry_, generation_ + 1);
  } catch (const std::exception& e) {
    close_fresh();
    return {false, e.what()};
  }

  // Commit: from here on nothing fails.
  ++generation_;
  std::vector<std::uint64_t> closed;
  for (auto& s : sockets_) {
    if (!used.count(s.get())) {
      closed.push_back(s->id);
      spdlog::info("listener \"{}\" on {} closed; its sessions continue", s->listener, s->bound);
    }
  }
  std::erase_if(sockets_, [&](const std::unique_ptr<Socket>& s) { return !used.count(s.get()); });
  for (auto& [s, name] : kept) s->listener = name;
  std::vector<std::pair<std::uint64_t, std::string>> names;
  for (auto& s : sockets_) names.emplace_back(s->id, s->listener);
  for (auto& s : fresh) names.emplace_back(s->id, s->listener);
  // Checks first: a server this configuration adds is down (initial) before
  // any worker can pick it.
  if (!inherited_servers_.empty()) restore_servers();
  if (health_ && !stopping_) health_->update(*snap);
  for (unsigned w = 0; w < workers_.size(); ++w) {
    WorkerCommand c;
    c.kind = WorkerCommand::Kind::update;
    c.snapshot = snap;
    c.close = closed;
    c.names = names;
    for (std::size_t i = 0; i < fresh.size(); ++i) {
      for (std::size_t j = w; j < fresh_fds[i].size(); j += workers_.size()) c.open.emplace_back(fresh[i]->id, fresh_fds[i][j]);
    }
    workers_[w]->post(std::move(c));
  }
  for (std::size_t i = 0; i < fresh.size(); ++i) {
    for (int fd : fresh_fds[i]) {
      const int d = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
      if (d >= 0) fresh[i]->dups.push_back(d);
    }
  }
  for (auto& s : fresh) {
    spdlog::info("listener \"{}\" listening on {}", s->listener, s->bound);
    sockets_.push_back(std::move(s));
  }
  std::shared_ptr<const Snapshot> before = std::move(snapshot_);
  snapshot_ = std::move(snap);
  snapshot_is_current();
  if (config->listeners.empty() && (!before || !before->config->listeners.empty())) {
    spdlog::info("no listener configured: sluice takes no client connection until the file has a [[listener]] "
                 "and is reloaded; the admin API and health checks run as configured");
  }
  if (before) {
    drain_removed(*before, *snapshot_);
    close_replaced_masters(*before);
  }
  configure_discovery(config);

  loaded_at_ms_ = wall_ms();
  if (before) {
    update_watch();
    apply_admin_changes(snapshot_->config->admin, result.restart_required, waiting);
    if (error_log) {
      // In the old destination, so that whoever reads it knows where to look.
      spdlog::info("error log moves to {}", error_log->target());
      set_error_log_output(std::move(*error_log));
    }
    set_error_log_level(config->global.log_level);
  }

  result.ok = true;
  result.message = "configuration generation " + std::to_string(generation_) + " loaded from " + config->path;
  if (!waiting.empty()) {
    result.message += "; needs a restart to take effect: ";
    for (std::size_t i = 0; i < waiting.size(); ++i) result.message += (i > 0 ? ", " : "") + waiting[i];
  }
  return result;
}

// The admin API's listener starts and stops only with the process, and its
// token guards that listener: a reload may change the token while the
// listener stays as it is, but never turn authentication off, and a token
// written for another listener (or a removed [admin]) waits for the restart
// that brings that listener. Until then the running token stays in force.
void Control::apply_admin_changes(const AdminConfig& a, std::vector<std::string>& restart_required,
                                  std::vector<std::string>& waiting) {
  if (!admin_api_) {
    if (a.enabled) {
      restart_required.push_back("admin");
      waiting.push_back("admin (the admin API is started only at start-up)");
    }
    return;
  }
  const std::string running = admin_http_->bound();
  if (!a.enabled) {
    restart_required.push_back("admin");
    waiting.push_back("admin (the admin API keeps running on " + running + ", with its token, until a restart)");
    return;
  }
  // More names for the running listener take effect now.
  admin_config_.allowed_hosts = a.allowed_hosts;
  admin_api_->set_allowed_hosts(admin::allowed_hosts(admin_config_, admin_http_->bound_port()));
  const bool same_listener =
      a.listen.port == admin_config_.listen.port && same_ip(a.listen.addr, admin_config_.listen.addr);
  if (!same_listener) {
    restart_required.push_back("admin.listen");
    waiting.push_back("admin.listen (still " + running + ")");
    if (a.token != admin_token_) {
      restart_required.push_back("admin.token_file");
      waiting.push_back("admin.token_file (the running token stays with the running listener)");
    }
    return;
  }
  if (a.token.empty() && !admin_token_.empty()) {
    restart_required.push_back("admin.token_file");
    waiting.push_back("admin.token_file (removing it turns authentication off only at a restart; the running "
                      "token stays)");
    return;
  }
  if (a.token != admin_token_) {
    admin_token_ = a.token;
    admin_api_->set_token(admin_token_);  // a new token_file takes effect now
  }
}

// Servers that the new configuration no longer has: their sessions go on, or
// end after the upstream's drain_timeout, one by one over close_spread (or,
// when that is not set, over a tenth of drain_timeout) so the clients do
// not all reconnect at once.
void Control::drain_removed(const Snapshot& before, const Snapshot& after) {
  std::set<const ServerState*> now;
  for (const auto& [name, up] : after.upstreams) {
    for (std::size_t i = 0; i < up->size(); ++i) now.insert(up->member(i).state.get());
  }
  for (const auto& [name, up] : before.upstreams) {
    std::vector<std::shared_ptr<const ServerState>> gone;
    for (std::size_t i = 0; i < up->size(); ++i) {
      if (now.count(up->member(i).state.get())) continue;
      gone.push_back(up->member(i).state);
      registry_.retire(name, up->member(i).state);  // its sessions stay visible (/status "retired")
    }
    if (gone.empty()) continue;
    // The new file's word counts: a reload that removes a server may also
    // set the drain_timeout it should get (the upstream's own, or else the
    // new [global] one: the loader has applied that default already). For
    // an upstream the new file drops, its own value from the old file, or
    // else the new [global] drain_timeout. "0s" written on an upstream
    // means what it says: the sessions finish on their own.
    const Upstream* now_up = after.find_upstream(name);
    const Duration timeout = now_up != nullptr                ? now_up->config().drain_timeout
                             : up->config().drain_timeout_set ? up->config().drain_timeout
                                                              : after.config->global.drain_timeout;
    for (const auto& s : gone) {
      spdlog::info("upstream \"{}\" server {} removed; its {} session(s) {}", name, s->address.text,
                   s->active.load(std::memory_order_relaxed),
                   timeout.count() > 0 ? "end after drain_timeout " + format_duration(timeout) : std::string("continue"));
    }
    if (timeout.count() <= 0) continue;
    auto* d = new Drain;
    d->control = this;
    d->servers = std::move(gone);
    const GlobalConfig& g = after.config->global;
    d->spread = g.close_spread_set ? g.close_spread : Duration(std::max<Duration::rep>(timeout.count() / 10, 1));
    uv_timer_init(loop_, &d->timer);
    d->timer.data = d;
    uv_timer_start(&d->timer, [](uv_timer_t* t) {
      auto* dr = static_cast<Drain*>(t->data);
      if (!dr->control->stopping_) {
        for (const auto& s : dr->servers) dr->control->close_sessions(s, Cause::server_drained, dr->spread);
      }
      uv_close(as_handle(t), [](uv_handle_t* h) { delete static_cast<Drain*>(h->data); });
    }, static_cast<std::uint64_t>(timeout.count()), 0);
    // While stopping, the timer must not keep the loop alive.
    uv_unref(as_handle(&d->timer));
  }
}

void Control::start_discovery(const Config& config) {
  discovery_ = std::make_unique<discovery::Discovery>(loop_, [this] { apply_discovered(); });
  try {
    discovery_->configure(config);
  } catch (const std::exception& e) {
    spdlog::error("DNS discovery cannot start: {}; upstreams get no server from DNS", e.what());
    return;
  }
  if (!discovery_->active()) return;
  const Duration limit = discovery::Discovery::settle_limit(config.resolver);
  spdlog::info("DNS: asking for the servers' names (waiting at most {})", format_duration(limit));
  discovery_->wait_settled(limit);
}

// Sentinel upstreams: the first Snapshot should have their masters, so the
// sentinels are asked first (in order, each within its timeout), as DNS names
// are.
void Control::start_sentinels(const Config& config) {
  sentinels_ = std::make_unique<discovery::Sentinels>(
      loop_, [this] { apply_discovered(); },
      [this](const std::string& upstream, const std::string& address, bool fence, const std::string& by,
             const std::string& reason) { sentinel_fence(upstream, address, fence, by, reason); });
  sentinels_->configure(config);
  if (!sentinels_->active()) return;
  const Duration limit = discovery::Sentinels::settle_limit(config);
  spdlog::info("sentinel: asking for the masters (waiting at most {})", format_duration(limit));
  sentinels_->wait_settled(limit);
}

std::shared_ptr<const Config> Control::with_discovered(const std::shared_ptr<const Config>& config) const {
  std::shared_ptr<const Config> out = discovery_ ? discovery_->expand(config) : config;
  return sentinels_ ? sentinels_->expand(out) : out;
}

void Control::configure_discovery(const std::shared_ptr<const Config>& config) {
  file_config_ = config;
  if (stopping_) return;
  if (sentinels_) sentinels_->configure(*config);
  if (!discovery_) return;
  try {
    discovery_->configure(*config);
  } catch (const std::exception& e) {
    spdlog::error("DNS discovery keeps its previous [resolver]: {}", e.what());
  }
}

void Control::apply_discovered() {
  // After a binary upgrade's hand-over this process still holds the clients
  // that wait in a queue for a failover to end: a new master is still
  // checked and handed to them (the workers, which hand their sessions
  // over, keep the Snapshot they have).
  if ((stopping_ && !mainpid_moved_) || !snapshot_ || !file_config_) return;
  std::shared_ptr<const Snapshot> snap;
  try {
    snap = Snapshot::build(with_discovered(file_config_), registry_, generation_);
  } catch (const std::exception& e) {
    spdlog::error("DNS: the servers' change could not be applied: {}", e.what());
    return;
  }
  std::vector<std::pair<std::uint64_t, std::string>> names;
  for (auto& s : sockets_) names.emplace_back(s->id, s->listener);
  // Checks first: an address DNS adds is down (initial) before any worker
  // can pick it.
  if (health_) health_->update(*snap);
  for (auto& w : workers_) {
    if (mainpid_moved_) break;
    WorkerCommand c;
    c.kind = WorkerCommand::Kind::update;
    c.snapshot = snap;
    c.names = names;
    w->post(std::move(c));
  }
  std::shared_ptr<const Snapshot> before = std::move(snapshot_);
  snapshot_ = std::move(snap);
  snapshot_is_current();
  if (!mainpid_moved_) drain_removed(*before, *snapshot_);
  close_replaced_masters(*before);
}

// A master the sentinels replaced: its sessions end now (cause fenced: it
// is no longer the one writer), after the workers have the Snapshot with
// the new master, since writes there would fail or land on a demoted node.
void Control::close_replaced_masters(const Snapshot& before) {
  if (!sentinels_) return;
  for (const auto& [upstream, address] : sentinels_->take_replaced()) {
    const Upstream* up = before.find_upstream(upstream);
    if (up == nullptr) continue;
    for (std::size_t i = 0; i < up->size(); ++i) {
      const auto& state = up->member(i).state;
      if (format_sockaddr(reinterpret_cast<const sockaddr*>(&state->address.addr)) != address) continue;
      spdlog::info("upstream \"{}\" server {} is no longer the master: closing its {} session(s)", upstream,
                   state->address.text, state->active.load(std::memory_order_relaxed));
      close_sessions(state, Cause::fenced);
    }
  }
}

void Control::on_signal_fd(uv_poll_t* h, int status, int) {
  auto* c = static_cast<Control*>(h->data);
  if (status < 0) return;
  // Each standard signal is queued once however often it came, as with a
  // handler; several different ones are taken in the order read.
  signalfd_siginfo info{};
  while (true) {
    const ssize_t n = ::read(c->signal_fd_, &info, sizeof info);
    if (n != static_cast<ssize_t>(sizeof info)) {
      if (n < 0 && errno == EINTR) continue;
      return;  // EAGAIN: nothing more for now
    }
    c->on_signal(static_cast<int>(info.ssi_signo));
    if (c->signal_fd_ < 0) return;  // the loop is closing
  }
}

void Control::close_signal_fd() {
  if (signal_fd_ < 0) return;
  // The signals stay blocked: from here on they wait unread and end nothing.
  uv_close(as_handle(&signal_poll_), [](uv_handle_t* h) {
    auto* c = static_cast<Control*>(h->data);
    ::close(c->signal_fd_);
    c->signal_fd_ = -1;
  });
}

void Control::on_signal(int signum) {
  switch (signum) {
    case SIGTERM:
    case SIGINT:
      if (delay_stop(signum)) return;
      if (stop_begun_) {
        spdlog::info("received {} again: closing every session now", signum == SIGINT ? "SIGINT" : "SIGTERM");
        begin_stop(true);
      } else {
        spdlog::info("received {}: graceful stop", signum == SIGINT ? "SIGINT" : "SIGTERM");
        begin_stop(false);
      }
      return;
    case SIGHUP: {
      if (stopping_) {
        spdlog::info("received SIGHUP while stopping: reload ignored");
        return;
      }
      reload("SIGHUP");
      return;
    }
    case SIGUSR1:
      reopen_logs();
      return;
    case SIGUSR2:
      upgrade("SIGUSR2");  // logs why when it is refused
      return;
    default:
      return;
  }
}

ReloadResult Control::reload(std::string_view origin) {
  spdlog::info("received {}: reloading {}", origin, config_path_);
  notify_systemd("RELOADING=1");
  const ReloadResult r = reload_from_file();
  record_reload(origin, r);
  return r;
}

ReloadResult Control::put_config(std::string_view toml) {
  spdlog::info("received PUT /config: validating {} byte(s) for {}", toml.size(), config_path_);
  ReloadResult r;
  // A file without listeners is valid, but an empty upload is a mistake
  // (a wrong path to curl's --data-binary @FILE), not a configuration.
  if (toml.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    r = {false, "PUT /config body is empty: send the whole configuration file"};
    record_reload("PUT /config", r);
    return r;
  }
  // One line that starts with a comment is all comment: what `curl -d
  // @FILE` makes of a file that starts with one (it drops the line
  // breaks). Valid TOML, and it would remove every listener.
  const std::size_t first = toml.find_first_not_of(" \t\r");
  if (toml.find('\n') == std::string_view::npos && toml[first] == '#') {
    r = {false, "PUT /config body:1:" + std::to_string(first + 1) +
                    ": the body is one line that starts with a comment, so it configures nothing"};
    record_reload("PUT /config", r);
    return r;
  }
  std::shared_ptr<const Config> config;
  std::uint64_t outside = 0;
  try {
    // Errors name the body, where the mistake is, not the file on disk.
    Config parsed = parse_config(toml, "PUT /config body");
    parsed.path = config_path_;
    outside = outside_digest(parsed);
    config = std::make_shared<const Config>(std::move(parsed));
  } catch (const ConfigError& e) {
    r = {false, e.what()};
  }
  // Written next to the file first, renamed over it only once the new
  // configuration runs: the file and the running state never disagree. When
  // the configuration path is a symbolic link, the file it points to is
  // replaced and the link stays.
  const std::string target = through_links(config_path_);
  const std::string tmp = target + ".new." + std::to_string(::getpid());
  if (config) {
    notify_systemd("RELOADING=1");
    if (std::string err = write_file_synced(tmp, toml, target); !err.empty()) {
      r = {false, "cannot write " + tmp + ": " + err};
    } else {
      r = apply(std::move(config));
      if (r.ok) {
        config_digest_ = text_digest(toml);
        outside_digest_ = outside;
      }
      r.file_digest = r.ok ? text_digest(toml) : 0;
      if (r.ok && ::rename(tmp.c_str(), target.c_str()) != 0) {
        r.message += "; but replacing " + target + " failed: " + std::strerror(errno) +
                     " (the running configuration differs from the file)";
      }
      ::unlink(tmp.c_str());
    }
  }
  record_reload("PUT /config", r);
  return r;
}

void Control::update_watch() {
  const bool on = snapshot_ && snapshot_->config->global.watch_config && !stopping_;
  if (!watch_) {
    if (!on) return;
    watch_ = std::make_unique<ConfigWatch>(loop_, config_path_, [this] { reload_watched(); });
  }
  watch_->set_enabled(on, config_digest_);
}

void Control::reload_watched() {
  if (stopping_) return;
  spdlog::info("watch_config: {} changed: reloading", config_path_);
  notify_systemd("RELOADING=1");
  const ReloadResult r = reload_from_file();
  record_reload("watch_config", r);
}

void Control::record_reload(std::string_view origin, const ReloadResult& r) {
  if (r.ok) {
    ++reloads_ok_;
    spdlog::info("reload succeeded: {}", r.message);
    if (!r.restart_required.empty()) {
      std::string keys;
      for (const std::string& k : r.restart_required) keys += (keys.empty() ? "" : ", ") + k;
      spdlog::warn("these settings take effect only after a restart: {} (the running values stay until then)", keys);
    }
  } else {
    ++reloads_failed_;
    spdlog::error("reload failed, the running configuration is unchanged: {}", r.message);
  }
  last_reload_ = LastReload{true, r.ok, wall_ms(), std::string(origin), r.message};
  // What this reload read counts as seen: the watch does not load it again,
  // nor retry a bad file before it changes.
  if (watch_) watch_->remember(r.file_digest);
  notify_systemd("READY=1\nSTATUS=" + std::string(r.ok ? "running, configuration generation " : "running; last reload failed, generation ") +
                 std::to_string(generation_));
}

// Servers that start down (role checks, initial = "down") are checked at
// once; the workers, which accept, start only when each has answered or the
// longest check timeout has passed. Clients that connect meanwhile wait in
// the listen backlog, so none reaches a standby because nothing was known.
// The listeners' sockets are already open, so a caller that saw them bound
// is never refused.
void Control::wait_first_checks() {
  const std::size_t waiting = health_->waiting_first();
  if (waiting == 0) return;
  // The timeout ends a check; a little more lets its result arrive on a
  // busy loop.
  const Duration bound = health_->longest_first_wait() + std::chrono::milliseconds(100);
  spdlog::info("waiting up to {} for the first check of {} server(s) before accepting", format_duration(bound),
               waiting);
  struct Wait {
    uv_timer_t timer{};
    bool expired = false;
  };
  auto* w = new Wait;
  uv_timer_init(loop_, &w->timer);
  w->timer.data = w;
  uv_timer_start(&w->timer, [](uv_timer_t* t) { static_cast<Wait*>(t->data)->expired = true; },
                 static_cast<std::uint64_t>(bound.count()), 0);
  const TimePoint started = Clock::now();
  while (!w->expired && health_->waiting_first() > 0) uv_run(loop_, UV_RUN_ONCE);
  const std::size_t left = health_->waiting_first();
  uv_timer_stop(&w->timer);
  uv_close(as_handle(&w->timer), [](uv_handle_t* h) { delete static_cast<Wait*>(h->data); });
  const auto took = std::chrono::duration_cast<Duration>(Clock::now() - started);
  if (left == 0) {
    spdlog::info("first checks answered in {}; accepting", format_duration(took));
  } else {
    spdlog::warn("{} server(s) did not answer their first check within {}; accepting, they stay down until they do",
                 left, format_duration(took));
  }
}

// on_down = "drain": the server is down, so no new session goes there; its
// live sessions end after the upstream's drain_timeout unless it is back up
// by then (then they were never on a failed server for long).
void Control::drain_down(std::shared_ptr<const ServerState> server) {
  const Upstream* up = snapshot_ ? snapshot_->find_upstream(server->upstream) : nullptr;
  Duration timeout = up != nullptr ? up->config().drain_timeout : Duration{0};
  if (timeout.count() <= 0 && snapshot_) timeout = snapshot_->config->global.drain_timeout;
  if (timeout.count() <= 0) {
    spdlog::info("upstream \"{}\" server {} down (on_down = drain): drain_timeout is 0, its sessions continue",
                 server->upstream, server->address.text);
    return;
  }
  spdlog::info("upstream \"{}\" server {} down (on_down = drain): its {} session(s) end after drain_timeout {}",
               server->upstream, server->address.text, server->active.load(std::memory_order_relaxed),
               format_duration(timeout));
  struct DownDrain {
    uv_timer_t timer{};
    Control* control = nullptr;
    std::shared_ptr<const ServerState> server;
  };
  auto* d = new DownDrain{{}, this, std::move(server)};
  uv_timer_init(loop_, &d->timer);
  d->timer.data = d;
  uv_timer_start(&d->timer, [](uv_timer_t* t) {
    auto* dd = static_cast<DownDrain*>(t->data);
    if (!dd->control->stopping_ && dd->server->active_state() == ActiveState::down) {
      const GlobalConfig& g = dd->control->snapshot_->config->global;
      dd->control->close_sessions(dd->server, Cause::server_down, g.close_spread_set ? g.close_spread : Duration{0});
    }
    uv_close(as_handle(t), [](uv_handle_t* h) { delete static_cast<DownDrain*>(h->data); });
  }, static_cast<std::uint64_t>(timeout.count()), 0);
  // While stopping, the timer must not keep the loop alive.
  uv_unref(as_handle(&d->timer));
}

void Control::close_sessions(std::shared_ptr<const ServerState> server, Cause cause, Duration spread) {
  // Sessions still on their way from an old process are in no worker's
  // list yet: they read this as they arrive.
  if (server) server->mark_sessions_ended(uv_hrtime() / 1'000'000, cause);
  for (auto& w : workers_) {
    WorkerCommand c;
    c.kind = WorkerCommand::Kind::close_sessions;
    c.server = server;
    c.cause = cause;
    c.spread = spread;
    w->post(std::move(c));
  }
}

admin::ProcessInfo Control::process_info() const {
  admin::ProcessInfo p;
  p.started_at_ms = service_started_at_ms_;
  p.process_started_at_ms = started_at_ms_;
  p.loaded_at_ms = loaded_at_ms_;
  p.generation = generation_;
  p.config_file = config_path_;
  p.reload_attempted = last_reload_.attempted;
  p.reload_ok = last_reload_.ok;
  p.reload_time_ms = last_reload_.time_ms;
  p.reload_origin = last_reload_.origin;
  p.reload_message = last_reload_.message;
  p.reloads_ok = reloads_ok_;
  p.reloads_failed = reloads_failed_;
  for (const auto& s : sockets_) p.listener_addresses[s->listener] = s->bound;
  p.ready = ready();
  p.not_ready_reason = stopping_             ? "stopping (graceful stop under way)"
                       : delaying_stop_      ? "stopping: shutdown_delay runs before the graceful stop"
                       : healthcheck_failed_ ? "failed by POST /healthcheck/fail"
                                             : "";
  p.ready_since_ms = ready_since_ms_ != 0 ? ready_since_ms_ : started_at_ms_;
  if (discovery_) p.dns = discovery_->status();
  if (sentinels_) sentinels_->add_status(p.dns);
  p.upgrade_state = std::string(to_string(upgrade_state_.state()));
  p.upgrade_message = upgrade_state_.message();
  return p;
}

std::string Control::start_admin(const Config& config) {
  admin_config_ = config.admin;
  if (!config.admin.enabled) return {};
  admin::AdminHooks hooks;
  hooks.snapshot = [this] { return snapshot_; };
  hooks.info = [this] { return process_info(); };
  hooks.reload = [this] {
    if (stopping_) return admin::Outcome{false, "sluice is stopping: reload refused"};
    const ReloadResult r = reload("POST /reload");
    return admin::Outcome{r.ok, r.message, r.restart_required};
  };
  hooks.put_config = [this](std::string_view toml) {
    if (stopping_) return admin::Outcome{false, "sluice is stopping: configuration refused"};
    const ReloadResult r = put_config(toml);
    return admin::Outcome{r.ok, r.message, r.restart_required};
  };
  hooks.close_sessions = [this](std::shared_ptr<const ServerState> server, Cause cause) {
    close_sessions(std::move(server), cause);
  };
  hooks.set_ready = [this](bool ok, const std::string& by) { return set_healthcheck(ok, by); };
  hooks.upgrade = [this] { return upgrade("POST /upgrade"); };
  admin_api_ = std::make_unique<admin::AdminApi>(std::move(hooks));
  admin_token_ = config.admin.token;
  admin_api_->set_token(admin_token_);
  const int inherited = inherited_admin_;
  inherited_admin_ = -1;
  return start_admin_http(inherited);
}

std::string Control::start_admin_http(int inherited) {
  admin_http_ = std::make_unique<admin::HttpServer>(
      loop_, [this](const admin::Request& req) { return admin_api_->handle(req); });
  admin_http_->set_gate([this](const admin::Request& req) { return admin_api_->authorize(req); });
  if (std::string err = admin_http_->listen(admin_config_.listen, inherited); !err.empty()) return "[admin] " + err;
  admin_api_->set_allowed_hosts(admin::allowed_hosts(admin_config_, admin_http_->bound_port()));
  spdlog::info("admin API listening on {}", admin_http_->bound());
  return {};
}

void Control::pin_threads() {
  control_cpu_ = snapshot_ ? snapshot_->config->global.control_cpu : -1;
  const AffinityPlan plan = plan_affinity(control_cpu_, allowed_cpus());
  if (plan.message.empty()) return;
  if (!plan.apply) {
    spdlog::warn("{}", plan.message);
    return;
  }
  std::vector<pthread_t> threads;
  for (auto& w : workers_) threads.push_back(w->native_handle());
  if (std::string err = apply_affinity(plan, threads); !err.empty()) {
    spdlog::warn("control_cpu: {}", err);
    return;
  }
  spdlog::info("control_cpu: {}", plan.message);
}

void Control::notify_systemd(const std::string& state) {
  // A no-op unless started by systemd with Type=notify (NOTIFY_SOCKET set).
  // Once a new binary serves, it is the main PID: this one's STOPPING=1
  // would stop the service.
  if (mainpid_moved_) return;
  sd_notify(0, state.c_str());
}

void Control::reopen_logs() {
  // Logged first, so the line lands in the old error log file when that is
  // one of the files being rotated.
  spdlog::info("received SIGUSR1: reopening log files");
  const std::size_t n = reopen_log_files();
  spdlog::info("reopened {} log file(s)", n);
}

void Control::on_tick(uv_timer_t* t) {
  auto* c = static_cast<Control*>(t->data);
  c->log_drops_.tick();
  if (c->admin_api_) c->admin_api_->tick(Clock::now());  // the status page's rates
  // A wait queue is served when a slot frees; a server that comes back up
  // (a check, the end of a passive down period, an admin enable) frees
  // none, so its waiters are looked at here too, at most a second later.
  if (c->snapshot_) {
    for (const auto& [name, up] : c->snapshot_->upstreams) {
      if (WaitQueue* q = up->queue()) q->serve(Clock::now());
    }
  }
  c->watch_outages(Clock::now());
}

// Once a second, not on the pick path: a pick is per worker and hot, and a
// pool nobody sends to would never notice. An outage shorter than a second
// may go unannounced; its clients' no_server closes are still counted.
void Control::watch_outages(TimePoint now) {
  if (!snapshot_ || stopping_) return;
  std::set<std::string> names;
  for (const auto& [name, up] : snapshot_->upstreams) {
    names.insert(name);
    const Availability a = availability(*up, now);
    std::string note;
    if (const FallbackLink* f = snapshot_->fallback_of(up.get())) {
      note = "its sessions go to fallback \"" + f->to->name() + "\"";
    } else if (a.unavailable.count("full") != 0 && up->queue() != nullptr) {
      note = "new clients wait in its queue";
    } else if (up->config().all_down == AllDown::fail_open && a.servers != 0) {
      note = "all_down = \"fail_open\": health is ignored until one is back";
    }
    if (auto line = outages_.observe(name, a, now, note)) {
      if (line->warning) {
        spdlog::warn("{}", line->text);
      } else {
        spdlog::info("{}", line->text);
      }
    }
  }
  outages_.keep_only(names);
}

void Control::begin_stop(bool now) {
  stop_begun_ = true;
  upgrade_stop_begun();
  if (!stopping_) {
    stopping_ = true;
    notify_systemd("STOPPING=1");
    // The remaining handles must not keep the control loop alive once the
    // workers are done; signals stay handled meanwhile (a HUP or USR1 during
    // the drain must not kill the process).
    uv_unref(as_handle(&signal_poll_));
    uv_unref(as_handle(&tick_));
    update_watch();  // off: a stopping process reloads nothing
  }
  // Nothing is accepted any more: no socket may stay open (and fill its
  // queue) behind the workers' backs.
  for (auto& s : sockets_) s->close_dups();
  for (auto& w : workers_) {
    w->post(WorkerCommand::of(now ? WorkerCommand::Kind::stop_now : WorkerCommand::Kind::stop));
  }
}

void Control::set_ready_changed() { ready_since_ms_ = wall_ms(); }

admin::Outcome Control::set_healthcheck(bool ok, const std::string& by) {
  if (ok && (stopping_ || delaying_stop_)) {
    return {false, "sluice is stopping: it stays not ready (POST /healthcheck/ok refused)"};
  }
  const bool was = ready();
  healthcheck_failed_ = !ok;
  if (ready() != was) {
    set_ready_changed();
    spdlog::info("admin: readiness {} by POST /healthcheck/{} from {}; listeners and live sessions unchanged",
                 ok ? "on" : "off", ok ? "ok" : "fail", by);
  }
  return {true, ready() ? "ready: GET /ready answers 200" : "not ready: GET /ready answers 503"};
}

bool Control::delay_stop(int signum) {
  const char* name = signum == SIGINT ? "SIGINT" : "SIGTERM";
  if (stopping_) return false;
  if (delaying_stop_) {
    // A second signal: the operator (or an orchestrator's kill) does not
    // want to wait for the rest of the delay.
    spdlog::info("received {} again during shutdown_delay: graceful stop begins now", name);
    delaying_stop_ = false;
    uv_timer_stop(&shutdown_delay_timer_);
    uv_close(as_handle(&shutdown_delay_timer_), nullptr);
    return false;
  }
  const Duration delay = snapshot_ ? snapshot_->config->global.shutdown_delay : Duration{0};
  if (delay.count() <= 0) {
    if (ready()) set_ready_changed();  // the stop the caller begins makes it 503
    return false;
  }
  const bool was = ready();
  delaying_stop_ = true;
  if (was) set_ready_changed();
  spdlog::info("received {}: not ready (GET /ready answers 503); listeners keep accepting for shutdown_delay {} "
               "before the graceful stop (send it again not to wait)",
               name, format_duration(delay));
  notify_systemd("STATUS=stopping: not ready, listeners open for shutdown_delay " + format_duration(delay));
  uv_timer_init(loop_, &shutdown_delay_timer_);
  shutdown_delay_timer_.data = this;
  uv_timer_start(&shutdown_delay_timer_, [](uv_timer_t* t) {
    auto* c = static_cast<Control*>(t->data);
    c->delaying_stop_ = false;
    uv_close(as_handle(t), nullptr);
    spdlog::info("shutdown_delay over: graceful stop begins");
    c->begin_stop(false);
  }, static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(delay).count()), 0);
  return true;
}

void Control::on_stopped_async(uv_async_t* a) {
  auto* c = static_cast<Control*>(a->data);
  for (auto& w : c->workers_) {
    if (!w->finished()) return;
  }
  c->on_workers_stopped();
}

void Control::on_workers_stopped() {
  if (handles_closed_) return;
  handles_closed_ = true;
  // What is left is writing out the log and exiting: the handled signals are
  // no longer read (and, blocked, still end nothing).
  close_signal_fd();
  uv_close(as_handle(&tick_), nullptr);
  if (health_) health_->stop([] {});
  if (discovery_) discovery_->stop([] {});
  if (sentinels_) sentinels_->stop();
  if (watch_) watch_->close([] {});
  if (admin_http_) admin_http_->close([] {});  // else closed at the hand-over
  close_upgrade();
  uv_close(as_handle(&stopped_async_), nullptr);
}

}  // namespace sluice
