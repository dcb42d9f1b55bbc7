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
  const std::string page = status_page(status_json(*f.snapshot, f.info, Clock::now(), 2000), {});
  CHECK(page.find("<script>") == std::string::npos);
  CHECK(page.find("&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;x&quot;") != std::string::npos);
  CHECK(page.find("data-server=\"[::1]:5002\"") != std::string::npos);
  CHECK(page.find("class=\"state-up\"") != std::string::npos);
  CHECK(page.find("http-equiv=\"refresh\"") != std::string::npos);
}
