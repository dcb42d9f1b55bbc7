// RESP replies as a sentinel sends them, and what the sentinel client takes
// from them.
#include <doctest/doctest.h>

#include "discovery/resp.hpp"
#include "discovery/sentinel.hpp"

using namespace sluice::discovery;

namespace {

RespResult parse(const std::string& in, RespValue& v, std::size_t& used, std::string& error) {
  return parse_resp(in, v, used, error);
}

}  // namespace

TEST_CASE("RESP: the replies of get-master-addr-by-name and SUBSCRIBE") {
  RespValue v;
  std::size_t used = 0;
  std::string error;
  const std::string addr = "*2\r\n$9\r\n127.0.0.1\r\n$4\r\n6380\r\n";
  REQUIRE(parse(addr + "+OK\r\n", v, used, error) == RespResult::done);
  CHECK(used == addr.size());
  REQUIRE(v.type == RespValue::Type::array);
  REQUIRE(v.items.size() == 2);
  CHECK(v.items[0].text == "127.0.0.1");
  CHECK(v.items[1].text == "6380");

  REQUIRE(parse("*-1\r\n", v, used, error) == RespResult::done);
  CHECK(v.type == RespValue::Type::null);
  REQUIRE(parse("$-1\r\n", v, used, error) == RespResult::done);
  CHECK(v.type == RespValue::Type::null);
  REQUIRE(parse("-ERR no such master\r\n", v, used, error) == RespResult::done);
  CHECK(v.type == RespValue::Type::error);
  CHECK(v.text == "ERR no such master");
  REQUIRE(parse("*3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n", v, used, error) == RespResult::done);
  CHECK(v.items[2].type == RespValue::Type::integer);
  CHECK(v.items[2].integer == 1);
}

TEST_CASE("RESP: a reply cut anywhere needs more bytes") {
  const std::string whole = "*3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n$34\r\nm 127.0.0.1 6379 127.0.0.1 6380 x\r\n";
  for (std::size_t cut = 0; cut < whole.size(); ++cut) {
    RespValue v;
    std::size_t used = 0;
    std::string error;
    CAPTURE(cut);
    CHECK(parse_resp(std::string_view(whole).substr(0, cut), v, used, error) == RespResult::more);
  }
}

TEST_CASE("RESP: replies over the caps, or not RESP, are errors") {
  RespValue v;
  std::size_t used = 0;
  std::string error;
  CHECK(parse("$999999999\r\n", v, used, error) == RespResult::bad);
  CHECK(error.find("a bulk string of 999999999 bytes (at most ") == 0);
  CHECK(parse("*100000\r\n", v, used, error) == RespResult::bad);
  CHECK(error.find("an array of 100000 items (at most ") == 0);
  CHECK(parse("$-2\r\n", v, used, error) == RespResult::bad);
  CHECK(parse("*-7\r\n", v, used, error) == RespResult::bad);
  CHECK(parse("*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n", v, used, error) == RespResult::bad);
  CHECK(parse("HTTP/1.1 200 OK\r\n", v, used, error) == RespResult::bad);
  CHECK(parse("$3\r\nabcde\r\n", v, used, error) == RespResult::bad);
  CHECK(parse(":12x\r\n", v, used, error) == RespResult::bad);
  CHECK(parse("+" + std::string(kRespMaxLine + 10, 'a'), v, used, error) == RespResult::bad);
}

TEST_CASE("resp_command writes an array of bulk strings") {
  CHECK(resp_command({"SENTINEL", "get-master-addr-by-name", "m"}) ==
        "*3\r\n$8\r\nSENTINEL\r\n$23\r\nget-master-addr-by-name\r\n$1\r\nm\r\n");
}

TEST_CASE("a master address from a sentinel is numeric and canonical") {
  CHECK(sentinel_address("127.0.0.1", "6379") == "127.0.0.1:6379");
  CHECK(sentinel_address("::1", "6379") == "[::1]:6379");
  CHECK(sentinel_address("redis.internal", "6379").empty());
  CHECK(sentinel_address("127.0.0.1", "0").empty());
  CHECK(sentinel_address("127.0.0.1", "65536").empty());
  CHECK(sentinel_address("127.0.0.1", "-1").empty());
  CHECK(sentinel_address("127.0.0.1", "").empty());
}

TEST_CASE("+switch-master: the new address, for our master only") {
  CHECK(switched_to("mymaster 127.0.0.1 6379 127.0.0.1 6380", "mymaster") == "127.0.0.1:6380");
  CHECK(switched_to("other 127.0.0.1 6379 127.0.0.1 6380", "mymaster").empty());
  CHECK(switched_to("mymaster 127.0.0.1 6379 127.0.0.1", "mymaster").empty());
  CHECK(switched_to("mymaster 127.0.0.1 6379 127.0.0.1 6380 extra", "mymaster").empty());
  CHECK(switched_to("mymaster 127.0.0.1 6379 host 6380", "mymaster").empty());
}

TEST_CASE("failover signs: the master left and the candidate, for our master only") {
  auto s = failover_sign("+failover-state-send-slaveof-noone",
                         "slave 127.0.0.1:6380 127.0.0.1 6380 @ mymaster 127.0.0.1 6379", "mymaster");
  REQUIRE(s);
  CHECK(s->from == "127.0.0.1:6379");
  CHECK(s->to == "127.0.0.1:6380");
  s = failover_sign("+promoted-slave", "slave [::1]:6380 ::1 6380 @ mymaster ::1 6379", "mymaster");
  REQUIRE(s);
  CHECK(s->from == "[::1]:6379");
  CHECK(s->to == "[::1]:6380");
  s = failover_sign("+switch-master", "mymaster 127.0.0.1 6379 127.0.0.1 6380", "mymaster");
  REQUIRE(s);
  CHECK(s->from == "127.0.0.1:6379");
  CHECK(s->to == "127.0.0.1:6380");
  CHECK_FALSE(failover_sign("+promoted-slave", "slave 127.0.0.1:6380 127.0.0.1 6380 @ other 127.0.0.1 6379",
                            "mymaster"));
  CHECK_FALSE(failover_sign("+promoted-slave", "master mymaster 127.0.0.1 6379", "mymaster"));
  CHECK_FALSE(failover_sign("+promoted-slave", "slave 127.0.0.1:6380 127.0.0.1 6380 mymaster 127.0.0.1 6379",
                            "mymaster"));
  CHECK_FALSE(failover_sign("+promoted-slave", "slave x host 6380 @ mymaster 127.0.0.1 6379", "mymaster"));
  CHECK_FALSE(failover_sign("+sdown", "master mymaster 127.0.0.1 6379", "mymaster"));
  CHECK_FALSE(failover_sign("+switch-master", "mymaster 127.0.0.1 6379 127.0.0.1 6380 extra", "mymaster"));
}

TEST_CASE("a master needs more than half of the listed sentinels") {
  CHECK(majority({"a", "a", "b"}) == "a");
  CHECK(majority({"a", "", ""}).empty());
  CHECK(majority({"a", "b", ""}).empty());
  CHECK(majority({"a"}) == "a");
  CHECK(majority({"a", "b"}).empty());
  CHECK(majority({"", "b", "b", "b"}) == "b");
  CHECK(majority({"a", "a", "b", "b"}).empty());
  CHECK(majority({}).empty());
}
