#include <doctest/doctest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "upgrade/channel.hpp"
#include "upgrade/session_record.hpp"

using namespace sluice::upgrade;

namespace {

struct Pair {
  int fd[2] = {-1, -1};
  Pair() { REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fd) == 0); }
  ~Pair() {
    ::close(fd[0]);
    ::close(fd[1]);
  }
};

// A descriptor whose far end tells it apart: a pipe with `tag` written in.
int tagged(const std::string& tag) {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  REQUIRE(::write(p[1], tag.data(), tag.size()) == static_cast<ssize_t>(tag.size()));
  ::close(p[1]);
  return p[0];
}

std::string read_all(int fd) {
  std::string out(64, '\0');
  const ssize_t n = ::read(fd, out.data(), out.size());
  out.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  return out;
}

SessionRecord sample() {
  SessionRecord r;
  r.worker = 3;
  r.seq = 1ull << 33;
  r.listener = "pg";
  r.upstream = "replicas";
  r.origin_upstream = "primary";
  r.server_identity = std::string("4\0\x7f\0\0\x01:5432", 11);  // any bytes, NULs included
  r.sni = "db.example";
  r.alpn = "postgresql";
  r.bytes_in = 1ull << 40;
  r.bytes_out = 7;
  r.age_ms = 86'400'000;
  r.connect_ms = 3;
  r.idle_ms = 12;
  r.tries = 2;
  return r;
}

}  // namespace

TEST_CASE("a session record goes through the channel whole, its sockets with it") {
  Pair p;
  SessionRecord r = sample();
  const int client = tagged("client");
  const int server = tagged("server");
  REQUIRE(send(p.fd[0], r.to_message(client, server), 1000).empty());
  ::close(client);
  ::close(server);
  Message m;
  std::string err;
  REQUIRE(receive_wait(p.fd[1], m, err, 1000) == RecvStatus::ok);
  SessionRecord got;
  REQUIRE(SessionRecord::from_message(m, got));
  CHECK(got.worker == r.worker);
  CHECK(got.seq == r.seq);
  CHECK(got.listener == r.listener);
  CHECK(got.upstream == r.upstream);
  CHECK(got.origin_upstream == r.origin_upstream);
  CHECK(got.server_identity == r.server_identity);
  CHECK(got.sni == r.sni);
  CHECK(got.alpn == r.alpn);
  CHECK(got.bytes_in == r.bytes_in);
  CHECK(got.bytes_out == r.bytes_out);
  CHECK(got.age_ms == r.age_ms);
  CHECK(got.connect_ms == r.connect_ms);
  CHECK(got.idle_ms == r.idle_ms);
  CHECK(got.tries == r.tries);
  CHECK(got.pending_in == 0);
  CHECK(got.pending_out == 0);
  REQUIRE(m.fds.size() == 2);
  CHECK(read_all(m.fds[0]) == "client");
  CHECK(read_all(m.fds[1]) == "server");
  m.close_fds();
}

TEST_CASE("pending bytes come with a third descriptor, and only with one") {
  Pair p;
  SessionRecord r = sample();
  r.pending_in = 5;
  r.pending_out = 6;
  const int client = tagged("c");
  const int server = tagged("s");
  const int pending = tagged("hello world");
  REQUIRE(send(p.fd[0], r.to_message(client, server, pending), 1000).empty());
  Message m;
  std::string err;
  REQUIRE(receive_wait(p.fd[1], m, err, 1000) == RecvStatus::ok);
  SessionRecord got;
  REQUIRE(SessionRecord::from_message(m, got));
  CHECK(got.pending_in == 5);
  CHECK(got.pending_out == 6);
  REQUIRE(m.fds.size() == 3);
  CHECK(read_all(m.fds[2]) == "hello world");

  // Bytes announced without their file, or a file without bytes: not a record.
  Message short_of_file = m;
  short_of_file.fds.pop_back();
  CHECK_FALSE(SessionRecord::from_message(short_of_file, got));
  Message file_without_bytes = r.to_message(client, server, pending);
  file_without_bytes.fields[16] = "0";
  file_without_bytes.fields[17] = "0";
  CHECK_FALSE(SessionRecord::from_message(file_without_bytes, got));
  m.close_fds();
  ::close(client);
  ::close(server);
  ::close(pending);
}

TEST_CASE("a record with fields missing is refused") {
  SessionRecord r = sample();
  Message m = r.to_message(3, 4);
  m.fields.pop_back();
  SessionRecord got;
  CHECK_FALSE(SessionRecord::from_message(m, got));
  m = r.to_message(3, 4);
  m.kind = Kind::server;
  CHECK_FALSE(SessionRecord::from_message(m, got));
}

TEST_CASE("a record whose id is not a number is refused") {
  Message m = sample().to_message(3, 4);
  m.fields[1] = "x";
  SessionRecord got;
  CHECK_FALSE(SessionRecord::from_message(m, got));
}

TEST_CASE("the new process's answer names the session it is about") {
  Pair p;
  REQUIRE(send(p.fd[0], session_answer(Kind::declined, 2, 99, "no listener \"gone\" here"), 1000).empty());
  REQUIRE(send(p.fd[0], session_answer(Kind::adopted, 1, 100), 1000).empty());
  Message m;
  std::string err;
  std::uint64_t worker = 0, seq = 0;
  REQUIRE(receive_wait(p.fd[1], m, err, 1000) == RecvStatus::ok);
  CHECK(m.kind == Kind::declined);
  REQUIRE(read_session_answer(m, worker, seq));
  CHECK((worker == 2 && seq == 99));
  REQUIRE(m.fields.size() == 3);
  CHECK(m.fields[2] == "no listener \"gone\" here");
  REQUIRE(receive_wait(p.fd[1], m, err, 1000) == RecvStatus::ok);
  CHECK(m.kind == Kind::adopted);
  REQUIRE(read_session_answer(m, worker, seq));
  CHECK((worker == 1 && seq == 100));
  m.kind = Kind::session;
  CHECK_FALSE(read_session_answer(m, worker, seq));
}

TEST_CASE("parse_number takes whole decimal numbers only") {
  std::uint64_t v = 7;
  CHECK(parse_number("0", v));
  CHECK(v == 0);
  CHECK(parse_number("18446744073709551615", v));
  CHECK(v == UINT64_MAX);
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "1.5", "0x10", "18446744073709551616", "12a"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_number(bad, v));
  }
}

TEST_CASE("try_send says full without sending any of the message, and sends once there is room") {
  Pair p;
  Message m;
  m.kind = Kind::counts;
  m.fields = {std::string(1000, 'x')};
  std::string err;
  int sent = 0;
  SendStatus st = SendStatus::ok;
  // Bounded: a SEQPACKET pair holds a few hundred such messages at most.
  while (sent < 100000 && (st = try_send(p.fd[0], m, err)) == SendStatus::ok) ++sent;
  REQUIRE(st == SendStatus::full);
  CHECK(sent > 0);
  CHECK(err == "the other process takes nothing");
  // Every message that went is whole, and the refused one is not there.
  int got = 0;
  Message r;
  std::string rerr;
  while (receive(p.fd[1], r, rerr) == RecvStatus::ok) {
    CHECK(r.fields.size() == 1);
    CHECK(r.fields[0].size() == 1000);
    ++got;
  }
  CHECK(got == sent);
  CHECK(try_send(p.fd[0], m, err) == SendStatus::ok);
  CHECK(receive(p.fd[1], r, rerr) == RecvStatus::ok);
}

TEST_CASE("try_send to a closed peer is an error, not full") {
  Pair p;
  ::close(p.fd[1]);
  p.fd[1] = ::dup(p.fd[0]);  // something for the destructor to close
  ::shutdown(p.fd[0], SHUT_RDWR);
  Message m;
  m.kind = Kind::released;
  std::string err;
  CHECK(try_send(p.fd[0], m, err) == SendStatus::error);
  CHECK_FALSE(err.empty());
}
