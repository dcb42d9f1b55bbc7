// type = "postgres": connect with libpq's non-blocking API (authentication,
// SCRAM or md5 or trust, and TLS per `sslmode` are libpq's business), then
// ask `SELECT pg_is_in_recovery()`: 'f' is a primary, 't' a standby.
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
};

}  // namespace sluice::health
