#include "health/mysql_probe.hpp"

#include <errmsg.h>
#include <mysqld_error.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <string_view>

#include "health/match.hpp"
#include "sluice/address.hpp"

namespace sluice::health {

namespace {

// Wrong-mode servers answer the same few ways; anything else is not ON.
bool is_on(const char* value) {
  if (value == nullptr) return false;
  std::string v(value);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return v == "ON" || v == "1" || v == "TRUE" || v == "YES";
}

std::optional<long long> to_integer(const char* value) {
  if (value == nullptr || *value == '\0') return std::nullopt;
  char* end = nullptr;
  const long long n = std::strtoll(value, &end, 10);
  if (end == nullptr || *end != '\0') return std::nullopt;
  return n;
}

// The replication status query for servers that know the new name
// (MariaDB 10.5, MySQL 8.0.22) and for older ones.
constexpr const char* kReplicaStatus = "SHOW REPLICA STATUS";
constexpr const char* kSlaveStatus = "SHOW SLAVE STATUS";
constexpr const char* kVariables =
    "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('read_only', 'super_read_only')";
constexpr const char* kGalera = "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_local_state', 'wsrep_ready')";
// The transactions the server has, for one writer (docs/health.md): MariaDB
// names its GTID position gtid_current_pos, MySQL its set gtid_executed.
constexpr const char* kMariadbGtid = "SELECT @@GLOBAL.gtid_current_pos";
constexpr const char* kMysqlGtid = "SELECT @@GLOBAL.gtid_executed";

bool is_gtid_query(const std::string& q) { return q == kMariadbGtid || q == kMysqlGtid; }

bool needs_replica_status(const HealthConfig& c) {
  return c.mysql_role == MysqlRole::replica || c.max_lag.count() > 0;
}

// The only authentication plugins a check logs in with. The server picks
// the plugin (in its greeting or by an AuthSwitchRequest), and others would
// hand the password over in clear text (mysql_clear_password, dialog's
// password question) or have Connector/C read the answer to a server's
// question from standard input on the control thread (dialog).
constexpr const char* kAllowedAuth = "mysql_native_password,caching_sha2_password,client_ed25519";

// Why a login was refused for its plugin: the plugin's name when the
// check saw the AuthSwitchRequest (`switched`; only name characters, as it
// is the server's bytes), else what such plugins are.
std::string refused_plugin_reason(const std::string& switched) {
  std::string name;
  for (char c : switched.substr(0, 64)) {
    if (std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '-' || c == '.') name += c;
  }
  for (std::string_view allowed : {"mysql_native_password", "caching_sha2_password", "client_ed25519"}) {
    if (name == allowed) name.clear();
  }
  const std::string what = name.empty() ? "an authentication plugin other than mysql_native_password, "
                                          "caching_sha2_password and client_ed25519 (such as mysql_clear_password or "
                                          "dialog)"
                                        : "authentication plugin \"" + name + "\"";
  return "the server asked for " + what + ", which is not allowed: no plugin may send the password in clear text "
         "or read a terminal";
}

}  // namespace

std::pair<bool, std::string> judge_mysql(const MysqlFacts& f, const HealthConfig& c) {
  if (c.galera) {
    if (!f.wsrep_local_state || !f.wsrep_ready) return {false, "not a Galera node (no wsrep status)"};
    if (*f.wsrep_local_state != 4 || !*f.wsrep_ready) {
      return {false, "Galera node not synced (wsrep_local_state " + std::to_string(*f.wsrep_local_state) +
                         ", wsrep_ready " + (*f.wsrep_ready ? "ON" : "OFF") + ")"};
    }
  }
  const bool writable = !f.read_only && !f.super_read_only;
  const std::string role = writable ? "primary" : "replica";
  std::string reason = "role is " + role;
  if (f.super_read_only && !writable) reason += " (super_read_only)";
  switch (c.mysql_role) {
    case MysqlRole::primary:
      if (!writable) return {false, reason + ", want primary"};
      return {true, reason};
    case MysqlRole::replica:
      if (writable) return {false, reason + " (read_only is off), want replica"};
      break;
    case MysqlRole::any:
      break;
  }
  if (f.replicating && !f.lag_seconds && needs_replica_status(c)) {
    return {false, reason + ", replication is not running (Seconds_Behind_Master is NULL)"};
  }
  if (c.max_lag.count() > 0) {
    const long long max_s = std::chrono::duration_cast<std::chrono::seconds>(c.max_lag).count();
    if (!f.replicating) {
      // A writable server under role = "any" needs no replication; a
      // read-only one that replicates from no one serves stale data.
      if (writable) return {true, reason};
      return {false, reason + ", but replicates from no one"};
    }
    if (*f.lag_seconds > max_s) {
      return {false, reason + ", " + std::to_string(*f.lag_seconds) + "s behind (max_lag " + std::to_string(max_s) +
                         "s)"};
    }
    reason += ", " + std::to_string(*f.lag_seconds) + "s behind";
  }
  return {true, reason};
}

MysqlProbe::~MysqlProbe() { abort(); }

void MysqlProbe::begin() {
  password_.clear();
  if (!read_password(password_)) return;
  facts_ = MysqlFacts{};
  facts_gtid_.clear();
  tried_old_status_ = false;
  switched_plugin_.clear();
  queries_.assign({kVariables});
  if (needs_replica_status(config_)) queries_.emplace_back(kReplicaStatus);
  if (config_.galera) queries_.emplace_back(kGalera);
  if (wants_one_writer(config_)) queries_.emplace_back(kMariadbGtid);
  query_index_ = 0;

  mysql_ = mysql_init(nullptr);
  if (mysql_ == nullptr) {
    finish(Verdict::local_error, "out of memory");
    return;
  }
  // Non-blocking mode; our timer bounds the whole check, so the library's
  // own timeouts stay unset. No option file is read (mysql_init reads none
  // unless asked), and the address is numeric: no DNS lookup here.
  mysql_options(mysql_, MYSQL_OPT_NONBLOCK, nullptr);
  const unsigned int tcp = MYSQL_PROTOCOL_TCP;
  mysql_options(mysql_, MYSQL_OPT_PROTOCOL, &tcp);
  // The library sizes its buffer from a packet's header before the bytes
  // arrive (up to 1 GiB by default once logged in; 1 MiB during the login):
  // after the login, a packet over the cap fails at its header.
  const std::size_t max_packet = kMaxReplyBytes;
  // Never log in without the plugin restriction: a library that does not
  // know the option is refused rather than trusted.
  if (mysql_options(mysql_, MYSQL_OPT_MAX_ALLOWED_PACKET, &max_packet) != 0 ||
      mysql_options(mysql_, MARIADB_OPT_RESTRICTED_AUTH, kAllowedAuth) != 0) {
    finish(Verdict::local_error, "this MariaDB Connector/C cannot restrict authentication plugins or packet sizes");
    return;
  }
  // The library keeps these pointers until the connect completes.
  host_ = format_ip(reinterpret_cast<const sockaddr*>(&target_.addr));
  step_ = Step::connect;
  MYSQL* connected = nullptr;
  const int status = mysql_real_connect_start(&connected, mysql_, host_.c_str(), config_.user.c_str(),
                                              password_.empty() ? nullptr : password_.c_str(), nullptr,
                                              target_.port, nullptr, 0);
  if (status == 0 && connected == nullptr) {
    fail_with_library("");
    return;
  }
  wait_or_continue(status);
}

void MysqlProbe::abort() {
  // The poll handle stops at uv_close, before the library closes the socket.
  HandleTracker::close(poll_);
  poll_ = nullptr;
  if (mysql_ != nullptr) {
    // mysql_close() says goodbye (COM_QUIT) before it frees the handle; a
    // server that stopped reading must not hold the control loop there, so
    // the socket is shut first and that write fails at once.
    const my_socket fd = mysql_get_socket(mysql_);
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    mysql_close(mysql_);
    mysql_ = nullptr;
  }
  password_.clear();
}

void MysqlProbe::wait_or_continue(int status) {
  if (!in_flight()) return;
  if (status == 0) {
    advance(0);
    return;
  }
  int events = 0;
  if ((status & MYSQL_WAIT_READ) != 0) events |= UV_READABLE;
  if ((status & MYSQL_WAIT_WRITE) != 0) events |= UV_WRITABLE;
  if ((status & MYSQL_WAIT_EXCEPT) != 0) events |= UV_PRIORITIZED;
  if (events == 0) events = UV_READABLE;  // only MYSQL_WAIT_TIMEOUT: our timer covers it
  if (poll_ == nullptr) {
    poll_ = handles_.add(new Poll(this));
    const int rc = uv_poll_init_socket(loop_, &poll_->uv, mysql_get_socket(mysql_));
    if (rc < 0) {
      handles_.forget(poll_);
      poll_ = nullptr;
      finish(failed_with(rc), std::string("cannot watch the socket: ") + uv_strerror(rc));
      return;
    }
  }
  const int rc = uv_poll_start(&poll_->uv, events, &MysqlProbe::on_poll);
  if (rc < 0) finish(failed_with(rc), std::string("cannot watch the socket: ") + uv_strerror(rc));
}

void MysqlProbe::on_poll(uv_poll_t* h, int status, int events) {
  Poll* rec = Poll::of(h);
  if (rec->closing) return;
  MysqlProbe* self = rec->owner;
  int ready = 0;
  if ((events & UV_READABLE) != 0) ready |= MYSQL_WAIT_READ;
  if ((events & UV_WRITABLE) != 0) ready |= MYSQL_WAIT_WRITE;
  if ((events & UV_PRIORITIZED) != 0) ready |= MYSQL_WAIT_EXCEPT;
  // An error on the socket is the library's to diagnose on its next read.
  if (status < 0 || ready == 0) ready = MYSQL_WAIT_READ | MYSQL_WAIT_WRITE;
  if (self->step_ == Step::connect && (ready & MYSQL_WAIT_READ) != 0) self->peek_auth_switch();
  self->advance(ready);
  // The library buffers whole results: bound what the server may send.
  if (self->in_flight() && self->mysql_ != nullptr) self->over_reply_cap(mysql_get_socket(self->mysql_));
}

// One more turn of the step in flight; `ready` is 0 when the step finished
// inside its *_start call.
void MysqlProbe::advance(int ready) {
  switch (step_) {
    case Step::connect: {
      MYSQL* connected = mysql_;
      if (ready != 0) {
        const int status = mysql_real_connect_cont(&connected, mysql_, ready);
        if (status != 0) {
          wait_or_continue(status);
          return;
        }
      }
      if (connected == nullptr) {
        fail_with_library("");
        return;
      }
      start_query();
      return;
    }
    case Step::query: {
      int err = 0;
      if (ready != 0) {
        const int status = mysql_real_query_cont(&err, mysql_, ready);
        if (status != 0) {
          wait_or_continue(status);
          return;
        }
      } else {
        err = mysql_errno(mysql_) != 0 ? 1 : 0;
      }
      if (err != 0 && is_gtid_query(queries_[query_index_])) {
        // No GTID position to read (an old server, a privilege): the
        // verdict stands; one writer then keeps the serving server.
        next_query_or_finish();
        return;
      }
      if (err != 0) {
        const bool old_server = mysql_errno(mysql_) == ER_PARSE_ERROR &&
                                queries_[query_index_] == kReplicaStatus && !tried_old_status_;
        if (old_server) {
          tried_old_status_ = true;
          queries_[query_index_] = kSlaveStatus;
          start_query();
          return;
        }
        fail_with_library("query failed: ");
        return;
      }
      start_store();
      return;
    }
    case Step::store: {
      MYSQL_RES* res = nullptr;
      const int status = mysql_store_result_cont(&res, mysql_, ready);
      if (status != 0) {
        wait_or_continue(status);
        return;
      }
      read_rows(res);
      return;
    }
  }
}

void MysqlProbe::start_query() {
  step_ = Step::query;
  if (queries_[query_index_] == kMariadbGtid) {
    const char* version = mysql_get_server_info(mysql_);
    if (version == nullptr || std::string_view(version).find("MariaDB") == std::string_view::npos) {
      queries_[query_index_] = kMysqlGtid;
    }
  }
  const std::string& q = queries_[query_index_];
  int err = 0;
  const int status = mysql_real_query_start(&err, mysql_, q.data(), q.size());
  if (status != 0) {
    wait_or_continue(status);
    return;
  }
  if (err != 0) {
    // Decided inside the start call: let advance() classify it.
    advance(0);
    return;
  }
  start_store();
}

void MysqlProbe::start_store() {
  step_ = Step::store;
  MYSQL_RES* res = nullptr;
  const int status = mysql_store_result_start(&res, mysql_);
  if (status != 0) {
    wait_or_continue(status);
    return;
  }
  read_rows(res);
}

void MysqlProbe::read_rows(MYSQL_RES* res) {
  if (res == nullptr) {
    fail_with_library("query failed: ");
    return;
  }
  const std::string& q = queries_[query_index_];
  if (is_gtid_query(q)) {
    MYSQL_ROW row = mysql_fetch_row(res);
    if (row != nullptr && mysql_num_fields(res) >= 1 && row[0] != nullptr) facts_gtid_ = row[0];
  } else if (q == kReplicaStatus || q == kSlaveStatus) {
    // One row per replication connection; the default one is first.
    MYSQL_ROW row = mysql_fetch_row(res);
    if (row != nullptr) {
      facts_.replicating = true;
      const unsigned n = mysql_num_fields(res);
      MYSQL_FIELD* fields = mysql_fetch_fields(res);
      for (unsigned i = 0; i < n; ++i) {
        const std::string name(fields[i].name);
        if (name == "Seconds_Behind_Master" || name == "Seconds_Behind_Source") {
          facts_.lag_seconds = to_integer(row[i]);
        }
      }
    }
  } else {
    // Two columns: Variable_name, Value.
    while (MYSQL_ROW row = mysql_fetch_row(res)) {
      if (mysql_num_fields(res) < 2 || row[0] == nullptr) continue;
      const std::string name(row[0]);
      if (name == "read_only") facts_.read_only = is_on(row[1]);
      if (name == "super_read_only") facts_.super_read_only = is_on(row[1]);
      if (name == "wsrep_local_state") facts_.wsrep_local_state = to_integer(row[1]);
      if (name == "wsrep_ready") facts_.wsrep_ready = is_on(row[1]);
    }
  }
  mysql_free_result(res);
  next_query_or_finish();
}

void MysqlProbe::next_query_or_finish() {
  if (++query_index_ < queries_.size()) {
    start_query();
    return;
  }
  auto [ok, reason] = judge_mysql(facts_, config_);
  const bool writable = !facts_.read_only && !facts_.super_read_only;
  RoleFacts& f = role_facts_;
  f.answered = true;
  f.primary = writable;
  f.role = writable ? "primary" : "replica";
  if (facts_.lag_seconds) f.lag_seconds = static_cast<double>(*facts_.lag_seconds);
  f.gtid = facts_gtid_;
  finish(ok, std::move(reason));
}

// The library frees the packet before it reports a refused plugin, and its
// message names the greeting's plugin (or what its buffer holds by then):
// an AuthSwitchRequest's is read here, off the socket, when the check waits
// for it. (A switch that is there before the library waits is not seen; the
// reason then says what such plugins are.)
void MysqlProbe::peek_auth_switch() {
  unsigned char buf[4 + 1 + 65];
  const ssize_t n = ::recv(mysql_get_socket(mysql_), buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
  // A packet header, 0xFE, the plugin's name and its NUL.
  if (n < 7 || buf[4] != 0xFE) return;
  const unsigned char* name = buf + 5;
  const unsigned char* end = std::find(name, static_cast<const unsigned char*>(buf + n), 0);
  if (end != buf + n) switched_plugin_.assign(name, end);
}

void MysqlProbe::fail_with_library(const char* what) {
  if (mysql_errno(mysql_) == CR_PLUGIN_NOT_ALLOWED) {
    finish(Verdict::fail, refused_plugin_reason(switched_plugin_));
    return;
  }
  // A packet header over MYSQL_OPT_MAX_ALLOWED_PACKET: the library refuses
  // to grow its buffer (net.error 1; a failed read is 2) and then reports a
  // lost connection.
  const unsigned err = mysql_errno(mysql_);
  if (err == CR_NET_PACKET_TOO_LARGE || (err == CR_SERVER_LOST && mysql_->net.error == 1)) {
    finish(Verdict::fail, reply_cap_reason());
    return;
  }
  std::string reason = mysql_error(mysql_);
  if (reason.empty()) reason = "connection failed";
  reason = lower_first(reason);
  const bool connected = step_ != Step::connect;
  // "Can't connect to server on '10.0.0.1' (111)": the errno says refused.
  if (!connected && reason.size() > 6 && reason.compare(reason.size() - 6, 6, " (111)") == 0) {
    reason = "connection refused";
  }
  // Until the connection is up, a failed socket() or connect() may be
  // sluice's own (out of descriptors or ports).
  finish(connected ? Verdict::fail : failed_with_message(reason),
         connected ? what + reason : connect_reason(what + reason));
}

}  // namespace sluice::health
