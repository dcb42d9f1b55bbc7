// The control loop (the main thread): signals, configuration loads and
// reloads, and later the admin API and active health checks. It owns the
// Registry and the current Snapshot, opens and closes listening sockets, and
// talks to workers only through their mailboxes. It never touches a data
// socket.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <unistd.h>
#include <uv.h>

#include "admin/admin_api.hpp"
#include "control/upgrade_state.hpp"
#include "admin/http_server.hpp"
#include "control/config_watch.hpp"
#include "discovery/discovery.hpp"
#include "discovery/sentinel.hpp"
#include "health/checker.hpp"
#include "log/logging.hpp"
#include "runtime/registry.hpp"
#include "runtime/snapshot.hpp"
#include "sluice/config.hpp"
#include "upstream/availability.hpp"
#include "upgrade/counts.hpp"

namespace sluice {

namespace upgrade {
class Channel;
}

class Worker;

struct ReloadResult {
  ReloadResult() = default;
  ReloadResult(bool ok_, std::string message_, std::vector<std::string> restart_required_ = {})
      : ok(ok_), message(std::move(message_)), restart_required(std::move(restart_required_)) {}

  bool ok = false;
  std::string message;  // the error (file:line:column: ...), or what changed
  // Settings the file changes that take effect only at the next start
  // ("global.workers", "admin", "admin.listen", "admin.token_file"); their
  // running values stay until then.
  std::vector<std::string> restart_required;
  // The digest (ConfigWatch::digest) of the file content this reload read,
  // or wrote for PUT /config; 0 when it read none. What watch_config then
  // counts as seen.
  std::uint64_t file_digest = 0;
};

class Control {
 public:
  // Blocks the signals the control loop handles (SIGTERM, SIGINT, SIGHUP,
  // SIGUSR1) in the calling thread. Call it before any other thread starts:
  // every thread inherits the block and it is never lifted, so no handler
  // ever runs and none of them can end the process. The control loop reads
  // them from a signalfd instead, one at a time in its own turn; one that
  // comes while sluice starts waits there until the loop runs.
  static void block_signals();

  Control(std::string config_path, std::shared_ptr<const Config> config);

  // A binary upgrade (src/control/upgrade.cpp). The command a new binary is
  // started with: the executable's path as this process was started (an
  // absolute path, resolved once at start: the file there is the newly
  // installed one, whatever this process runs), its arguments, and the
  // working directory they are relative to.
  void set_command(std::string exe, std::vector<std::string> args, std::string cwd);
  // This process was started by an upgrade: `fd` is its end of the
  // hand-over channel. start() takes the listening sockets over it.
  void set_upgrade_channel(int fd);
  // SIGUSR2, POST /upgrade: starts the new binary and hands over to it.
  // Returns at once; refused (and logged, with the reason) when one is
  // under way, when this process is still receiving sessions from the one
  // it took over from, or when sluice is stopping.
  admin::Outcome upgrade(std::string_view origin);
  ~Control();
  Control(const Control&) = delete;
  Control& operator=(const Control&) = delete;

  // Opens the listeners, starts the workers and runs the control loop until
  // a graceful stop has finished. Returns the process exit status.
  int run();

  // Reads and applies the configuration file. On any error the running
  // configuration stays in place.
  ReloadResult reload_from_file();
  // Applies an already validated configuration.
  ReloadResult apply(std::shared_ptr<const Config> config);
  // A reload asked for by `origin` ("SIGHUP", "POST /reload"): reads the
  // file, applies it, logs the outcome, tells systemd, and records it.
  ReloadResult reload(std::string_view origin);

  // Validates `toml` (errors name the configuration file and the body's
  // line:column), applies it, and on success replaces the file atomically
  // (so a restart comes back the same). Logged and recorded like a reload.
  ReloadResult put_config(std::string_view toml);

  struct LastReload {
    bool attempted = false;
    bool ok = false;
    std::int64_t time_ms = 0;  // wall clock
    std::string origin;        // "SIGHUP", "POST /reload", "PUT /config"
    std::string message;
  };
  const LastReload& last_reload() const { return last_reload_; }
  std::uint64_t generation() const { return generation_; }
  const std::string& config_path() const { return config_path_; }

  const std::shared_ptr<const Snapshot>& snapshot() const { return snapshot_; }
  Registry& registry() { return registry_; }

 private:
  // One listening address, with one socket per worker (owned by the workers
  // once handed over). Kept across reloads while some listener still uses the
  // same address, so a reload never refuses a connection.
  struct Socket {
    std::uint64_t id = 0;
    std::string key;       // resolved address, or "name:NAME" for port 0
    std::string bound;     // "127.0.0.1:40123"
    std::string listener;  // the listener (by name) that uses it now
    // Duplicates of the workers' sockets, so that a binary upgrade can hand
    // them over; closed with the socket (a reload that drops it, a stop).
    std::vector<int> dups;

    void close_dups() {
      for (int fd : dups) ::close(fd);
      dups.clear();
    }
    ~Socket() { close_dups(); }
  };
  struct Upgrade;
  friend struct Upgrade;
  struct Drain;  // a removed server's drain_timeout

  // ---- binary upgrade (upgrade.cpp) ----
  // The new process: hello, then the listening sockets, the servers' state,
  // the service's figures until "go". Returns "" or why the hand-over failed.
  std::string receive_handover();
  // The new process, serving: writes the pid_file, tells systemd and the
  // old process; accepts once the old one has stopped accepting.
  void announce_takeover();
  // apply(): the sockets for `key` handed over by the old process, if any.
  bool take_inherited(const ListenerConfig& l, const std::string& key, std::vector<int>& fds, std::string& bound);
  // The old process: the new one has taken over.
  void on_taken_over(Upgrade& u);
  // The old process: the upgrade is given up before the new process took
  // over; this process serves on.
  void upgrade_failed(Upgrade& u, const std::string& why);
  void on_upgrade_message(Upgrade& u);
  // The old process, on the new one's hello: the listening sockets, what
  // the service and each server have done, the rate-limit buckets, the
  // counts, the admin socket, then "go". Returns "" or the send error.
  std::string send_handover(int fd);
  // The old process, every few milliseconds of the hand-over: reports its
  // figures, lets the new process accept once no worker here does, and
  // ends the hand-over once no session is left.
  void on_handover_tick(Upgrade& u);
  // The old process: upgrade_finish_timeout has passed.
  void on_finish_deadline(Upgrade& u);
  // The old process: the new one died (or is stopping) during the
  // hand-over. Sessions it has not acknowledged stay here; with `serve`
  // (and no stop under way) this process accepts again.
  void take_back(Upgrade& u, const std::string& why, bool serve);
  void serve_again();
  // A graceful stop began: an upgrade not yet taken over is given up; a
  // new process still receiving tells the old one (which stops too) and
  // starts its workers if they wait (the stop needs them).
  void upgrade_stop_begun();
  void write_pid_file();
  // At the end: closes what an upgrade still holds open on the loop.
  void close_upgrade();
  // The new process: stops reading the channel and reporting on it.
  void close_takeover();
  // The new process: what the old one sends once this one serves
  // (sessions, its figures, "released"), until it has gone.
  void on_handed_sessions();
  // The new process: the old one has gone; the hand-over is over.
  void finish_receiving();
  void start_workers();
  // [global] control_cpu, once the workers run (affinity.hpp).
  void pin_threads();
  // The new process, at its first apply(): what the old one knew of each
  // server (active-check state, drain/disable, runtime weight, history),
  // before the health checks start from it.
  void restore_servers();
  // The old process: the client_rate_limit buckets that are not full, a
  // few hundred per "client" message. Returns "" or the send error.
  std::string send_client_buckets(int fd);
  // The new process: one "client" message's buckets into the listener of
  // that name. Returns "" or what is wrong with the message.
  std::string restore_client_buckets(const std::vector<std::string>& fields);
  // The old process: what the service has done (start time, configuration
  // generation, reloads), for the new one to go on from.
  upgrade::Message service_message() const;
  void restore_service(const std::vector<std::string>& fields);
  // Both: this process's own figures (see upgrade/counts.hpp): with `all`,
  // every one the new process takes over (old -> new); else only the
  // servers' active counts (new -> old, for the picks the old process
  // still makes).
  std::vector<upgrade::Figure> own_figures(bool all) const;
  // Both: sends what changed of own_figures(all) since `sent`.
  // `wait`: block up to the send timeout for room; otherwise a full
  // channel skips this report (the next one says it all again).
  std::string report_figures(int fd, bool all, upgrade::Tally& sent, bool wait) const;
  // Both: the other process's figures, counted with this one's.
  void fold_in(const std::vector<upgrade::Figure>& figures);
  // Both: the other process has gone: its gauges leave this one's counts.
  void drop_remote();
  // After a failed upgrade: names this process again in pid_file (the new
  // one may have named itself before it failed).
  void reclaim_pid_file();
  void remove_pid_file();

  bool start();
  void begin_stop(bool now);
  void on_workers_stopped();
  void reopen_logs();
  void notify_systemd(const std::string& state);
  void drain_removed(const Snapshot& before, const Snapshot& after);
  void record_reload(std::string_view origin, const ReloadResult& r);
  // [global] watch_config as the running configuration says: starts or
  // stops watching the file.
  void update_watch();
  // The watched file's content changed: a reload, logged as SIGHUP's.
  void reload_watched();
  // A reload's [admin]: which token is in force, and what waits for a
  // restart (appended to both lists: keys, and keys with the running value).
  void apply_admin_changes(const AdminConfig& a, std::vector<std::string>& restart_required,
                           std::vector<std::string>& waiting);
  // Starts the admin API when the configuration has one. Returns an error or "".
  std::string start_admin(const Config& config);
  // Its HTTP server, on `inherited` (a socket already listening, or -1).
  std::string start_admin_http(int inherited);
  admin::ProcessInfo process_info() const;
  // Every worker ends the sessions on `server` (every session when null)
  // with `cause`, one by one over `spread` from now, or at once when it is
  // 0. The one way to close many sessions together: a deadline that does
  // (the end of a drain_timeout, of a binary upgrade's wait) passes
  // [global] close_spread; an operator's "now" (admin disable, a second
  // SIGTERM) and a dead server (on_down = "close_sessions") pass 0. The end
  // of shutdown_timeout is each worker's own (Worker::on_shutdown_timer),
  // with the same spread.
  void close_sessions(std::shared_ptr<const ServerState> server, Cause cause, Duration spread = Duration{0});
  // Before the workers accept: runs the loop until every server that starts
  // down has answered its first check, or the longest check timeout passed.
  void wait_first_checks();
  // on_down = "drain": closes the server's sessions after drain_timeout.
  void drain_down(std::shared_ptr<const ServerState> server);

  // Readiness for a front tier (GET /ready, POST /healthcheck/*).
  bool ready() const { return !healthcheck_failed_ && !delaying_stop_ && !stopping_; }
  void set_ready_changed();
  admin::Outcome set_healthcheck(bool ok, const std::string& by);
  // On SIGTERM/SIGINT with [global] shutdown_delay: turns readiness off and
  // keeps the listeners open for the delay, then begins the graceful stop.
  // Returns true when the signal is taken care of (the delay began);
  // false when the caller should begin the stop now (no delay, or a second
  // signal during it).
  bool delay_stop(int signum);
  // DNS discovery: started with the first configuration, which waits (a
  // bounded time) for the first answers so that the first Snapshot has
  // their servers.
  void start_discovery(const Config& config);
  // The file's configuration with the servers DNS and the sentinels give now.
  std::shared_ptr<const Config> with_discovered(const std::shared_ptr<const Config>& config) const;
  // After apply(): discovery follows the file's entries and [resolver].
  void configure_discovery(const std::shared_ptr<const Config>& config);
  // DNS changed an upstream's servers: a new Snapshot of the same file,
  // posted like a reload's (servers that stay keep their state, removed
  // ones drain), with no listener change.
  void apply_discovered();
  // Redis Sentinel: started with the first configuration, waiting (a
  // bounded time) for the masters.
  void start_sentinels(const Config& config);
  // Closes the sessions of the masters the sentinels replaced since the
  // last call (servers of `before`).
  void close_replaced_masters(const Snapshot& before);
  // One writer (one_writer.cpp): a sentinel announced a failover away from
  // master `address` of `upstream` (fence), or it did not happen.
  void sentinel_fence(const std::string& upstream, const std::string& address, bool fence, const std::string& by,
                      const std::string& reason);
  // A failover fence handed over by the previous process: this process's
  // sentinels did not see the failover begin, so the fence is lifted after
  // kPromotionWait unless the master has changed by then.
  void expire_failover_fence(std::shared_ptr<ServerState> state);
  // Hands the servers that may take sessions again to the clients waiting
  // in upstream `name`'s queue.
  void serve_queue(const std::string& name);
  // `snapshot_` is the one the workers use from now on.
  void snapshot_is_current();

  static void on_signal_fd(uv_poll_t* h, int status, int events);
  void on_signal(int signum);
  void close_signal_fd();
  static void on_stopped_async(uv_async_t* a);
  static void on_tick(uv_timer_t* t);
  // The tick's look at every upstream: one warning when one has no server
  // left to take a session, one line when it has again.
  void watch_outages(TimePoint now);

  std::string config_path_;
  std::shared_ptr<const Config> initial_;
  uv_loop_t* loop_;
  Registry registry_;
  std::shared_ptr<const Snapshot> snapshot_;
  std::uint64_t generation_ = 0;
  unsigned nworkers_ = 0;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::unique_ptr<Socket>> sockets_;
  std::uint64_t next_socket_id_ = 1;
  int signal_fd_ = -1;          // signalfd of the blocked, handled signals
  uv_poll_t signal_poll_{};
  uv_async_t stopped_async_{};
  uv_timer_t tick_{};           // once a second: housekeeping (dropped log records)
  DropReporter log_drops_;
  OutageTracker outages_;
  bool stopping_ = false;
  LastReload last_reload_;
  std::uint64_t reloads_ok_ = 0;
  std::uint64_t reloads_failed_ = 0;
  std::int64_t started_at_ms_ = 0;
  std::int64_t loaded_at_ms_ = 0;
  std::unique_ptr<admin::AdminApi> admin_api_;
  std::unique_ptr<admin::HttpServer> admin_http_;
  AdminConfig admin_config_;  // what the running admin API was started with
  std::string admin_token_;   // the token in force (empty: none)
  std::unique_ptr<HealthChecker> health_;  // active checks, on this loop
  std::unique_ptr<discovery::Discovery> discovery_;  // servers from DNS, on this loop
  std::unique_ptr<discovery::Sentinels> sentinels_;  // masters from Redis Sentinel, on this loop
  std::unique_ptr<ConfigWatch> watch_;                // made when watch_config is first on
  std::shared_ptr<const Config> file_config_;        // the running configuration as the file says
  bool handles_closed_ = false;
  bool healthcheck_failed_ = false;  // POST /healthcheck/fail, until /healthcheck/ok
  bool delaying_stop_ = false;       // SIGTERM came; shutdown_delay runs before the stop
  std::int64_t ready_since_ms_ = 0;
  uv_timer_t shutdown_delay_timer_{};  // initialised only while delaying_stop_
  int exit_status_ = 0;

  // Binary upgrade.
  UpgradeMachine upgrade_state_;
  std::string exe_;
  std::vector<std::string> args_;
  std::string cwd_;
  std::vector<Upgrade*> upgrades_;  // each deletes itself once its handles have closed
  // The old process: the new one is the main PID (systemd) from its
  // "ready" on, until the upgrade fails.
  bool mainpid_moved_ = false;
  bool stop_begun_ = false;         // SIGTERM/SIGINT (or the new process stopping): a graceful stop
  int admin_dup_ = -1;              // the old process: the admin API's socket during a hand-over
  std::vector<std::unique_ptr<admin::HttpServer>> retired_admin_;  // closing; freed with the loop
  std::shared_ptr<upgrade::Channel> takeover_;  // the new process's end of the channel
  std::map<std::string, std::vector<int>> inherited_;  // socket key -> sockets handed over
  int inherited_admin_ = -1;
  std::vector<std::vector<std::string>> inherited_servers_;  // "server" messages' fields
  std::vector<upgrade::Figure> inherited_figures_;  // "counts" before the first Snapshot
  std::vector<std::string> inherited_service_;      // the "service" message's fields
  std::uint64_t buckets_restored_ = 0;  // client_rate_limit buckets carried over
  uv_poll_t takeover_poll_{};       // the channel, once this process serves
  bool takeover_poll_open_ = false;
  uv_timer_t takeover_timer_{};     // reports to the old process while receiving
  bool takeover_timer_open_ = false;
  TimePoint takeover_since_{};
  bool workers_started_ = false;
  int predecessor_ = 0;             // the old process's PID
  unsigned next_adopter_ = 0;
  std::uint64_t sessions_adopted_ = 0;
  upgrade::Tally sent_;             // the new process: what it last reported
  // The other process's figures folded into this one's counters, and the
  // server state each server gauge went into (a reload may replace it).
  upgrade::Tally remote_;
  std::map<std::string, std::weak_ptr<ServerState>> remote_servers_;
  std::string pid_file_;            // the one this process wrote
  std::int64_t service_started_at_ms_ = 0;  // the first process's start (upgrades carry it over)
  std::uint64_t config_digest_ = 0;  // of the configuration text in force
  std::uint64_t outside_digest_ = 0;  // of what loading it read beyond its text (outside_digest)
  int control_cpu_ = -1;  // as applied at start (pin_threads)
};

}  // namespace sluice
