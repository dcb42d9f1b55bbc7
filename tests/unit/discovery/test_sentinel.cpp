// RESP replies as a sentinel sends them, and what the sentinel client takes
// from them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

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

namespace {

// A reply at the caps' edge: an array of kRespMaxItems bulk strings, `bulk`
// bytes each.
std::string big_reply(std::size_t bulk) {
  std::vector<std::string> items(kRespMaxItems, std::string(bulk, 'x'));
  return resp_command(items);
}

// Feeds `bytes` to `reader` `step` bytes at a time (as a peer that sends
// small segments would), taking every reply; returns how many it took.
std::size_t feed_in_steps(RespReader& reader, const std::string& bytes, std::size_t step,
                          std::vector<RespValue>* replies = nullptr) {
  std::size_t taken = 0;
  for (std::size_t at = 0; at < bytes.size(); at += step) {
    std::string_view chunk = std::string_view(bytes).substr(at, step);
    while (!chunk.empty()) {
      chunk.remove_prefix(reader.read(chunk));
      REQUIRE_FALSE(reader.bad());
      if (reader.ready()) {
        RespValue v = reader.take();
        if (replies != nullptr) replies->push_back(std::move(v));
        ++taken;
      }
    }
  }
  return taken;
}

}  // namespace

TEST_CASE("RESP reader: a reply fed a byte at a time is read with work linear in its size") {
  // A sentinel that sends its reply one byte per segment must not make the
  // control loop look at the bytes it already has again for each new one.
  const std::string reply = big_reply(900);  // about 58 KiB, under the reply cap
  REQUIRE(reply.size() > 50'000);
  RespReader reader;
  std::vector<RespValue> replies;
  CHECK(feed_in_steps(reader, reply, 1, &replies) == 1);
  REQUIRE(replies.size() == 1);
  REQUIRE(replies[0].items.size() == kRespMaxItems);
  CHECK(replies[0].items[63].text == std::string(900, 'x'));
  // Each byte is looked at once.
  CHECK(reader.examined() == reply.size());

  // Many small replies in one segment, and cut at every size from 1 to 7.
  std::string many;
  for (int i = 0; i < 5000; ++i) many += "+OK\r\n";
  for (std::size_t step : {1U, 2U, 3U, 7U, 16384U}) {
    CAPTURE(step);
    RespReader r;
    CHECK(feed_in_steps(r, many, step) == 5000);
    CHECK(r.examined() == many.size());
  }
}

TEST_CASE("RESP reader: what parse_resp accepts and refuses, whatever the cut") {
  const std::string whole = "*3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n$33\r\nm 127.0.0.1 6379 127.0.0.1 6380 x\r\n";
  for (std::size_t step = 1; step <= whole.size(); ++step) {
    CAPTURE(step);
    RespReader r;
    std::vector<RespValue> replies;
    CHECK(feed_in_steps(r, whole + ":7\r\n", step, &replies) == 2);
    REQUIRE(replies.size() == 2);
    REQUIRE(replies[0].items.size() == 3);
    CHECK(replies[0].items[2].text == "m 127.0.0.1 6379 127.0.0.1 6380 x");
    CHECK(replies[1].integer == 7);
  }
  for (const std::string& bad : {std::string("$999999999\r\n"), std::string("*100000\r\n"), std::string("$-2\r\n"),
                                std::string("*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n"), std::string("$3\r\nabcde\r\n"),
                                std::string(":12x\r\n"), "+" + std::string(kRespMaxLine + 10, 'a')}) {
    CAPTURE(bad);
    RespReader r;
    std::string_view rest = bad;
    while (!rest.empty() && !r.bad()) rest.remove_prefix(r.read(rest.substr(0, 1)));
    CHECK(r.bad());
    CHECK_FALSE(r.error().empty());
    CHECK(r.read("+OK\r\n") == 0);  // a reader that failed stays failed
  }
}

TEST_CASE("RESP reader: one reply is capped in bytes however it is made up") {
  // 64 items of 1 KiB bulk strings are under each item's cap, over the reply's.
  const std::string reply = big_reply(1200);
  REQUIRE(reply.size() > kRespMaxReply);
  RespReader r;
  std::string_view rest = reply;
  while (!rest.empty() && !r.bad()) rest.remove_prefix(r.read(rest.substr(0, 100)));
  REQUIRE(r.bad());
  CHECK(r.error() == "a reply over " + std::to_string(kRespMaxReply) + " bytes");
  // It stopped at the cap, not at the end.
  CHECK(r.examined() <= kRespMaxReply + 1);
}

namespace {

// A reply made of the kinds a sentinel sends, with a chance of a wrong
// byte somewhere; from a fixed seed, so every run is the same.
struct Gen {
  std::uint32_t state;
  std::uint32_t next() {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return state;
  }
  std::string value(int depth) {
    switch (next() % (depth < 5 ? 6 : 5)) {
      case 0: return "+" + std::string(next() % 8, 'o') + "\r\n";
      case 1: return "-ERR " + std::to_string(next() % 100) + "\r\n";
      case 2: return ":" + std::to_string(static_cast<int>(next() % 2000) - 1000) + "\r\n";
      case 3: {
        const std::string text(next() % 40, 'b');
        return "$" + std::to_string(text.size()) + "\r\n" + text + "\r\n";
      }
      case 4: return next() % 2 == 0 ? "$-1\r\n" : "*-1\r\n";
      default: {
        const std::size_t n = next() % 5;
        std::string out = "*" + std::to_string(n) + "\r\n";
        for (std::size_t i = 0; i < n; ++i) out += value(depth + 1);
        return out;
      }
    }
  }
};

// What a reader makes of `bytes` fed in the chunks `cut` chooses: the
// replies in order (flattened to text), then the error if one.
std::string outcome(const std::string& bytes, Gen* cut) {
  RespReader r;
  std::string out;
  std::function<void(const RespValue&)> flatten = [&](const RespValue& v) {
    out += std::to_string(static_cast<int>(v.type)) + ":" + v.text + ":" + std::to_string(v.integer) + "[";
    for (const RespValue& item : v.items) flatten(item);
    out += "]";
  };
  std::size_t at = 0;
  while (at < bytes.size() && !r.bad()) {
    const std::size_t n = cut == nullptr ? bytes.size() - at : std::min<std::size_t>(1 + cut->next() % 9, bytes.size() - at);
    std::string_view chunk = std::string_view(bytes).substr(at, n);
    at += n;
    while (!chunk.empty() && !r.bad()) {
      chunk.remove_prefix(r.read(chunk));
      if (r.ready()) {
        flatten(r.take());
        out += ";";
      }
    }
  }
  if (r.bad()) out += "bad: " + r.error();
  return out;
}

}  // namespace

TEST_CASE("RESP reader: whole or in random pieces, the same replies and the same error") {
  Gen gen{2463534242U};
  Gen cut{88172645U};
  for (int round = 0; round < 3000; ++round) {
    std::string bytes;
    for (std::uint32_t n = 1 + gen.next() % 3; n > 0; --n) bytes += gen.value(0);
    if (gen.next() % 4 == 0) bytes[gen.next() % bytes.size()] = static_cast<char>(gen.next() % 256);
    CAPTURE(bytes);
    const std::string whole = outcome(bytes, nullptr);
    CHECK(outcome(bytes, &cut) == whole);
    // The first reply agrees with parse_resp's.
    RespValue v;
    std::size_t used = 0;
    std::string error;
    const RespResult first = parse_resp(bytes, v, used, error);
    if (first == RespResult::bad) CHECK(whole.find(";") == std::string::npos);
    if (first == RespResult::done) CHECK(used <= bytes.size());
  }
}
