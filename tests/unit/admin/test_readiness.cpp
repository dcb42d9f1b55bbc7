// Readiness for a front tier: GET /ready, POST /healthcheck/{fail,ok}, and
// the same bit in /status and /metrics, driven through AdminApi::handle.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "tests/unit/admin/fixture.hpp"

using namespace sluice;
using namespace sluice::admin;
using sluice::admin::testing::Fixture;
using sluice::admin::testing::request;

namespace {

Response with_token(AdminApi& api, Request r, const std::string& token) {
  r.headers["authorization"] = "Bearer " + token;
  return api.handle(r);
}

}  // namespace

TEST_CASE("GET /ready follows /healthcheck/fail and /healthcheck/ok") {
  Fixture f;
  AdminApi api(f.hooks());
  Response r = api.handle(request("GET", "/ready"));
  CHECK(r.status == 200);
  CHECK(nlohmann::json::parse(r.body)["ready"] == true);
  CHECK(api.handle(request("HEAD", "/ready")).status == 200);

  r = api.handle(request("POST", "/healthcheck/fail"));
  CHECK(r.status == 200);
  CHECK(nlohmann::json::parse(r.body)["ready"] == false);
  r = api.handle(request("GET", "/ready"));
  CHECK(r.status == 503);
  CHECK(nlohmann::json::parse(r.body)["error"] == "not ready: failed by hand");

  CHECK(api.handle(request("POST", "/healthcheck/ok")).status == 200);
  CHECK(api.handle(request("GET", "/ready")).status == 200);

  // A stopping host refuses to become ready again; /ready stays 503.
  CHECK(api.handle(request("POST", "/healthcheck/fail")).status == 200);
  f.refuse_ready = true;
  r = api.handle(request("POST", "/healthcheck/ok"));
  CHECK(r.status == 409);
  CHECK(nlohmann::json::parse(r.body)["error"] == "stopping");
  CHECK(api.handle(request("GET", "/ready")).status == 503);
}

TEST_CASE("readiness routes reject wrong methods and unknown actions") {
  Fixture f;
  AdminApi api(f.hooks());
  Response r = api.handle(request("POST", "/ready"));
  CHECK(r.status == 405);
  REQUIRE(r.headers.size() == 1);
  CHECK(r.headers[0].second == "GET");
  r = api.handle(request("GET", "/healthcheck/fail"));
  CHECK(r.status == 405);
  REQUIRE(r.headers.size() == 1);
  CHECK(r.headers[0].second == "POST");
  CHECK(api.handle(request("POST", "/healthcheck/explode")).status == 404);
  CHECK(api.handle(request("POST", "/healthcheck")).status == 404);
  CHECK(f.info.ready);  // none of them changed anything
}

TEST_CASE("with a token GET /ready is open, the healthcheck POSTs are not") {
  Fixture f;
  AdminApi api(f.hooks());
  api.set_token("s3cret");
  CHECK(api.handle(request("GET", "/ready")).status == 200);
  CHECK(api.handle(request("POST", "/healthcheck/fail")).status == 401);
  CHECK(with_token(api, request("POST", "/healthcheck/fail"), "wrong").status == 401);
  CHECK(f.info.ready);
  CHECK(with_token(api, request("POST", "/healthcheck/fail"), "s3cret").status == 200);
  CHECK(api.handle(request("GET", "/ready")).status == 503);
  // Only the one path is open: the rest still asks for the token.
  CHECK(api.handle(request("POST", "/ready")).status == 401);
  CHECK(api.handle(request("GET", "/status")).status == 401);
}

TEST_CASE("/status and /metrics carry readiness") {
  Fixture f;
  f.info.ready = false;
  f.info.not_ready_reason = "failed by POST /healthcheck/fail";
  f.info.ready_since_ms = 2000;
  const nlohmann::json s = status_json(*f.snapshot, f.info, Clock::now(), 3500);
  CHECK(s["readiness"]["ready"] == false);
  CHECK(s["readiness"]["reason"] == "failed by POST /healthcheck/fail");
  CHECK(s["readiness"]["since_ms"] == 2000);
  CHECK(status_page(s, {}).find("id=\"readiness\"") != std::string::npos);
  CHECK(metrics_text(*f.snapshot, f.info, Clock::now()).find("\nsluice_ready 0\n") != std::string::npos);
  f.info.ready = true;
  CHECK(metrics_text(*f.snapshot, f.info, Clock::now()).find("\nsluice_ready 1\n") != std::string::npos);
  CHECK(status_page(status_json(*f.snapshot, f.info, Clock::now(), 3500), {}).find("id=\"readiness\"") ==
        std::string::npos);
}
