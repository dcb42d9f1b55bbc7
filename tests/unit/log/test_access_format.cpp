#include <doctest/doctest.h>

#include <algorithm>
#include <iterator>
#include <string>

#include "log/access_log.hpp"

using sluice::AccessLog;
using sluice::AccessRecord;

namespace {
AccessRecord hostile() {
  AccessRecord r;
  r.listener = "tls";
  r.client = "127.0.0.1:5000";
  r.server = "127.0.0.1:6000";
  r.sni = "a.example";
  r.alpn = "h2\n2026-01-01T00:00:00.000 listener=tls client=6.6.6.6:1 cause=ok";
  r.tries = 1;
  r.cause = sluice::Cause::client_closed;
  return r;
}
}  // namespace

TEST_CASE("a text record stays one line with one field per key") {
  const std::string line = AccessLog::format_text(hostile());
  CHECK(line.find('\n') == std::string::npos);
  CHECK(line.find(" client=") == line.rfind(" client="));  // the forged one has no real space
  CHECK(line.find("alpn=h2\\x0a2026-01-01T00:00:00.000\\x20listener=tls") != std::string::npos);
  CHECK(line.find(" cause=client_closed") != std::string::npos);
}

TEST_CASE("empty values are a dash") {
  AccessRecord r;
  r.listener = "main";
  const std::string line = AccessLog::format_text(r);
  CHECK(line.find("client=- server=- sni=- alpn=-") != std::string::npos);
}

TEST_CASE("a JSON record has no raw control bytes") {
  const std::string body = AccessLog::format_json(hostile());
  for (char c : body) CHECK(static_cast<unsigned char>(c) >= 0x20);
  CHECK(body.find("\"alpn\":\"h2\\n2026") != std::string::npos);
}

TEST_CASE("without log_phases a record has no phase fields") {
  const std::string line = AccessLog::format_text(hostile());
  CHECK(line.find("_us=") == std::string::npos);
  CHECK(AccessLog::format_json(hostile()).find("_us\"") == std::string::npos);
}

TEST_CASE("log_phases: the loop turn, then each phase in microseconds, -1 where not reached") {
  sluice::PhaseTimes p{};
  std::fill(std::begin(p.at_us), std::end(p.at_us), -1);
  p.turn_us = 7;
  p.turn_events = 3;
  p.at_us[static_cast<std::size_t>(sluice::Phase::pick)] = 12;
  p.at_us[static_cast<std::size_t>(sluice::Phase::connect)] = 30;
  p.at_us[static_cast<std::size_t>(sluice::Phase::close)] = 900;
  AccessRecord r = hostile();
  r.phases = &p;
  const std::string line = AccessLog::format_text(r);
  CHECK(line.ends_with(" cause=client_closed turn_us=7 turn_events=3 pick_us=12 connect_us=30 connected_us=-1"
                       " first_in_us=-1 first_out_us=-1 close_us=900"));
  const std::string body = AccessLog::format_json(r);
  CHECK(body.ends_with(",\"cause\":\"client_closed\",\"turn_us\":7,\"turn_events\":3,\"pick_us\":12,"
                       "\"connect_us\":30,\"connected_us\":-1,\"first_in_us\":-1,\"first_out_us\":-1,"
                       "\"close_us\":900"));
}
