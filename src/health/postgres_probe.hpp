// type = "postgres": connect with libpq's non-blocking API (authentication,
// SCRAM or md5 or trust, and TLS per `sslmode` are libpq's business), then
// ask `SELECT pg_is_in_recovery()` (with a standby's lag and a primary's
// timeline): 'f' is a primary, 't' a standby.
// libpq's socket is watched with a uv_poll_t; while connecting, libpq may
// close its socket and open another (next address, or a retry without TLS
// under sslmode=prefer), so the poll handle is made afresh after every
// PQconnectPoll step.
#pragma once

#include <libpq-fe.h>

#include <string>

#include "health/probe.hpp"

namespace sluice::health {

// The verdict on pg_is_in_recovery()'s text value: ok, and the reason.
std::pair<bool, std::string> judge_postgres_role(const std::string& in_recovery, PostgresRole want);

// With max_lag: the verdict on a standby's replication. `receivers` is the
// count of WAL receivers ("0": not streaming), `lag` the replay lag in
// seconds as text (empty: NULL, nothing replayed yet). Called after the role
// passed; a primary always passes here.
std::pair<bool, std::string> judge_postgres_lag(const std::string& in_recovery, const std::string& receivers,
                                                const std::string& lag, Duration max_lag, std::string reason);

class PostgresProbe final : public Probe {
 public:
  using Probe::Probe;
  ~PostgresProbe() override;

 private:
  using Poll = Handle<uv_poll_t, PostgresProbe>;

  void begin() override;
  void abort() override;
  // Watches libpq's current socket for `events` on a new poll handle.
  void watch(int events, bool fresh);
  void connect_step();
  void flush_query();
  void read_result();
  void fail_with_libpq(const char* what);

  static void on_poll(uv_poll_t* h, int status, int events);

  PGconn* conn_ = nullptr;
  Poll* poll_ = nullptr;
  bool connected_ = false;
  std::string role_;  // pg_is_in_recovery() once read
  std::string receivers_;  // WAL receivers running
  std::string lag_;        // replay lag in seconds, "" for NULL
  std::string timeline_;   // a primary's timeline, "" for a standby
};

}  // namespace sluice::health
