// type = "mysql": log in with MariaDB Connector/C's non-blocking API (with
// the authentication plugins restricted to those that neither send the
// password in clear text nor read a terminal, and packets capped at the
// reply cap before the library buffers them), then read the
// server's role: `read_only` / `super_read_only` (MySQL; MariaDB has only
// the first), the replication status when the check needs it (`role =
// "replica"`, `max_lag`) and, with `galera = true`, the node's wsrep state.
// The library's socket is watched with one uv_poll_t for the whole check.
#pragma once

#include <mysql.h>

#include <optional>
#include <string>
#include <vector>

#include "health/probe.hpp"

namespace sluice::health {

// What one check read from a MySQL or MariaDB server (see judge_mysql).
struct MysqlFacts {
  bool read_only = false;
  bool super_read_only = false;
  // The replication status: no row means the server replicates from no one.
  bool replicating = false;
  // Seconds_Behind_Master (Seconds_Behind_Source): empty when the server
  // says NULL, i.e. a replication thread is not running.
  std::optional<long long> lag_seconds;
  // wsrep_local_state and wsrep_ready (Galera); empty when not asked or
  // when the server has no such variables.
  std::optional<long long> wsrep_local_state;
  std::optional<bool> wsrep_ready;
};

// The verdict on one check's facts: ok, and the reason shown to operators.
// Pure, so every rule is unit-tested without a server.
std::pair<bool, std::string> judge_mysql(const MysqlFacts& facts, const HealthConfig& config);

class MysqlProbe final : public Probe {
 public:
  using Probe::Probe;
  ~MysqlProbe() override;

 private:
  using Poll = Handle<uv_poll_t, MysqlProbe>;
  // The steps of one check, each driven by the library's *_start/_cont.
  enum class Step { connect, query, store };

  void begin() override;
  void abort() override;
  // Waits for what the library asked for (MYSQL_WAIT_* bits in `status`),
  // or moves on when it asked for nothing.
  void wait_or_continue(int status);
  void advance(int ready);
  void start_query();
  void start_store();
  void read_rows(MYSQL_RES* res);
  void next_query_or_finish();
  void fail_with_library(const char* what);
  void peek_auth_switch();

  static void on_poll(uv_poll_t* h, int status, int events);

  MYSQL* mysql_ = nullptr;
  Poll* poll_ = nullptr;
  Step step_ = Step::connect;
  // The queries of this check, in order, and the one running.
  std::vector<std::string> queries_;
  std::size_t query_index_ = 0;
  // A syntax error on SHOW REPLICA STATUS (older servers) retries with
  // SHOW SLAVE STATUS once.
  bool tried_old_status_ = false;
  MysqlFacts facts_;
  std::string facts_gtid_;  // the GTID position, with role = "primary"
  // The plugin the server's AuthSwitchRequest named, if one came.
  std::string switched_plugin_;
  // Held for the library while a connect is in flight.
  std::string host_;
  std::string password_;
};

}  // namespace sluice::health
