// One writer's rules (health/one_writer.hpp): which of two servers that
// both say they are the primary serves, per database.
#include <doctest/doctest.h>

#include "health/one_writer.hpp"

using namespace sluice;
using namespace sluice::health;

namespace {

RoleFacts pg(std::int64_t timeline) {
  RoleFacts f;
  f.answered = f.primary = true;
  f.role = "primary";
  f.timeline = timeline;
  return f;
}

RoleFacts redis(std::string replid, std::string replid2) {
  RoleFacts f;
  f.answered = f.primary = true;
  f.role = "master";
  f.replid = std::move(replid);
  f.replid2 = std::move(replid2);
  return f;
}

RoleFacts mysql(std::string gtid) {
  RoleFacts f;
  f.answered = f.primary = true;
  f.role = "primary";
  f.gtid = std::move(gtid);
  return f;
}

const std::string kNone = "0000000000000000000000000000000000000000";

}  // namespace

TEST_CASE("one writer applies to primary checks only") {
  HealthConfig c;
  c.type = HealthType::postgres;
  CHECK_FALSE(wants_one_writer(c));
  c.postgres_role = PostgresRole::primary;
  CHECK(wants_one_writer(c));
  c.type = HealthType::redis;
  CHECK_FALSE(wants_one_writer(c));
  c.redis_role = RedisRole::master;
  CHECK(wants_one_writer(c));
  c.type = HealthType::mysql;
  c.mysql_role = MysqlRole::replica;
  CHECK_FALSE(wants_one_writer(c));
  c.mysql_role = MysqlRole::primary;
  CHECK(wants_one_writer(c));
  c.type = HealthType::tcp;
  CHECK_FALSE(wants_one_writer(c));
}

TEST_CASE("postgres: the higher timeline serves; the other has lost for good") {
  Verdict v = judge_postgres(pg(1), pg(2), true);
  CHECK(v.winner == Winner::newcomer);
  CHECK(v.loser == FenceKind::lost);
  CHECK(v.why == "timeline 2 > timeline 1");
  v = judge_postgres(pg(3), pg(2), true);
  CHECK(v.winner == Winner::incumbent);
  CHECK(v.loser == FenceKind::lost);
  // The same timeline: the serving one keeps serving; with none serving,
  // neither does.
  v = judge_postgres(pg(2), pg(2), true);
  CHECK(v.winner == Winner::incumbent);
  CHECK(v.loser == FenceKind::waiting);
  CHECK(judge_postgres(pg(2), pg(2), false).winner == Winner::neither);
  CHECK(judge_postgres(pg(-1), pg(2), true).winner == Winner::incumbent);
}

TEST_CASE("redis: the node promoted from the other serves; unrelated masters neither") {
  const RoleFacts old_master = redis("aaaa", kNone);
  const RoleFacts promoted = redis("bbbb", "aaaa");
  Verdict v = judge_redis(old_master, promoted);
  CHECK(v.winner == Winner::newcomer);
  CHECK(v.loser == FenceKind::lost);
  v = judge_redis(promoted, old_master);
  CHECK(v.winner == Winner::incumbent);
  CHECK(v.loser == FenceKind::lost);
  v = judge_redis(old_master, redis("cccc", kNone));
  CHECK(v.winner == Winner::neither);
  CHECK(v.loser == FenceKind::waiting);
  // An unknown or all-zero id proves nothing.
  CHECK(judge_redis(redis("", ""), redis("bbbb", "")).winner == Winner::neither);
  CHECK(judge_redis(redis(kNone, kNone), redis("bbbb", kNone)).winner == Winner::neither);
}

TEST_CASE("mysql: the serving one keeps serving unless the newcomer has all it has") {
  Verdict v = judge_mysql(mysql("0-1-100"), mysql("0-1-90"), true);
  CHECK(v.winner == Winner::incumbent);
  CHECK(v.loser == FenceKind::waiting);
  v = judge_mysql(mysql("0-1-100"), mysql("0-2-101"), true);
  CHECK(v.winner == Winner::newcomer);
  CHECK(v.loser == FenceKind::lost);
  // Another domain the newcomer lacks.
  CHECK(judge_mysql(mysql("0-1-100,1-1-5"), mysql("0-2-101"), true).winner == Winner::incumbent);
  // Unknown positions: the serving one keeps serving.
  CHECK(judge_mysql(mysql("0-1-100"), mysql(""), true).winner == Winner::incumbent);
  // None serving: the one that has all the other has, else neither.
  CHECK(judge_mysql(mysql("0-1-100"), mysql("0-1-90"), false).winner == Winner::incumbent);
  CHECK(judge_mysql(mysql("0-1-100,1-1-9"), mysql("0-1-90,1-1-10"), false).winner == Winner::neither);
}

TEST_CASE("mysql: a newcomer takes over only from a reading of the serving one newer than its own") {
  RoleFacts serving = mysql("0-1-6");
  RoleFacts newcomer = mysql("0-1-6");
  serving.reading = 1;  // read before the newcomer turned writable: it may have taken writes since
  newcomer.reading = 2;
  Verdict v = judge_mysql(serving, newcomer, true);
  CHECK(v.winner == Winner::incumbent);
  CHECK(v.loser == FenceKind::waiting);
  CHECK(v.why.rfind("the serving one keeps serving", 0) == 0);
  serving.reading = 3;  // read again: still no more than the newcomer has
  CHECK(judge_mysql(serving, newcomer, true).winner == Winner::newcomer);
  serving.gtid = "0-1-7";  // it took a write the newcomer lacks
  CHECK(judge_mysql(serving, newcomer, true).winner == Winner::incumbent);
}

TEST_CASE("GTID positions: MariaDB domains and MySQL interval sets") {
  CHECK(gtid_contains("0-1-100", "0-1-100") == true);
  CHECK(gtid_contains("0-2-101", "0-1-100") == true);
  CHECK(gtid_contains("0-1-99", "0-1-100") == false);
  CHECK(gtid_contains("0-1-100,1-2-3", "1-2-3") == true);
  CHECK(gtid_contains("0-1-100", "") == true);
  CHECK(gtid_contains("", "0-1-1") == false);
  CHECK(gtid_contains("0-1", "0-1-1") == std::nullopt);
  const std::string u1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
  const std::string u2 = "4f22fa47-71ca-11e1-9e33-c80aa9429562";
  CHECK(gtid_contains(u1 + ":1-10", u1 + ":1-5") == true);
  CHECK(gtid_contains(u1 + ":1-5:7-10", u1 + ":1-10") == false);
  CHECK(gtid_contains(u1 + ":1-5:6-10", u1 + ":2-9") == true);
  CHECK(gtid_contains(u1 + ":1-10,\n" + u2 + ":1-3", u2 + ":3,\n" + u1 + ":4") == true);
  CHECK(gtid_contains(u1 + ":1-10", u2 + ":1") == false);
  CHECK(gtid_contains(u1 + ":x", u1 + ":1") == std::nullopt);
}

TEST_CASE("INFO replication fields") {
  const std::string info =
      "# Replication\r\nrole:master\r\nconnected_slaves:1\r\nmaster_replid:abc\r\nmaster_replid2:def\r\n";
  CHECK(info_field(info, "role") == "master");
  CHECK(info_field(info, "master_replid") == "abc");
  CHECK(info_field(info, "master_replid2") == "def");
  CHECK(info_field(info, "master_link_status").empty());
}
