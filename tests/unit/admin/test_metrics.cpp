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
