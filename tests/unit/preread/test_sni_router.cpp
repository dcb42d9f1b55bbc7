// SNI router: exact names, "*.suffix" wildcards, most specific match wins.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "preread/sni_router.hpp"

using sluice::Route;
using sluice::preread::SniRouter;

namespace {

// The upstream `router` picks for `sni`, or "-" when nothing matches (so a
// failed CHECK prints something readable).
std::string route(const SniRouter& router, std::string_view sni) {
  const std::string* up = router.match(sni);
  return up == nullptr ? "-" : *up;
}

const std::vector<Route> kRoutes = {
    {"db.example.com", "pg"},
    {"*.example.com", "web"},
    {"*.api.example.com", "api"},
    {"*.eu.api.example.com", "api_eu"},
    {"v1.api.example.com", "api_v1"},
    {"example.org", "org"},
    {"*.internal", "internal"},
};

}  // namespace

TEST_SUITE("sni_router") {

TEST_CASE("exact names") {
  const SniRouter r(kRoutes);
  CHECK(route(r, "db.example.com") == "pg");
  CHECK(route(r, "example.org") == "org");
  CHECK(route(r, "v1.api.example.com") == "api_v1");
  // An exact name does not cover its subdomains.
  CHECK(route(r, "www.example.org") == "-");
}

TEST_CASE("wildcards match any depth below the suffix, never the suffix itself") {
  const SniRouter r(kRoutes);
  CHECK(route(r, "www.example.com") == "web");
  CHECK(route(r, "a.b.c.example.com") == "web");
  CHECK(route(r, "example.com") == "-");
  CHECK(route(r, "host.internal") == "internal");
  CHECK(route(r, "internal") == "-");
  // A suffix only matches on a label boundary.
  CHECK(route(r, "notexample.com") == "-");
  CHECK(route(r, "www.myexample.com") == "-");
  // No empty label in front of the suffix.
  CHECK(route(r, ".example.com") == "-");
}

TEST_CASE("the most specific route wins") {
  const SniRouter r(kRoutes);
  // exact beats every wildcard that also matches
  CHECK(route(r, "db.example.com") == "pg");
  CHECK(route(r, "v1.api.example.com") == "api_v1");
  // longest suffix wins among wildcards
  CHECK(route(r, "v2.api.example.com") == "api");
  CHECK(route(r, "x.y.api.example.com") == "api");
  CHECK(route(r, "fr.eu.api.example.com") == "api_eu");
  CHECK(route(r, "a.b.eu.api.example.com") == "api_eu");
  // the suffix of a longer wildcard is matched by the shorter one
  CHECK(route(r, "api.example.com") == "web");
  CHECK(route(r, "eu.api.example.com") == "api");
}

TEST_CASE("the order of routes does not change the answer") {
  std::vector<Route> reversed(kRoutes.rbegin(), kRoutes.rend());
  const SniRouter r(reversed);
  CHECK(route(r, "db.example.com") == "pg");
  CHECK(route(r, "fr.eu.api.example.com") == "api_eu");
  CHECK(route(r, "v2.api.example.com") == "api");
  CHECK(route(r, "www.example.com") == "web");
}

TEST_CASE("case-insensitive") {
  const SniRouter r(kRoutes);
  CHECK(route(r, "DB.Example.COM") == "pg");
  CHECK(route(r, "WWW.EXAMPLE.COM") == "web");
  CHECK(route(r, "Fr.Eu.Api.Example.Com") == "api_eu");
  // Routes are normalized by the config loader; the router copes anyway.
  const SniRouter upper({{"Mixed.Example.NET", "m"}, {"*.Wild.Example.NET", "w"}});
  CHECK(route(upper, "mixed.example.net") == "m");
  CHECK(route(upper, "a.wild.example.net") == "w");
}

TEST_CASE("a trailing dot in the query is ignored") {
  const SniRouter r(kRoutes);
  CHECK(route(r, "db.example.com.") == "pg");
  CHECK(route(r, "www.example.com.") == "web");
  CHECK(route(r, "example.com.") == "-");
  CHECK(route(r, "DB.EXAMPLE.COM.") == "pg");
}

TEST_CASE("no match") {
  const SniRouter r(kRoutes);
  CHECK(route(r, "") == "-");
  CHECK(route(r, ".") == "-");
  CHECK(route(r, "example.net") == "-");
  CHECK(route(r, "com") == "-");
  const SniRouter empty({});
  CHECK(route(empty, "db.example.com") == "-");
  CHECK(route(empty, "") == "-");
}

TEST_CASE("a catch-all is written as default_upstream, not as a route") {
  // "*" or "*." alone is not a wildcard over everything: it is kept as an
  // exact (unmatchable) name, and only names with a suffix are wildcards.
  const SniRouter r({{"*", "all"}, {"*.", "dot"}});
  CHECK(route(r, "a.example.com") == "-");
  CHECK(route(r, "localhost") == "-");
}

TEST_CASE("the first of duplicate routes wins") {
  const SniRouter r({{"a.example.com", "first"},
                     {"a.example.com", "second"},
                     {"*.example.com", "w1"},
                     {"*.example.com", "w2"}});
  CHECK(route(r, "a.example.com") == "first");
  CHECK(route(r, "b.example.com") == "w1");
}

TEST_CASE("the returned name outlives the query") {
  const SniRouter r(kRoutes);
  const std::string* a = r.match(std::string("db.example.com"));
  const std::string* b = r.match("DB.example.com.");
  REQUIRE(a != nullptr);
  CHECK(a == b);
  CHECK(*a == "pg");
}

}  // TEST_SUITE

// ---- ALPN ------------------------------------------------------------------

namespace {

std::string route(const SniRouter& router, std::string_view sni, const std::vector<std::string>& alpn) {
  const std::string* up = router.match(sni, alpn);
  return up == nullptr ? "-" : *up;
}

const std::vector<Route> kAlpnRoutes = {
    {"db.example.com", "pg_tls", "postgresql"},
    {"db.example.com", "db_any"},
    {"*.example.com", "h2_pool", "h2"},
    {"*.example.com", "web"},
    {"", "pg_any", "postgresql"},
    {"", "h1_pool", "http/1.1"},
};

}  // namespace

TEST_SUITE("sni_router alpn") {

TEST_CASE("sni and alpn together beat sni alone") {
  const SniRouter r(kAlpnRoutes);
  CHECK(route(r, "db.example.com", {"postgresql"}) == "pg_tls");
  CHECK(route(r, "db.example.com", {}) == "db_any");
  CHECK(route(r, "db.example.com", {"h2"}) == "db_any");  // the exact host beats the wildcard's alpn route
  CHECK(route(r, "www.example.com", {"h2", "http/1.1"}) == "h2_pool");
  CHECK(route(r, "www.example.com", {"http/1.1"}) == "web");  // the host beats an alpn-only route
}

TEST_CASE("alpn alone matches any or no host name") {
  const SniRouter r(kAlpnRoutes);
  CHECK(route(r, "", {"postgresql"}) == "pg_any");
  CHECK(route(r, "other.test", {"postgresql"}) == "pg_any");
  CHECK(route(r, "other.test", {"http/1.1"}) == "h1_pool");
  CHECK(route(r, "other.test", {"h3"}) == "-");
  CHECK(route(r, "", {}) == "-");
}

TEST_CASE("the client's first offered protocol that has a route wins") {
  const SniRouter r(kAlpnRoutes);
  CHECK(route(r, "", {"http/1.1", "postgresql"}) == "h1_pool");
  CHECK(route(r, "", {"spdy/3", "postgresql", "http/1.1"}) == "pg_any");
}

TEST_CASE("alpn is compared byte for byte") {
  const SniRouter r(kAlpnRoutes);
  CHECK(route(r, "", {"PostgreSQL"}) == "-");
  CHECK(route(r, "", {"postgresql "}) == "-");
}

TEST_CASE("a host with only alpn routes falls through to wildcards, then alpn-only routes") {
  const SniRouter r({{"a.example.com", "a_h2", "h2"}, {"*.example.com", "wild"}, {"", "any_h2", "h2"}});
  CHECK(route(r, "a.example.com", {"h2"}) == "a_h2");
  CHECK(route(r, "a.example.com", {"http/1.1"}) == "wild");
  CHECK(route(r, "a.other.com", {"h2"}) == "any_h2");
}

}
