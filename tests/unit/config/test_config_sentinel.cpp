// An upstream whose server comes from Redis Sentinel: sentinel = { ... }.
#include "config_cases.hpp"

using namespace config_test;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("a sentinel table is read and gets a redis primary check by default") {
  const sluice::Config c = sluice::parse_config(
      "[upstream.u]\nsentinel = { addresses = [\"10.0.0.1:26379\", \"[::1]:26380\"], master = \"mymaster\" }\n" +
          kListenerL,
      "x.toml");
  const auto& u = c.upstreams.at("u");
  REQUIRE(u.sentinel);
  CHECK(u.servers.empty());
  REQUIRE(u.sentinel->addresses.size() == 2);
  CHECK(u.sentinel->addresses[0].port == 26379);
  CHECK(u.sentinel->addresses[1].port == 26380);
  CHECK(u.sentinel->master == "mymaster");
  CHECK(u.sentinel->password_file.empty());
  REQUIRE(u.health);
  CHECK(u.health->type == sluice::HealthType::redis);
  CHECK(u.health->redis_role == sluice::RedisRole::master);
  CHECK(u.health->initial == sluice::HealthInitial::down);
}

TEST_CASE("a sentinel upstream keeps a written redis primary check") {
  const sluice::Config c = sluice::parse_config(
      "[upstream.u]\nsentinel = { addresses = [\"10.0.0.1:26379\"], master = \"m\" }\n"
      "[upstream.u.health]\ntype = \"redis\"\nrole = \"master\"\ninterval = \"500ms\"\n" + kListenerL,
      "x.toml");
  const auto& h = *c.upstreams.at("u").health;
  CHECK(h.redis_role == sluice::RedisRole::master);
  CHECK(h.interval == std::chrono::milliseconds(500));
}

TEST_CASE("sentinel errors name the file, line and column") {
  const std::string head = "[upstream.u]\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {head + "sentinel = { addresses = [\"10.0.0.1:26379\"], master = \"m\" }\nservers = [{ address = \"10.0.0.1:1\" }]\n",
       "x.toml:2:1: upstream \"u\": sentinel and servers are both set"},
      {head + "balance = \"round_robin\"\n", "x.toml:1:1: upstream \"u\": needs servers = "},
      {head + "sentinel = { addresses = [], master = \"m\" }\n", "x.toml:2:26: upstream \"u\" sentinel: addresses must list"},
      {head + "sentinel = { master = \"m\" }\n", "missing required key \"addresses\""},
      {head + "sentinel = { addresses = [\"10.0.0.1:26379\"] }\n", "missing required key \"master\""},
      {head + "sentinel = { addresses = [\"10.0.0.1:26379\"], master = \"\" }\n", "master must be the name"},
      {head + "sentinel = { addresses = [\"10.0.0.1:26379\"], master = \"a b\" }\n", "master must be the name"},
      {head + "sentinel = { addresses = [\"10.0.0.1\"], master = \"m\" }\n", "x.toml:2:27: upstream \"u\" sentinel: addresses entry"},
      {head + "sentinel = { addresses = [1], master = \"m\" }\n", "addresses entries must be strings"},
      {head + "sentinel = { addresses = [\"10.0.0.1:1\", \"10.0.0.1:1\"], master = \"m\" }\n", "twice"},
      {head + "sentinel = { addresses = [\"10.0.0.1:1\"], master = \"m\", port = 1 }\n", "\"port\""},
      {head + "sentinel = \"10.0.0.1:26379\"\n", "sentinel must be a table"},
      {head + "sentinel = { addresses = [\"10.0.0.1:1\"], master = \"m\" }\n[upstream.u.health]\ntype = \"tcp\"\n",
       "x.toml:4:8: upstream \"u\" health: an upstream with sentinel needs type = \"redis\""},
      {head + "sentinel = { addresses = [\"10.0.0.1:1\"], master = \"m\" }\n[upstream.u.health]\ntype = \"redis\"\n"
              "role = \"replica\"\n",
       "x.toml:5:8: upstream \"u\" health: an upstream with sentinel needs role = \"primary\""},
      {head + "sentinel = { addresses = [\"10.0.0.1:1\"], master = \"m\" }\n[upstream.u.health]\ntype = \"redis\"\n",
       "x.toml:3:1: upstream \"u\" health: an upstream with sentinel needs role = \"primary\""},
  };
  for (const auto& [text, want] : cases) {
    CAPTURE(text);
    const std::string got = error_of(text + kListenerL);
    CAPTURE(got);
    CHECK(has(got, want));
  }
}
