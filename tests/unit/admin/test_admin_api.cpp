// The admin API's routing, authentication and server actions, driven
// without sockets through AdminApi::handle.
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "tests/unit/admin/fixture.hpp"

using namespace sluice;
using namespace sluice::admin;
using sluice::admin::testing::Fixture;
using sluice::admin::testing::request;

TEST_CASE("routes answer with the right status and Allow header") {
  Fixture f;
  AdminApi api(f.hooks());
  CHECK(api.handle(request("GET", "/status")).status == 200);
  CHECK(api.handle(request("GET", "/metrics")).status == 200);
  CHECK(api.handle(request("GET", "/")).content_type.starts_with("text/html"));
  CHECK(api.handle(request("GET", "/nope")).status == 404);
  const Response r = api.handle(request("GET", "/reload"));
  CHECK(r.status == 405);
  REQUIRE(r.headers.size() == 1);
  CHECK(r.headers[0] == std::pair<std::string, std::string>("Allow", "POST"));
  CHECK(api.handle(request("POST", "/status")).status == 405);
  CHECK(api.handle(request("POST", "/upstreams/pg/servers/127.0.0.1:5001/weight")).status == 405);
  CHECK(api.handle(request("PUT", "/upstreams/pg/servers/127.0.0.1:5001/drain")).status == 405);
  CHECK(api.handle(request("POST", "/upstreams/pg/servers/127.0.0.1:5001/explode")).status == 404);
}

TEST_CASE("a failed reload or PUT /config is a 400 with the position") {
  Fixture f;
  AdminApi api(f.hooks());
  const Response r = api.handle(request("POST", "/reload"));
  CHECK(r.status == 400);
  CHECK(nlohmann::json::parse(r.body)["error"] == "t.toml:3:1: bad");
  CHECK(f.reloads == 1);
  CHECK(api.handle(request("PUT", "/config", "broken")).status == 400);
  CHECK(api.handle(request("PUT", "/config", "ok")).status == 200);
}

TEST_CASE("with a token every request needs it") {
  Fixture f;
  AdminApi api(f.hooks());
  api.set_token("s3cret");
  Request r = request("GET", "/status");
  CHECK(api.handle(r).status == 401);
  r.headers["authorization"] = "Bearer wrong!";
  CHECK(api.handle(r).status == 401);
  r.headers["authorization"] = "Bearer s3cre";
  CHECK(api.handle(r).status == 401);
  r.headers["authorization"] = "Basic s3cret";
  CHECK(api.handle(r).status == 401);
  r.headers["authorization"] = "Bearer s3cret";
  CHECK(api.handle(r).status == 200);
  CHECK_FALSE(api.authorize(r).has_value());
  r.headers["authorization"] = "Basic YWRtaW46czNjcmV0";  // admin:s3cret
  CHECK(api.handle(r).status == 200);
}

TEST_CASE("a refused request is told how to log in, browser and script alike") {
  Fixture f;
  AdminApi api(f.hooks());
  api.set_token("s3cret");
  const std::optional<Response> refused = api.authorize(request("GET", "/"));
  REQUIRE(refused.has_value());
  CHECK(refused->status == 401);
  using Header = std::pair<std::string, std::string>;
  REQUIRE(refused->headers.size() == 2);
  CHECK(refused->headers[0] == Header("WWW-Authenticate", "Basic realm=\"sluice\""));
  CHECK(refused->headers[1] == Header("WWW-Authenticate", "Bearer realm=\"sluice\""));

  AdminApi open(f.hooks());  // no token: nothing to authorize
  CHECK_FALSE(open.authorize(request("GET", "/")).has_value());
}

TEST_CASE("the token an Authorization header presents") {
  struct Case {
    const char* header;
    std::optional<std::string> token;
  };
  const Case cases[] = {
      {"Bearer abc", "abc"},
      {"bearer abc", "abc"},
      {"BEARER abc", "abc"},
      {"Bearer   abc  ", "abc"},
      {"Bearer\tabc", "abc"},
      {"Basic YWRtaW46czNjcmV0", "s3cret"},          // admin:s3cret
      {"basic YWRtaW46czNjcmV0", "s3cret"},
      {"Basic OnMzY3JldA==", "s3cret"},              // :s3cret (no user name)
      {"Basic OnMzY3JldA", "s3cret"},                // the same without padding
      {"Basic dTpzM2NyZXQ6d2l0aDpjb2xvbnM=", "s3cret:with:colons"},  // u:s3cret:with:colons
      {"Basic czNjcmV0Og==", ""},                    // s3cret: (the token as the user name)
      {"Basic czNjcmV0", std::nullopt},              // s3cret: no colon
      {"Basic !!!!", std::nullopt},
      {"Basic YWRtaW46czNjcmV0Q", std::nullopt},     // one character too many
      {"Bearer", std::nullopt},
      {"Bearer   ", std::nullopt},
      {"Bearerabc", std::nullopt},
      {"Digest abc", std::nullopt},
      {"abc", std::nullopt},
      {"", std::nullopt},
  };
  for (const auto& c : cases) {
    CAPTURE(c.header);
    CHECK(presented_token(c.header) == c.token);
  }
}

TEST_CASE("drain, disable, enable and weight change the server's long-lived state") {
  Fixture f;
  AdminApi api(f.hooks());
  ServerState& a = f.snapshot->find_upstream("pg")->server(0);
  ServerState& b = f.snapshot->find_upstream("pg")->server(1);

  Response r = api.handle(request("POST", "/upstreams/pg/servers/127.0.0.1:5001/drain"));
  CHECK(r.status == 200);
  CHECK(nlohmann::json::parse(r.body)["state"] == "drained");
  CHECK(a.admin() == AdminState::drain);
  CHECK(f.closed.empty());

  // IPv6 by the file's text, percent-encoded, or another spelling of it.
  CHECK(api.handle(request("POST", "/upstreams/pg/servers/%5B%3A%3A1%5D%3A5002/disable")).status == 200);
  CHECK(b.admin() == AdminState::disabled);
  REQUIRE(f.closed.size() == 1);
  CHECK(f.closed[0] == std::pair<std::string, Cause>("[::1]:5002", Cause::server_drained));
  CHECK(api.handle(request("POST", "/upstreams/pg/servers/[0:0::1]:5002/enable")).status == 200);
  CHECK(b.admin() == AdminState::enabled);

  CHECK(api.handle(request("PUT", "/upstreams/pg/servers/127.0.0.1:5001/weight", "7")).status == 200);
  CHECK(a.weight_override() == 7);
  CHECK(api.handle(request("PUT", "/upstreams/pg/servers/127.0.0.1:5001/weight", R"({"weight": 9})")).status == 200);
  CHECK(a.weight_override() == 9);
  for (const char* bad : {"0", "1001", "abc", "", "2.5", R"({"w": 3})", "-4"}) {
    CAPTURE(bad);
    CHECK(api.handle(request("PUT", "/upstreams/pg/servers/127.0.0.1:5001/weight", bad)).status == 400);
  }
  CHECK(a.weight_override() == 9);

  CHECK(api.handle(request("POST", "/upstreams/nope/servers/127.0.0.1:5001/drain")).status == 404);
  CHECK(api.handle(request("POST", "/upstreams/pg/servers/127.0.0.1:9/drain")).status == 404);
  CHECK(api.handle(request("POST", "/upstreams/pg/servers/not-an-address/drain")).status == 404);
}

TEST_CASE("status JSON reports servers with state, weights and counters") {
  Fixture f;
  Upstream* up = f.snapshot->find_upstream("pg");
  up->server(1).total_sessions = 4;
  up->server(1).bytes_out = 1234;
  up->server(0).set_admin(AdminState::drain);
  f.info.listener_addresses["front"] = "127.0.0.1:4000";
  const nlohmann::json s = status_json(*f.snapshot, f.info, Clock::now(), 3500);
  CHECK(s["uptime_seconds"] == 2.5);
  CHECK(s["config"]["generation"] == 1);
  CHECK(s["listeners"][0]["address"] == "127.0.0.1:4000");
  const auto& servers = s["upstreams"][0]["servers"];
  REQUIRE(servers.size() == 2);
  CHECK(servers[0]["state"] == "drained");
  CHECK(servers[1]["address"] == "[::1]:5002");
  CHECK(servers[1]["weight"] == 3);
  CHECK(servers[1]["total_sessions"] == 4);
  CHECK(servers[1]["bytes_out"] == 1234);
}

TEST_CASE("the status page escapes everything it shows") {
  Fixture f;
  f.info.reload_attempted = true;
  f.info.reload_message = "t.toml:1:1: <script>alert(1)</script> & \"x\"";
  const std::string page = status_page(status_json(*f.snapshot, f.info, Clock::now(), 2000), 2000);
  CHECK(page.find("<script>alert") == std::string::npos);
  CHECK(page.find("&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;x&quot;") != std::string::npos);
  CHECK(page.find("data-server=\"[::1]:5002\"") != std::string::npos);
  CHECK(page.find("class=\"state-up\"") != std::string::npos);
  CHECK(page.find("http-equiv=\"refresh\"") != std::string::npos);
}

TEST_CASE("GET /upstreams/U and /upstreams/U/servers/ADDR answer JSON, 404 for the unknown") {
  Fixture f;
  AdminApi api(f.hooks());
  f.snapshot->find_upstream("pg")->server(1).set_admin(AdminState::drain);
  Response r = api.handle(request("GET", "/upstreams/pg"));
  REQUIRE(r.status == 200);
  nlohmann::json j = nlohmann::json::parse(r.body);
  CHECK(j["name"] == "pg");
  CHECK(j["balance"] == "least_conn");
  REQUIRE(j["servers"].size() == 2);
  CHECK(j["servers"][1]["state"] == "drained");
  r = api.handle(request("GET", "/upstreams/pg/servers/%5B%3A%3A1%5D%3A5002"));
  REQUIRE(r.status == 200);
  j = nlohmann::json::parse(r.body);
  CHECK(j["address"] == "[::1]:5002");
  CHECK(j["state"] == "drained");
  CHECK(j["weight"] == 3);
  CHECK(j["last_check"].is_null());
  CHECK(api.handle(request("GET", "/upstreams/pg/servers/[0::1]:5002")).status == 200);
  CHECK(api.handle(request("GET", "/upstreams/nope")).status == 404);
  CHECK(api.handle(request("GET", "/upstreams/pg/servers/127.0.0.1:9")).status == 404);
  CHECK(api.handle(request("GET", "/upstreams/nope/servers/127.0.0.1:5001")).status == 404);
  const Response wrong = api.handle(request("POST", "/upstreams/pg"));
  CHECK(wrong.status == 405);
  CHECK(api.handle(request("DELETE", "/upstreams/pg/servers/127.0.0.1:5001")).status == 405);
}

TEST_CASE("a change asked for by another site's page is refused; scripts and the page itself pass") {
  Fixture f;
  AdminApi api(f.hooks());
  ServerState& a = f.snapshot->find_upstream("pg")->server(0);
  Request r = request("POST", "/upstreams/pg/servers/127.0.0.1:5001/drain");
  r.headers["host"] = "127.0.0.1:9090";
  r.headers["origin"] = "http://evil.example";
  CHECK(api.handle(r).status == 403);
  CHECK(a.admin() == AdminState::enabled);
  r.headers["origin"] = "http://127.0.0.1:9090";
  CHECK(api.handle(r).status == 200);
  CHECK(a.admin() == AdminState::drain);
  r = request("POST", "/upstreams/pg/servers/127.0.0.1:5001/enable");  // no Origin: a script
  CHECK(api.handle(r).status == 200);
  r = request("GET", "/status");
  r.headers["origin"] = "http://evil.example";
  CHECK(api.handle(r).status == 200);  // reading changes nothing
}

TEST_CASE("rates come from per-second samples over a fixed window, whoever looks") {
  RateWindow w;
  const TimePoint t0 = TimePoint{} + std::chrono::hours(1);
  CHECK_FALSE(w.rate("a").has_value());
  w.add(t0, {{"a", 100}});
  CHECK_FALSE(w.rate("a").has_value());  // one sample: no rate yet
  for (int i = 1; i <= 20; ++i) w.add(t0 + std::chrono::seconds(i), {{"a", 100 + 5 * static_cast<unsigned>(i)}});
  REQUIRE(w.rate("a").has_value());
  CHECK(*w.rate("a") == doctest::Approx(5.0));
  CHECK(*w.rate("a") == doctest::Approx(5.0));  // reading twice changes nothing
  // Only the last 10 s count: a burst long ago is forgotten.
  for (int i = 21; i <= 31; ++i) w.add(t0 + std::chrono::seconds(i), {{"a", 200}, {"b", 7}});
  CHECK(*w.rate("a") == doctest::Approx(0.0));
  CHECK(*w.rate("b") == doctest::Approx(0.0));
  CHECK_FALSE(w.rate("c").has_value());
  w.add(t0 + std::chrono::seconds(32), {{"a", 3}});  // a counter that went back (a new owner): no rate
  CHECK_FALSE(w.rate("a").has_value());
}

TEST_CASE("AdminApi::tick feeds the page's and /status's rates") {
  Fixture f;
  AdminApi api(f.hooks());
  ListenerStats& ls = *f.snapshot->listeners[0].stats;
  ServerState& a = f.snapshot->find_upstream("pg")->server(0);
  const TimePoint t0 = Clock::now();
  for (int i = 0; i <= 10; ++i) {
    ls.accepted = 20 * static_cast<unsigned>(i);
    a.total_sessions = 3 * static_cast<unsigned>(i);
    api.tick(t0 + std::chrono::seconds(i));
  }
  const nlohmann::json s = nlohmann::json::parse(api.handle(request("GET", "/status")).body);
  CHECK(s["listeners"][0]["conn_per_s"].get<double>() == doctest::Approx(20.0));
  CHECK(s["upstreams"][0]["servers"][0]["sessions_per_s"].get<double>() == doctest::Approx(3.0));
  CHECK(s["upstreams"][0]["servers"][1]["sessions_per_s"].get<double>() == doctest::Approx(0.0));
  // A second viewer sees the same rate.
  const nlohmann::json again = nlohmann::json::parse(api.handle(request("GET", "/status")).body);
  CHECK(again["listeners"][0]["conn_per_s"].get<double>() == doctest::Approx(20.0));
  const std::string page = api.handle(request("GET", "/")).body;
  CHECK(page.find(">20.0</td>") != std::string::npos);
}

TEST_CASE("durations read as people read them") {
  CHECK(human_duration(0) == "0s");
  CHECK(human_duration(42.7) == "42s");
  CHECK(human_duration(307) == "5m 7s");
  CHECK(human_duration(3 * 3600 + 60 * 5 + 9) == "3h 5m");
  CHECK(human_duration(3 * 86400 + 4 * 3600 + 12 * 60 + 59) == "3d 4h 12m");
}

TEST_CASE("the page shows peaks, limits, the last check, downtime and a button per action") {
  Fixture f("health = { type = \"tcp\" }\n");
  Upstream* up = f.snapshot->find_upstream("pg");
  ServerState& a = up->server(0);
  a.peak_active = 7;
  a.record_check("tcp", CheckResult::fail, 0.004, "connect refused");
  up->server(1).set_admin(AdminState::disabled);
  const std::int64_t now = wall_ms();
  f.info.started_at_ms = now - (2 * 86400 + 3 * 3600 + 4 * 60) * 1000LL;
  const std::string page = status_page(status_json(*f.snapshot, f.info, Clock::now(), now), now);
  CHECK(page.find("2d 3h 4m") != std::string::npos);
  CHECK(page.find("<span class=\"chk-fail\">fail</span> tcp 4.0 ms, 0s ago") != std::string::npos);
  CHECK(page.find("title=\"connect refused\"") != std::string::npos);
  CHECK(page.find(">7</td>") != std::string::npos);
  // Every upstream table has the same columns in the same widths.
  CHECK(page.find("table-layout:fixed") != std::string::npos);
  CHECK(page.find("<colgroup>") != std::string::npos);
  // An enabled server can be drained or disabled; a disabled one enabled.
  const std::size_t row_a = page.find("data-server=\"127.0.0.1:5001\"");
  const std::size_t row_b = page.find("data-server=\"[::1]:5002\"");
  REQUIRE(row_a != std::string::npos);
  REQUIRE(row_b != std::string::npos);
  const std::string a_row = page.substr(row_a, page.find("</tr>", row_a) - row_a);
  const std::string b_row = page.substr(row_b, page.find("</tr>", row_b) - row_b);
  CHECK(a_row.find("data-action=\"drain\"") != std::string::npos);
  CHECK(a_row.find("data-action=\"enable\"") == std::string::npos);
  CHECK(b_row.find("data-action=\"enable\"") != std::string::npos);
  CHECK(b_row.find("data-action=\"disable\"") == std::string::npos);
  CHECK(b_row.find("data-action=\"weight\"") != std::string::npos);
}

TEST_CASE("a change whose Host is not this API's name is refused before it is made (DNS rebinding)") {
  Fixture f;
  AdminApi api(f.hooks());
  ServerState& a = f.snapshot->find_upstream("pg")->server(0);
  AdminConfig c;
  c.listen.host = "127.0.0.1";
  c.listen.port = 9090;
  c.allowed_hosts = {"lb1.example"};
  api.set_allowed_hosts(allowed_hosts(c, 9090));
  // The page's own name in Host and Origin alike: they match each other.
  for (const char* path : {"/upstreams/pg/servers/127.0.0.1:5001/drain", "/reload", "/healthcheck/fail"}) {
    CAPTURE(path);
    Request r = request("POST", path);
    r.headers["host"] = "rebind.attacker.example:9090";
    r.headers["origin"] = "http://rebind.attacker.example:9090";
    const std::optional<Response> refused = api.authorize(r);
    REQUIRE(refused.has_value());
    CHECK(refused->status == 421);
    CHECK(api.handle(r).status == 421);
    r.headers.erase("host");  // HTTP/1.0 may send none
    CHECK(api.handle(r).status == 421);
  }
  CHECK(a.admin() == AdminState::enabled);
  CHECK(f.reloads == 0);
  CHECK(f.info.ready);
  Request r = request("PUT", "/config", "ok");
  r.headers["host"] = "lb1.example:9090";  // listed
  CHECK(api.handle(r).status == 200);
  r = request("GET", "/status");
  r.headers["host"] = "rebind.attacker.example:9090";
  CHECK(api.handle(r).status == 200);  // reading changes nothing
  // With the token, an unauthenticated client learns nothing more than 401.
  api.set_token("s3cret");
  r = request("POST", "/reload");
  r.headers["host"] = "rebind.attacker.example";
  CHECK(api.handle(r).status == 401);
  r.headers["authorization"] = "Bearer s3cret";
  CHECK(api.handle(r).status == 421);
}

TEST_CASE("who asked: the address, and the Basic user name when one is given") {
  Request r = request("POST", "/reload");
  r.peer = "127.0.0.1:5555";
  CHECK(requester(r) == "127.0.0.1:5555");
  r.headers["authorization"] = "Bearer s3cret";
  CHECK(requester(r) == "127.0.0.1:5555");
  r.headers["authorization"] = "Basic YWRtaW46czNjcmV0";  // admin:s3cret
  CHECK(requester(r) == "127.0.0.1:5555 as user \"admin\"");
  r.headers["authorization"] = "Basic OnMzY3JldA==";  // :s3cret
  CHECK(requester(r) == "127.0.0.1:5555");
  r.headers["authorization"] = "Basic YQpiIGM6eA==";  // "a\nb c:x"
  CHECK(requester(r) == "127.0.0.1:5555 as user \"a\\x0ab\\x20c\"");
  r.headers["authorization"] = "Basic !!!";
  CHECK(requester(r) == "127.0.0.1:5555");
}

TEST_CASE("PUT /config: a failed body without a line break gets the --data-binary hint") {
  CHECK(put_config_hint("# sluice[global]workers = 2[[listener]]").find("--data-binary") != std::string::npos);
  CHECK(put_config_hint("[global]\nworkers = 2").empty());
  CHECK(put_config_hint("").empty());
  Fixture f;
  AdminApi api(f.hooks());
  Response r = api.handle(request("PUT", "/config", "# all one line[[listener]]"));
  REQUIRE(r.status == 400);
  nlohmann::json doc = nlohmann::json::parse(r.body);
  CHECK(doc["error"] == "t.toml:1:2: no");
  CHECK(doc["hint"].get<std::string>().find("--data-binary") != std::string::npos);
  r = api.handle(request("PUT", "/config", "# two\nlines"));
  REQUIRE(r.status == 400);
  CHECK_FALSE(nlohmann::json::parse(r.body).contains("hint"));
}
