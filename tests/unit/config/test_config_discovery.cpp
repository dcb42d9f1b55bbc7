// [resolver] and the servers entries that come from DNS (resolve = true, service).
#include "config_cases.hpp"

using namespace config_test;
using namespace std::chrono_literals;

namespace {

const std::string kUp = "[upstream.u]\nservers = [\n";
const std::string kEnd = "]\n" + kListenerL;

}  // namespace

TEST_CASE("discovery entries are read, not resolved at load") {
  const sluice::Config c = sluice::parse_config(
      kUp + "  { address = \"10.0.0.1:5432\" },\n"
            "  { address = \"DB.Internal.:5432\", resolve = true, weight = 3, max_conns = 9, backup = true },\n"
            "  { service = \"_postgresql._tcp.db.service.consul\" },\n"
            "  { address = \"127.0.0.1:5433\", resolve = false },\n" + kEnd +
          "[resolver]\nnameservers = [\"10.0.0.2\", \"127.0.0.1:8600\", \"::1\", \"[::1]:5353\"]\n"
          "timeout = \"500ms\"\nattempts = 3\nvalid = \"5s\"\nhold = \"0s\"\n",
      "x.toml");
  const auto& u = c.upstreams.at("u");
  REQUIRE(u.servers.size() == 2);
  REQUIRE(u.discovered.size() == 2);
  CHECK(u.discovered[0].kind == sluice::DiscoveryKind::host);
  CHECK(u.discovered[0].name == "db.internal");
  CHECK(u.discovered[0].port == 5432);
  CHECK(u.discovered[0].weight == 3);
  CHECK(u.discovered[0].max_conns == 9);
  CHECK(u.discovered[0].backup);
  CHECK(u.discovered[1].kind == sluice::DiscoveryKind::service);
  CHECK(u.discovered[1].name == "_postgresql._tcp.db.service.consul");
  REQUIRE(c.resolver.nameservers.size() == 4);
  CHECK(c.resolver.nameservers[0].port == 53);
  CHECK(c.resolver.nameservers[1].port == 8600);
  CHECK(c.resolver.nameservers[2].port == 53);
  CHECK(c.resolver.nameservers[3].port == 5353);
  CHECK(c.resolver.timeout == 500ms);
  CHECK(c.resolver.attempts == 3);
  CHECK(c.resolver.valid == 5s);
  CHECK(c.resolver.hold == 0s);

  // Defaults, and an upstream whose every server comes from DNS.
  const sluice::Config d =
      sluice::parse_config(kUp + "  { address = \"nowhere.invalid:1\", resolve = true },\n" + kEnd, "x.toml");
  CHECK(d.upstreams.at("u").servers.empty());
  CHECK(d.resolver.nameservers.empty());
  CHECK(d.resolver.timeout == 2s);
  CHECK(d.resolver.attempts == 2);
  CHECK(d.resolver.valid == 0s);
  CHECK(d.resolver.hold == 10s);
}

TEST_CASE("discovery entries: errors") {
  check_cases({
      {kUp + "  { address = \"10.0.0.1:5432\", resolve = true },\n" + kEnd,
       "x.toml:3:15: upstream \"u\" server 1: address \"10.0.0.1:5432\" is an IP address: resolve = true needs a host "
       "name (leave resolve out for a fixed address)"},
      {kUp + "  { address = \"db.internal\", resolve = true },\n" + kEnd,
       "x.toml:3:15: upstream \"u\" server 1: address must be \"host:port\" with a port 1..65535, got "
       "\"db.internal\""},
      {kUp + "  { address = \"db..internal:1\", resolve = true },\n" + kEnd,
       "x.toml:3:15: upstream \"u\" server 1: address must have a valid host name, got \"db..internal:1\""},
      {kUp + "  { address = \"db.internal:1\", resolve = \"yes\" },\n" + kEnd,
       "x.toml:3:42: upstream \"u\" server 1: resolve must be a boolean (true or false), got string \"yes\""},
      {kUp + "  { service = \"_pg._tcp.db\", weight = 2 },\n" + kEnd,
       "x.toml:3:30: upstream \"u\" server 1: unknown key \"weight\"; allowed: service, max_conns, backup, family"},
      {kUp + "  { service = \"_pg._tcp.db\", address = \"a:1\" },\n" + kEnd,
       "x.toml:3:30: upstream \"u\" server 1: unknown key \"address\"; allowed: service, max_conns, backup, family"},
      {kUp + "  { service = \"bad name\" },\n" + kEnd,
       "x.toml:3:15: upstream \"u\" server 1: service must be a DNS name like \"_postgresql._tcp.db.service.consul\", "
       "got \"bad name\""},
      {kUp + "  { service = \"_pg._tcp.db\" },\n  { service = \"_PG._tcp.db.\" },\n" + kEnd,
       "x.toml:4:15: upstream \"u\" server 2: service \"_PG._tcp.db.\" is already discovered by another entry of "
       "this upstream (\"_pg._tcp.db\")"},
      {"[upstream.u]\nbalance = \"hash\"\nservers = [\n  { address = \"db:1\", resolve = true, backup = true },\n" +
           kEnd,
       "x.toml:4:48: upstream \"u\" server 1: backup = true is not allowed with balance = \"hash\""},
  });
}

TEST_CASE("[resolver]: errors") {
  const std::string up = kUp + "  { address = \"db:1\", resolve = true },\n" + kEnd;
  check_cases({
      {up + "[resolver]\nnameservers = []\n",
       "x.toml:11:15: [resolver]: nameservers must not be empty (leave it out to use /etc/resolv.conf's)"},
      {up + "[resolver]\nnameservers = [\"dns.example\"]\n",
       "x.toml:11:16: [resolver]: nameservers entry must be a numeric address \"ip\" or \"ip:port\" (like "
       "\"10.0.0.2\", \"127.0.0.1:8600\", \"[::1]:53\"), got \"dns.example\""},
      {up + "[resolver]\nnameservers = [\"10.0.0.2:0\"]\n",
       "x.toml:11:16: [resolver]: nameservers entry must be \"ip\" or \"ip:port\" with a port 1..65535, got "
       "\"10.0.0.2:0\""},
      {up + "[resolver]\nnameservers = [53]\n",
       "x.toml:11:16: [resolver]: nameservers entries must be strings like \"10.0.0.2:53\", got integer 53"},
      {up + "[resolver]\nvalid = \"500ms\"\n",
       "x.toml:11:9: [resolver]: valid must be at least \"1s\" (or \"0s\": follow the TTL), got \"500ms\""},
      {up + "[resolver]\nattempts = 0\n", "x.toml:11:12: [resolver]: attempts must be 1..10, got 0"},
      {up + "[resolver]\ntimeout = \"0s\"\n", "x.toml:11:11: [resolver]: timeout must be greater than 0, got \"0s\""},
      {up + "[resolver]\nsearch = [\"x\"]\n",
       "x.toml:11:1: [resolver]: unknown key \"search\"; allowed: nameservers, timeout, attempts, valid, hold, family, "
       "max_targets, max_addresses"},
      {"resolver = 1\n" + up, "x.toml:1:12: top level: resolver must be a table ([resolver]), got integer 1"},
      {up + "[resolver]\nfamily = \"inet\"\n",
       "x.toml:11:10: [resolver]: family must be one of any|ipv4|ipv6, got \"inet\""},
      {up + "[resolver]\nmax_targets = 0\n", "x.toml:11:15: [resolver]: max_targets must be 1..100000, got 0"},
      {up + "[resolver]\nmax_addresses = 100001\n",
       "x.toml:11:17: [resolver]: max_addresses must be 1..100000, got 100001"},
  });
}

TEST_CASE("family: per entry, else [resolver]'s, else any") {
  const std::string entries = kUp + "  { address = \"a.test:1\", resolve = true },\n"
                                    "  { address = \"b.test:1\", resolve = true, family = \"ipv6\" },\n"
                                    "  { service = \"_x._tcp.test\", family = \"any\" },\n" + kEnd;
  const sluice::Config any = sluice::parse_config(entries, "x.toml");
  CHECK(any.resolver.family == sluice::AddressFamily::any);
  CHECK(any.resolver.max_targets == 1000);
  CHECK(any.resolver.max_addresses == 1000);
  const auto& a = any.upstreams.at("u").discovered;
  CHECK(a[0].family == sluice::AddressFamily::any);
  CHECK(a[1].family == sluice::AddressFamily::ipv6);
  CHECK(a[2].family == sluice::AddressFamily::any);
  const sluice::Config v4 = sluice::parse_config(
      entries + "[resolver]\nfamily = \"ipv4\"\nmax_targets = 10\nmax_addresses = 20\n", "x.toml");
  const auto& b = v4.upstreams.at("u").discovered;
  CHECK(b[0].family == sluice::AddressFamily::ipv4);
  CHECK(b[1].family == sluice::AddressFamily::ipv6);
  CHECK(b[2].family == sluice::AddressFamily::any);
  CHECK(v4.resolver.max_targets == 10);
  CHECK(v4.resolver.max_addresses == 20);
  check_cases({
      {kUp + "  { address = \"a.test:1\", resolve = true, family = \"v4\" },\n" + kEnd,
       "x.toml:3:52: upstream \"u\" server 1: family must be one of any|ipv4|ipv6, got \"v4\""},
      {kUp + "  { address = \"10.0.0.1:1\", family = \"ipv4\" },\n" + kEnd,
       "x.toml:3:29: upstream \"u\" server 1: family is allowed only on servers from DNS (resolve = true, or "
       "service): a fixed address has its own"},
  });
}
