#include "health/postgres_probe.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <tuple>
#include <vector>

#include "health/match.hpp"
#include "sluice/address.hpp"
#include "sluice/time.hpp"

namespace sluice::health {

std::pair<bool, std::string> judge_postgres_role(const std::string& in_recovery, PostgresRole want) {
  if (in_recovery != "t" && in_recovery != "f") return {false, "unexpected pg_is_in_recovery() value"};
  const std::string name = in_recovery == "f" ? "primary" : "standby";
  std::string reason = "role is " + name;
  switch (want) {
    case PostgresRole::any: return {true, reason};
    case PostgresRole::primary: return {name == "primary", name == "primary" ? reason : reason + ", want primary"};
    case PostgresRole::standby: return {name == "standby", name == "standby" ? reason : reason + ", want standby"};
  }
  return {false, reason};
}

std::pair<bool, std::string> judge_postgres_lag(const std::string& in_recovery, const std::string& receivers,
                                                const std::string& lag, Duration max_lag, std::string reason) {
  if (in_recovery != "t") return {true, std::move(reason)};
  const double max_s = std::chrono::duration<double>(max_lag).count();
  if (receivers == "0") return {false, reason + ", not streaming from a primary"};
  if (lag.empty()) return {false, reason + ", nothing replayed yet"};
  char* end = nullptr;
  const double s = std::strtod(lag.c_str(), &end);
  if (end == lag.c_str()) return {false, reason + ", unexpected lag value"};
  char text[64];
  std::snprintf(text, sizeof text, "%.1fs behind", s < 0 ? 0.0 : s);
  if (s > max_s) return {false, reason + ", " + text + " (max_lag " + format_duration(max_lag) + ")"};
  return {true, reason + ", " + text};
}

namespace {

// One query for every check: the role; for a standby, whether it streams
// and its replay lag (none while it has replayed all it received: an idle
// primary sends nothing, and a standby with nothing to replay is not
// behind; else the age of the last replayed transaction); for a primary,
// the timeline it writes on. The timeline is the higher of the last
// checkpoint's (pg_control_checkpoint()) and the one in the name of the WAL
// file being written: a promotion switches WAL files to the new timeline at
// once, while the checkpoint that records it may come a moment later.
constexpr const char* kRoleQuery =
    "SELECT pg_is_in_recovery(), (SELECT count(*) FROM pg_stat_wal_receiver), "
    "CASE WHEN NOT pg_is_in_recovery() THEN 0 "
    "WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0 "
    "ELSE extract(epoch FROM now() - pg_last_xact_replay_timestamp()) END, "
    "CASE WHEN pg_is_in_recovery() THEN NULL ELSE GREATEST((pg_control_checkpoint()).timeline_id, "
    "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int) END";

// libpq's messages are multi-line and start with where it connected; keep
// the first line's cause: 'connection to server at "h", port 1 failed:
// Connection refused' -> "Connection refused".
std::string short_message(const char* message) {
  std::string text = message != nullptr ? message : "";
  text = text.substr(0, text.find('\n'));
  const std::string marker = " failed: ";
  const auto at = text.find(marker);
  if (at != std::string::npos) text = text.substr(at + marker.size());
  while (!text.empty() && (text.back() == ' ' || text.back() == '\r')) text.pop_back();
  return text.empty() ? "connection failed" : lower_first(text);
}

}  // namespace

PostgresProbe::~PostgresProbe() { abort(); }

void PostgresProbe::begin() {
  std::string password;
  if (!read_password(password)) return;
  connected_ = false;
  role_.clear();
  receivers_.clear();
  lag_.clear();
  timeline_.clear();
  // hostaddr: the address resolved at load time, so libpq does no DNS
  // lookup (a blocking call) on the control loop. libpq does not enforce
  // connect_timeout in non-blocking mode; our timer does. GSS encryption is
  // off: it would consult Kerberos credentials, blocking as well.
  const std::string hostaddr = format_ip(reinterpret_cast<const sockaddr*>(&target_.addr));
  const std::string port = std::to_string(target_.port);
  const auto seconds = std::max<long long>(2, (config_.timeout.count() + 999) / 1000);
  const std::string connect_timeout = std::to_string(seconds);
  std::vector<const char*> keys = {"host",    "hostaddr",        "port",       "user",
                                   "dbname",  "sslmode",         "gssencmode", "connect_timeout",
                                   "application_name"};
  std::vector<const char*> values = {target_.host.c_str(),    hostaddr.c_str(),        port.c_str(),
                                     config_.user.c_str(),    config_.database.c_str(), config_.sslmode.c_str(),
                                     "disable",               connect_timeout.c_str(), "sluice-health"};
  if (!password.empty()) {
    keys.push_back("password");
    values.push_back(password.c_str());
  }
  keys.push_back(nullptr);
  values.push_back(nullptr);
  conn_ = PQconnectStartParams(keys.data(), values.data(), 0);
  if (conn_ == nullptr) {
    finish(Verdict::local_error, "out of memory");
    return;
  }
  if (PQstatus(conn_) == CONNECTION_BAD) {
    fail_with_libpq("");
    return;
  }
  // libpq prints a server's notices to stderr, which may be our error log:
  // a server's bytes must not write lines there.
  PQsetNoticeProcessor(conn_, [](void*, const char*) {}, nullptr);
  // As if PQconnectPoll had said PGRES_POLLING_WRITING.
  watch(UV_WRITABLE, true);
}

void PostgresProbe::abort() {
  // The poll handle stops at uv_close, before libpq closes the socket.
  HandleTracker::close(poll_);
  poll_ = nullptr;
  if (conn_ != nullptr) {
    PQfinish(conn_);
    conn_ = nullptr;
  }
}

void PostgresProbe::watch(int events, bool fresh) {
  if (fresh || poll_ == nullptr) {
    HandleTracker::close(poll_);
    poll_ = handles_.add(new Poll(this));
    const int rc = uv_poll_init_socket(loop_, &poll_->uv, PQsocket(conn_));
    if (rc < 0) {
      handles_.forget(poll_);
      poll_ = nullptr;
      finish(failed_with(rc), std::string("cannot watch the socket: ") + uv_strerror(rc));
      return;
    }
  }
  const int rc = uv_poll_start(&poll_->uv, events, &PostgresProbe::on_poll);
  if (rc < 0) finish(failed_with(rc), std::string("cannot watch the socket: ") + uv_strerror(rc));
}

void PostgresProbe::on_poll(uv_poll_t* h, int status, int) {
  Poll* rec = Poll::of(h);
  if (rec->closing) return;
  PostgresProbe* self = rec->owner;
  // An error on the socket (libuv says UV_EBADF on POLLERR, and stops the
  // handle) is libpq's to diagnose: it reads SO_ERROR or fails its read.
  (void)status;
  if (!self->connected_) {
    self->connect_step();
  } else {
    self->flush_query();
  }
  // libpq keeps a message whole, however long its header says it is, and
  // keeps every row and notice of the check: bound what it may have read.
  if (self->in_flight() && self->conn_ != nullptr) self->over_reply_cap(PQsocket(self->conn_));
}

void PostgresProbe::connect_step() {
  switch (PQconnectPoll(conn_)) {
    case PGRES_POLLING_READING: watch(UV_READABLE, true); return;
    case PGRES_POLLING_WRITING: watch(UV_WRITABLE, true); return;
    case PGRES_POLLING_FAILED: fail_with_libpq(""); return;
    case PGRES_POLLING_OK: break;
    default: watch(UV_READABLE | UV_WRITABLE, true); return;  // PGRES_POLLING_ACTIVE: unused by libpq
  }
  connected_ = true;
  if (PQsetnonblocking(conn_, 1) != 0 || PQsendQuery(conn_, kRoleQuery) == 0) {
    fail_with_libpq("query failed: ");
    return;
  }
  // The socket is settled now: one handle for the rest of the check.
  watch(UV_WRITABLE, true);
}

void PostgresProbe::flush_query() {
  const int pending = PQflush(conn_);
  if (pending < 0) {
    fail_with_libpq("query failed: ");
  } else if (pending > 0) {
    watch(UV_READABLE | UV_WRITABLE, false);
  } else {
    read_result();
  }
}

void PostgresProbe::read_result() {
  if (PQconsumeInput(conn_) == 0) {
    fail_with_libpq("query failed: ");
    return;
  }
  while (PQisBusy(conn_) == 0) {
    PGresult* res = PQgetResult(conn_);
    if (res == nullptr) {
      if (role_.empty()) {
        finish(false, "no reply to pg_is_in_recovery()");
        return;
      }
      role_facts_.answered = role_ == "t" || role_ == "f";
      role_facts_.primary = role_ == "f";
      role_facts_.role = role_ == "f" ? "primary" : "standby";
      role_facts_.timeline = timeline_.empty() ? -1 : std::strtoll(timeline_.c_str(), nullptr, 10);
      if (role_ == "t" && receivers_ != "0" && !lag_.empty()) role_facts_.lag_seconds = std::max(0.0, std::strtod(lag_.c_str(), nullptr));
      auto [ok, reason] = judge_postgres_role(role_, config_.postgres_role);
      if (ok && config_.max_lag.count() > 0) {
        std::tie(ok, reason) = judge_postgres_lag(role_, receivers_, lag_, config_.max_lag, std::move(reason));
      }
      finish(ok, std::move(reason));
      return;
    }
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 && PQnfields(res) >= 1) {
      role_ = PQgetvalue(res, 0, 0);
      if (PQnfields(res) == 4) {
        receivers_ = PQgetvalue(res, 0, 1);
        lag_ = PQgetisnull(res, 0, 2) ? "" : PQgetvalue(res, 0, 2);
        timeline_ = PQgetisnull(res, 0, 3) ? "" : PQgetvalue(res, 0, 3);
      }
    } else if (PQresultStatus(res) != PGRES_TUPLES_OK) {
      std::string reason = "query failed: " + short_message(PQresultErrorMessage(res));
      PQclear(res);
      finish(false, reason);
      return;
    }
    PQclear(res);
  }
  watch(UV_READABLE, false);
}

void PostgresProbe::fail_with_libpq(const char* what) {
  const std::string reason = short_message(PQerrorMessage(conn_));
  // libpq reports a failed socket() or connect() only as text; until the
  // connection is up, such an error may be sluice's own.
  finish(connected_ ? Verdict::fail : failed_with_message(reason), connected_ ? what + reason : connect_reason(what + reason));
}

}  // namespace sluice::health
