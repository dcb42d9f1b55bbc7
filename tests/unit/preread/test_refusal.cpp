// Protocol-native refusals: the bytes each protocol's client gets, and when.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "preread/refusal.hpp"

#include "bytes.hpp"

using namespace sluice;
using namespace sluice::preread;
using sluice::test::bytes;

namespace {

std::string be32(std::uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

// A PostgreSQL 3.0 StartupMessage for user/database.
std::string startup(std::string_view user) {
  std::string body = be32(196608) + "user" + '\0' + std::string(user) + '\0' + "database" + '\0' + "db" + '\0' + '\0';
  return be32(static_cast<std::uint32_t>(body.size() + 4)) + body;
}

const std::string kSslRequest = be32(8) + be32(80877103);
const std::string kGssRequest = be32(8) + be32(80877104);

Refusal::Step feed(Refusal& r, std::string_view s) {
  const auto b = bytes(s);
  return r.feed(b);
}

}  // namespace

TEST_CASE("the message names sluice, the upstream and the cause, in fixed ASCII") {
  CHECK(refusal_message(Cause::no_server, "pg") == "sluice: no server available in upstream \"pg\" (no_server)");
  CHECK(refusal_message(Cause::no_server, "pg", true) ==
        "sluice: every server of upstream \"pg\" is busy and its queue is full (no_server)");
  CHECK(refusal_message(Cause::no_server, "") == "sluice: no upstream for this connection (no_server)");
  CHECK(refusal_message(Cause::connect_failed, "db") ==
        "sluice: no server of upstream \"db\" could be reached (connect_failed)");
  CHECK(refusal_message(Cause::queue_timeout, "db") ==
        "sluice: every server of upstream \"db\" stayed busy until the queue timed out (queue_timeout)");
  CHECK(refusal_message(Cause::limit_reached, "db") ==
        "sluice: too many connections, before upstream \"db\" (limit_reached)");
  CHECK(refusal_message(Cause::client_limit, "") == "sluice: too many connections from this address (client_limit)");
  CHECK(refusal_message(Cause::rate_limited, "r") ==
        "sluice: too many new connections from this address, before upstream \"r\" (rate_limited)");
  CHECK(refusal_message(Cause::acl_denied, "r") ==
        "sluice: this address is not allowed, before upstream \"r\" (acl_denied)");
  // A name is escaped and cut: nothing but printable ASCII goes out.
  const std::string odd = refusal_message(Cause::no_server, std::string("a\"b\r\n\xff") + std::string(100, 'x'));
  for (const char c : odd) CHECK((c >= 0x20 && c < 0x7f));
  CHECK(odd.find("a\\x22b\\x0d\\x0a\\xff") != std::string::npos);
  CHECK(odd.find("...\"") != std::string::npos);
  CHECK(odd.size() < 200);
}

TEST_CASE("only refusals are told") {
  for (Cause c : {Cause::no_server, Cause::connect_failed, Cause::queue_timeout, Cause::limit_reached,
                  Cause::client_limit, Cause::rate_limited, Cause::acl_denied, Cause::rejected_not_tls}) {
    CAPTURE(to_string(c));
    CHECK(is_told_refusal(c));
  }
  for (Cause c : {Cause::client_closed, Cause::server_reset, Cause::preread_timeout, Cause::preread_malformed,
                  Cause::shutdown, Cause::internal_error, Cause::local_resource, Cause::rejected_proxy,
                  Cause::server_no_tls, Cause::idle_timeout}) {
    CAPTURE(to_string(c));
    CHECK_FALSE(is_told_refusal(c));
  }
}

TEST_CASE("PostgreSQL ErrorResponse: FATAL, the SQLSTATE and the message") {
  const std::string e = pg_error_response("57P03", "sluice: x");
  const std::string body = std::string("SFATAL\0VFATAL\0C57P03\0Msluice: x\0\0", 33);
  CHECK(e == "E" + be32(static_cast<std::uint32_t>(body.size() + 4)) + body);
  CHECK(pg_sqlstate(Cause::no_server) == "57P03");
  CHECK(pg_sqlstate(Cause::connect_failed) == "57P03");
  CHECK(pg_sqlstate(Cause::no_server, true) == "53300");
  CHECK(pg_sqlstate(Cause::queue_timeout) == "53300");
  CHECK(pg_sqlstate(Cause::limit_reached) == "53300");
  CHECK(pg_sqlstate(Cause::client_limit) == "53300");
  CHECK(pg_sqlstate(Cause::rate_limited) == "53300");
  CHECK(pg_sqlstate(Cause::acl_denied) == "28000");
}

TEST_CASE("MySQL ERR packet in place of the handshake") {
  const std::string p = mysql_err_packet(1040, "sluice: y");
  CHECK(p == std::string("\x0c\x00\x00\x00\xff\x10\x04sluice: y", 16));
  CHECK(mysql_error_code(Cause::no_server) == 1040);
  CHECK(mysql_error_code(Cause::limit_reached) == 1040);
  CHECK(mysql_error_code(Cause::acl_denied) == 1130);
  // A message longer than MySQL's bound is cut, the length follows.
  const std::string big = mysql_err_packet(1040, std::string(600, 'm'));
  CHECK(big.size() == 4 + 3 + 512);
  CHECK(static_cast<unsigned char>(big[0]) + 256 * static_cast<unsigned char>(big[1]) == 515);
}

TEST_CASE("Redis error reply on one line") {
  CHECK(redis_error("sluice: z") == "-ERR sluice: z\r\n");
  CHECK(redis_error("a\r\nb") == "-ERR a  b\r\n");
}

TEST_CASE("MySQL: the ERR goes at once, nothing is read") {
  Refusal r(ClientProtocol::mysql, Cause::no_server, "db");
  const auto s = r.feed({});
  CHECK(s.status == Refusal::Status::done);
  CHECK(s.send == mysql_err_packet(1040, "sluice: no server available in upstream \"db\" (no_server)"));
}

TEST_CASE("PostgreSQL: the error follows the whole startup packet, however it is cut") {
  const std::string msg = startup("alice");
  for (std::size_t cut = 0; cut <= msg.size(); ++cut) {
    CAPTURE(cut);
    Refusal r(ClientProtocol::postgres, Cause::no_server, "pg");
    CHECK(r.feed({}).status == Refusal::Status::need_more);
    const auto a = feed(r, msg.substr(0, cut));
    if (cut < msg.size()) {
      CHECK(a.status == Refusal::Status::need_more);
      CHECK(a.send.empty());
      const auto b = feed(r, msg.substr(cut));
      CHECK(b.status == Refusal::Status::done);
      CHECK(b.send == r.reply());
    } else {
      CHECK(a.status == Refusal::Status::done);
      CHECK(a.send == r.reply());
    }
  }
}

TEST_CASE("PostgreSQL: SSLRequest and GSSENCRequest get 'N', then the startup packet the error") {
  Refusal r(ClientProtocol::postgres, Cause::limit_reached, "pg");
  auto s = feed(r, kSslRequest);
  CHECK(s.status == Refusal::Status::need_more);
  CHECK(s.send == "N");
  s = feed(r, startup("bob"));
  CHECK(s.status == Refusal::Status::done);
  CHECK(s.send == r.reply());
  CHECK(r.reply().find("C53300") != std::string::npos);

  // All in one read: both answers at once.
  Refusal both(ClientProtocol::postgres, Cause::no_server, "pg");
  s = feed(both, kGssRequest + kSslRequest + startup("c"));
  CHECK(s.status == Refusal::Status::done);
  CHECK(s.send == "NN" + both.reply());

  // A third negotiation is not answered 'N' again: the error instead.
  Refusal many(ClientProtocol::postgres, Cause::no_server, "pg");
  s = feed(many, kSslRequest + kSslRequest + kSslRequest);
  CHECK(s.status == Refusal::Status::done);
  CHECK(s.send == "NN" + many.reply());
}

TEST_CASE("PostgreSQL: nothing is said to a client in TLS, a cancel, or a bad length") {
  Refusal tls(ClientProtocol::postgres, Cause::no_server, "pg");
  auto s = feed(tls, "\x16\x03\x01\x02\x00\x01");
  CHECK(s.status == Refusal::Status::done);
  CHECK(s.send.empty());
  // After 'N', a client that starts TLS anyway.
  Refusal after(ClientProtocol::postgres, Cause::no_server, "pg");
  CHECK(feed(after, kSslRequest).send == "N");
  s = feed(after, "\x16\x03\x01");
  CHECK(s.status == Refusal::Status::done);
  CHECK(s.send.empty());
  Refusal cancel(ClientProtocol::postgres, Cause::no_server, "pg");
  s = feed(cancel, be32(16) + be32(80877102) + be32(1) + be32(2));
  CHECK(s.status == Refusal::Status::done);
  CHECK(s.send.empty());
  Refusal short_len(ClientProtocol::postgres, Cause::no_server, "pg");
  s = feed(short_len, be32(4));
  CHECK(s.status == Refusal::Status::done);
  CHECK(s.send.empty());
  Refusal long_len(ClientProtocol::postgres, Cause::no_server, "pg");
  s = feed(long_len, be32(Refusal::kMaxPgStartup + 1));
  CHECK(s.status == Refusal::Status::done);
  CHECK(s.send.empty());
  // Done is done: later bytes get nothing.
  s = feed(long_len, startup("x"));
  CHECK(s.status == Refusal::Status::done);
  CHECK(s.send.empty());
}

TEST_CASE("Redis: the error follows the first whole command") {
  const std::string cmd = "*2\r\n$4\r\nECHO\r\n$5\r\nhello\r\n";
  for (std::size_t cut = 1; cut < cmd.size(); ++cut) {
    CAPTURE(cut);
    Refusal r(ClientProtocol::redis, Cause::no_server, "cache");
    CHECK(r.feed({}).status == Refusal::Status::need_more);
    CHECK(feed(r, cmd.substr(0, cut)).status == Refusal::Status::need_more);
    const auto s = feed(r, cmd.substr(cut));
    CHECK(s.status == Refusal::Status::done);
    CHECK(s.send == "-ERR sluice: no server available in upstream \"cache\" (no_server)\r\n");
  }
  // Inline commands end at their line.
  Refusal inl(ClientProtocol::redis, Cause::acl_denied, "cache");
  CHECK(feed(inl, "PIN").status == Refusal::Status::need_more);
  CHECK(feed(inl, "G\r\n").status == Refusal::Status::done);
  // A bulk string's bytes may hold CR LF.
  Refusal bin(ClientProtocol::redis, Cause::no_server, "c");
  CHECK(feed(bin, "*1\r\n$4\r\n\r\n\r\n\r\n").status == Refusal::Status::done);
  Refusal bin2(ClientProtocol::redis, Cause::no_server, "c");
  CHECK(feed(bin2, "*1\r\n$6\r\n\r\n\r\n\r\n").status == Refusal::Status::need_more);
}

TEST_CASE("Redis: protocol errors and oversized requests are answered at once") {
  for (std::string_view bad : {"*x\r\n", "*1\r\n+OK\r\n", "*1\r\n$-1\r\n", "*-1\r\n", "*1\r\n$abc\r\n"}) {
    CAPTURE(bad);
    Refusal r(ClientProtocol::redis, Cause::no_server, "c");
    CHECK(feed(r, bad).status == Refusal::Status::done);
  }
  Refusal big(ClientProtocol::redis, Cause::no_server, "c");
  CHECK(feed(big, "*1\r\n$100000000\r\n").status == Refusal::Status::done);
  // A line that never ends stops at the cap.
  Refusal endless(ClientProtocol::redis, Cause::no_server, "c");
  const std::string chunk(16 * 1024, 'a');
  Refusal::Step s;
  int n = 0;
  while ((s = feed(endless, chunk)).status == Refusal::Status::need_more) ++n;
  CHECK(n == 3);
  CHECK(s.send == endless.reply());
  // A client in TLS is told nothing.
  Refusal tls(ClientProtocol::redis, Cause::no_server, "c");
  const auto t = feed(tls, "\x16\x03\x01");
  CHECK(t.status == Refusal::Status::done);
  CHECK(t.send.empty());
}
