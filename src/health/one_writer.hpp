// One writer per primary pool: when two servers of an upstream whose check
// wants the primary both say they are the primary, which one serves. Pure
// rules, one per database (see docs/health.md, "One writer"); the checker
// applies them on the control loop and fences the loser.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/config.hpp"
#include "upstream/server_state.hpp"

namespace sluice::health {

// What one check read about a server's role and its history, beyond the
// verdict. `answered`: the server told its role (a check that could not
// connect or log in leaves it false).
struct RoleFacts {
  bool answered = false;
  bool primary = false;        // says it is the primary (master, writable)
  std::string role;            // as /status shows it: primary, standby, master, replica
  std::optional<double> lag_seconds;
  // PostgreSQL: the timeline the server writes on (a primary).
  std::int64_t timeline = -1;
  // Redis: INFO replication's master_replid and master_replid2.
  std::string replid;
  std::string replid2;
  // MySQL/MariaDB: the GTID position (MariaDB's gtid_current_pos, MySQL's
  // gtid_executed); empty when unknown.
  std::string gtid;
  // The order in which the checker took this reading (later is larger; 0
  // when unknown). A position read before the rival's says nothing about
  // writes taken since.
  std::uint64_t reading = 0;
};

// Does this check want the primary (so that at most one server may serve)?
bool wants_one_writer(const HealthConfig& c);

enum class Winner { incumbent, newcomer, neither };

struct Verdict {
  Winner winner = Winner::incumbent;
  // How the loser (or, for `neither`, both) is fenced.
  FenceKind loser = FenceKind::waiting;
  std::string why;  // "timeline 3 > 2", for the log and /status
};

// `incumbent` is the server that was primary first (it serves when
// `serving`); `newcomer` has just said it is a primary too.
Verdict judge(HealthType type, const RoleFacts& incumbent, const RoleFacts& newcomer, bool serving);

Verdict judge_postgres(const RoleFacts& incumbent, const RoleFacts& newcomer, bool serving);
Verdict judge_redis(const RoleFacts& incumbent, const RoleFacts& newcomer);
Verdict judge_mysql(const RoleFacts& incumbent, const RoleFacts& newcomer, bool serving);

// Does GTID position `a` contain `b` (every transaction of b is in a)?
// MariaDB: "domain-server-seq" lists; a contains b when, for every domain of
// b, a has that domain with a sequence number at least as high. MySQL:
// "uuid:1-5:7,uuid2:1-3" sets; a contains b when each interval of b lies
// within a's intervals for the same uuid. nullopt when either cannot be
// read.
std::optional<bool> gtid_contains(std::string_view a, std::string_view b);

// INFO replication's "field:value" for `field`, "" when absent.
std::string info_field(std::string_view info, std::string_view field);

}  // namespace sluice::health
