// The Prometheus text exposition: families, escaping, cumulative histograms.
#include <doctest/doctest.h>

#include <sstream>

#include "tests/unit/admin/fixture.hpp"

using namespace sluice;
using namespace sluice::admin;
using sluice::admin::testing::Fixture;

namespace {

// The value of the sample line that starts with `series` (name and labels), or -1.
double value_of(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 && line[series.size()] == ' ') {
      return std::stod(line.substr(series.size() + 1));
    }
  }
  return -1;
}

}  // namespace

TEST_CASE("counters and gauges carry the data path's numbers") {
  Fixture f;
  Upstream* up = f.snapshot->find_upstream("pg");
  up->server(0).total_sessions = 5;
  up->server(0).active = 2;
  f.snapshot->listeners[0].stats->accepted = 6;
  f.snapshot->listeners[0].stats->closed.add(Cause::client_closed);
  f.info.reloads_failed = 1;
  f.info.reload_attempted = true;
  const std::string m = metrics_text(*f.snapshot, f.info, Clock::now());
  CHECK(value_of(m, R"(sluice_server_sessions_total{upstream="pg",server="127.0.0.1:5001"})") == 5);
  CHECK(value_of(m, R"(sluice_server_active_sessions{upstream="pg",server="127.0.0.1:5001"})") == 2);
  CHECK(value_of(m, R"(sluice_server_weight{upstream="pg",server="[::1]:5002"})") == 3);
  CHECK(value_of(m, R"(sluice_listener_accepted_total{listener="front"})") == 6);
  CHECK(value_of(m, R"(sluice_listener_closed_total{listener="front",cause="client_closed"})") == 1);
  CHECK(value_of(m, R"(sluice_reloads_total{result="error"})") == 1);
  CHECK(value_of(m, "sluice_config_last_reload_successful") == 0);
  CHECK(m.find("# TYPE sluice_server_connect_seconds histogram\n") != std::string::npos);
  // Each family's TYPE appears once.
  CHECK(m.find("# TYPE sluice_server_up gauge") == m.rfind("# TYPE sluice_server_up gauge"));
}

TEST_CASE("histogram buckets are cumulative and +Inf equals the count") {
  Fixture f;
  ServerState& s = f.snapshot->find_upstream("pg")->server(0);
  s.observe_connect(0.0003);  // first bucket
  s.observe_connect(0.003);   // le 0.005
  s.observe_connect(9.0);     // only +Inf
  const std::string m = metrics_text(*f.snapshot, f.info, Clock::now());
  const std::string base = R"(sluice_server_connect_seconds_bucket{upstream="pg",server="127.0.0.1:5001",le=")";
  CHECK(value_of(m, base + R"(0.0005"})") == 1);
  CHECK(value_of(m, base + R"(0.0025"})") == 1);
  CHECK(value_of(m, base + R"(0.005"})") == 2);
  CHECK(value_of(m, base + R"(2.5"})") == 2);
  CHECK(value_of(m, base + R"(+Inf"})") == 3);
  CHECK(value_of(m, R"(sluice_server_connect_seconds_count{upstream="pg",server="127.0.0.1:5001"})") == 3);
  CHECK(value_of(m, R"(sluice_server_connect_seconds_sum{upstream="pg",server="127.0.0.1:5001"})") ==
        doctest::Approx(9.0033).epsilon(1e-6));
}

TEST_CASE("active checks: the last result, failures and a duration histogram per checked server") {
  Fixture f("health = { type = \"tcp\" }\n");
  ServerState& a = f.snapshot->find_upstream("pg")->server(0);
  ServerState& b = f.snapshot->find_upstream("pg")->server(1);
  a.record_check("tcp", CheckResult::pass, 0.002, "connected");
  a.record_check("tcp", CheckResult::fail, 0.02, "connect refused");
  b.record_check("tcp", CheckResult::fail, 0.02, "connect refused");
  b.record_check("tcp", CheckResult::pass, 0.003, "connected");
  b.record_check("tcp", CheckResult::local_error, 0.0, "out of descriptors");  // not the server's
  const std::string m = metrics_text(*f.snapshot, f.info, Clock::now());
  const std::string sa = R"({upstream="pg",server="127.0.0.1:5001"})";
  const std::string sb = R"({upstream="pg",server="[::1]:5002"})";
  CHECK(value_of(m, "sluice_server_check_success" + sa) == 0);
  CHECK(value_of(m, "sluice_server_check_success" + sb) == 0);  // the last check could not run
  CHECK(value_of(m, "sluice_server_check_failures_total" + sa) == 1);
  CHECK(value_of(m, "sluice_server_check_failures_total" + sb) == 1);
  CHECK(value_of(m, "sluice_server_check_seconds_count" + sb) == 2);
  CHECK(value_of(m, R"(sluice_server_check_seconds_bucket{upstream="pg",server="127.0.0.1:5001",le="0.0025"})") == 1);
  CHECK(value_of(m, R"(sluice_server_check_seconds_bucket{upstream="pg",server="127.0.0.1:5001",le="+Inf"})") == 2);
  CHECK(value_of(m, "sluice_server_check_seconds_sum" + sa) == doctest::Approx(0.022));
}

TEST_CASE("no check series for an upstream without checks") {
  Fixture f;
  const std::string m = metrics_text(*f.snapshot, f.info, Clock::now());
  CHECK(m.find("sluice_server_check_seconds_bucket{") == std::string::npos);
  CHECK(m.find("sluice_server_check_success{") == std::string::npos);
}

TEST_CASE("session durations per listener, peaks and downtime") {
  Fixture f;
  ListenerStats& ls = *f.snapshot->listeners[0].stats;
  ls.session_seconds.observe(0.05);
  ls.session_seconds.observe(7200);
  ServerState& a = f.snapshot->find_upstream("pg")->server(0);
  a.peak_active = 4;
  const std::string m = metrics_text(*f.snapshot, f.info, Clock::now());
  CHECK(value_of(m, R"(sluice_listener_session_seconds_bucket{listener="front",le="0.1"})") == 1);
  CHECK(value_of(m, R"(sluice_listener_session_seconds_bucket{listener="front",le="3600"})") == 1);
  CHECK(value_of(m, R"(sluice_listener_session_seconds_bucket{listener="front",le="21600"})") == 2);
  CHECK(value_of(m, R"(sluice_listener_session_seconds_count{listener="front"})") == 2);
  CHECK(value_of(m, R"(sluice_server_peak_sessions{upstream="pg",server="127.0.0.1:5001"})") == 4);
  CHECK(value_of(m, R"(sluice_server_downtime_seconds_total{upstream="pg",server="127.0.0.1:5001"})") == 0);
}

TEST_CASE("per SNI route: the configured routes and the default, never the client's names") {
  Registry registry;
  const std::string text =
      "[global]\naccess_log = \"off\"\n"
      "[[listener]]\nname = \"tls\"\nlisten = \"127.0.0.1:0\"\npreread = \"tls\"\n"
      "routes = [{ sni = \"db.example.com\", upstream = \"pg\" }, { sni = \"*.example.com\", upstream = \"web\" }]\n"
      "default_upstream = \"web\"\n"
      "[upstream.pg]\nservers = [{ address = \"127.0.0.1:5001\" }]\n"
      "[upstream.web]\nservers = [{ address = \"127.0.0.1:5002\" }]\n";
  auto snap = Snapshot::build(std::make_shared<const Config>(parse_config(text, "t.toml")), registry, 1);
  const ListenerView& l = snap->listeners[0];
  REQUIRE(l.route_stats.size() == 2);
  REQUIRE(l.router->match_index("a.example.com") == 1);
  REQUIRE(l.router->match_index("DB.example.com.") == 0);
  CHECK(l.router->match_index("example.org") == -1);
  l.route_stats[1]->sessions = 3;
  l.route_stats[1]->bytes_out = 900;
  l.default_route_stats->sessions = 2;
  ProcessInfo info;
  const std::string m = metrics_text(*snap, info, Clock::now());
  CHECK(value_of(m, R"(sluice_route_sessions_total{listener="tls",route="*.example.com",upstream="web"})") == 3);
  CHECK(value_of(m, R"(sluice_route_bytes_out_total{listener="tls",route="*.example.com",upstream="web"})") == 900);
  CHECK(value_of(m, R"(sluice_route_sessions_total{listener="tls",route="db.example.com",upstream="pg"})") == 0);
  CHECK(value_of(m, R"x(sluice_route_sessions_total{listener="tls",route="(default)",upstream="web"})x") == 2);
  // A reload keeps the counters of the routes that stay.
  auto again = Snapshot::build(std::make_shared<const Config>(parse_config(text, "t.toml")), registry, 2);
  CHECK(again->listeners[0].route_stats[1]->sessions == 3);
}

TEST_CASE("ALPN routes are series of their own, apart from their host's route and the default") {
  Registry registry;
  const std::string text =
      "[global]\naccess_log = \"off\"\n"
      "[[listener]]\nname = \"tls\"\nlisten = \"127.0.0.1:0\"\npreread = \"tls\"\n"
      "routes = [{ sni = \"db.example.com\", alpn = \"postgresql\", upstream = \"pg\" },"
      " { sni = \"db.example.com\", upstream = \"web\" }, { alpn = \"h2\", upstream = \"web\" }]\n"
      "default_upstream = \"web\"\n"
      "[upstream.pg]\nservers = [{ address = \"127.0.0.1:5001\" }]\n"
      "[upstream.web]\nservers = [{ address = \"127.0.0.1:5002\" }]\n";
  auto snap = Snapshot::build(std::make_shared<const Config>(parse_config(text, "t.toml")), registry, 1);
  const ListenerView& l = snap->listeners[0];
  REQUIRE(l.route_stats.size() == 3);
  CHECK(l.route_stats[0] != l.route_stats[1]);
  CHECK(l.route_stats[2] != l.default_route_stats);
  CHECK(l.router->match_index("db.example.com", {"h2", "postgresql"}) == 0);
  CHECK(l.router->match_index("db.example.com", {"h2"}) == 1);
  CHECK(l.router->match_index("www.example.com", {"h2"}) == 2);
  CHECK(l.router->match_index("www.example.com", {}) == -1);
  l.route_stats[0]->sessions = 5;
  l.route_stats[2]->sessions = 7;
  ProcessInfo info;
  const std::string m = metrics_text(*snap, info, Clock::now());
  CHECK(value_of(m, R"(sluice_route_sessions_total{listener="tls",route="db.example.com alpn=postgresql",upstream="pg"})") ==
        5);
  CHECK(value_of(m, R"(sluice_route_sessions_total{listener="tls",route="db.example.com",upstream="web"})") == 0);
  CHECK(value_of(m, R"(sluice_route_sessions_total{listener="tls",route="alpn=h2",upstream="web"})") == 7);
  CHECK(value_of(m, R"x(sluice_route_sessions_total{listener="tls",route="(default)",upstream="web"})x") == 0);
}

TEST_CASE("server states: one gauge per state; up only for a server that takes sessions") {
  Fixture f;
  Upstream* up = f.snapshot->find_upstream("pg");
  up->server(0).set_active(ActiveState::standby, "role is standby, want primary");
  up->server(1).set_active(ActiveState::up, "role is primary");
  up->server(1).fence(FenceKind::lost, "10.0.0.9:5432", "timeline 2 > timeline 1");
  const std::string m = metrics_text(*f.snapshot, f.info, Clock::now());
  const std::string a = R"({upstream="pg",server="127.0.0.1:5001")";
  const std::string b = R"({upstream="pg",server="[::1]:5002")";
  for (const char* state : {"up", "standby", "down", "fenced", "drained", "disabled"}) {
    CHECK(value_of(m, "sluice_server_state" + a + ",state=\"" + state + "\"}") == (std::string(state) == "standby"));
    CHECK(value_of(m, "sluice_server_state" + b + ",state=\"" + state + "\"}") == (std::string(state) == "fenced"));
  }
  CHECK(value_of(m, "sluice_server_up" + a + "}") == 0);
  CHECK(value_of(m, "sluice_server_up" + b + "}") == 0);
  CHECK(value_of(m, "sluice_server_fenced" + a + "}") == 0);
  CHECK(value_of(m, "sluice_server_fenced" + b + "}") == 1);
  up->server(1).unfence("it no longer says it is the primary");
  const std::string after = metrics_text(*f.snapshot, f.info, Clock::now());
  CHECK(value_of(after, "sluice_server_up" + b + "}") == 1);
  CHECK(value_of(after, "sluice_server_state" + b + ",state=\"up\"}") == 1);
}
