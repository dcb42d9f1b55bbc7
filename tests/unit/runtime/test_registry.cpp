// The Registry's server identity: the resolved socket address (family, IP,
// IPv6 scope, port) within an upstream, never the text that names it.
#include <doctest/doctest.h>

#include <arpa/inet.h>

#include <cstring>
#include <memory>
#include <string>

#include "runtime/registry.hpp"
#include "runtime/snapshot.hpp"
#include "upstream/tried_set.hpp"

using namespace sluice;

namespace {

Config parsed(const std::string& servers) {
  const std::string text = "[global]\naccess_log = \"off\"\n"
                           "[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:0\"\nupstream = \"pg\"\n"
                           "[upstream.pg]\nservers = [" + servers + "]\n";
  return parse_config(text, "t.toml");
}

std::shared_ptr<const Config> registry_config(const std::string& servers) {
  return std::make_shared<const Config>(parsed(servers));
}

// As if the host name of server `i` now resolved to `ip`: the text stays.
std::shared_ptr<const Config> resolved_elsewhere(const std::string& servers, std::size_t i, const char* ip) {
  Config c = parsed(servers);
  Endpoint& ep = c.upstreams.at("pg").servers.at(i).address;
  sockaddr_in sin{};
  std::memcpy(&sin, &ep.addr, sizeof sin);
  REQUIRE(sin.sin_family == AF_INET);
  REQUIRE(::inet_pton(AF_INET, ip, &sin.sin_addr) == 1);
  std::memcpy(&ep.addr, &sin, sizeof sin);
  return std::make_shared<const Config>(std::move(c));
}

Endpoint endpoint(const std::string& text) {
  return parsed("{ address = \"" + text + "\" }").upstreams.at("pg").servers.at(0).address;
}

}  // namespace

TEST_CASE("server_identity: one per resolved address and port, whatever the spelling") {
  CHECK(server_identity(endpoint("[0:0:0:0:0:0:0:1]:5432")) == server_identity(endpoint("[::1]:5432")));
  CHECK(server_identity(endpoint("[::1]:5432")) != server_identity(endpoint("[::1]:5433")));
  CHECK(server_identity(endpoint("127.0.0.1:5432")) != server_identity(endpoint("127.0.0.2:5432")));
  CHECK(server_identity(endpoint("127.0.0.1:5432")) != server_identity(endpoint("127.0.0.1:5433")));
  // Another family is another socket address, even when it reaches the same
  // host (as the configuration's duplicate check sees it too).
  CHECK(server_identity(endpoint("127.0.0.1:5432")) != server_identity(endpoint("[::ffff:127.0.0.1]:5432")));

  // The IPv6 scope is part of a link-local address.
  Endpoint a = endpoint("[fe80::1]:5432");
  Endpoint b = a;
  sockaddr_in6 sin6{};
  std::memcpy(&sin6, &b.addr, sizeof sin6);
  sin6.sin6_scope_id = 7;
  std::memcpy(&b.addr, &sin6, sizeof sin6);
  CHECK(server_identity(a) != server_identity(b));
}

TEST_CASE("a server written another way is the same server: count, drain and weight carry over") {
  Registry registry;
  const std::string long_form = R"({ address = "[0:0:0:0:0:0:0:1]:5001" }, { address = "127.0.0.1:5002" })";
  const std::string short_form = R"({ address = "[::1]:5001" }, { address = "127.0.0.1:5002" })";
  auto a = Snapshot::build(registry_config(long_form), registry, 1);
  Upstream& up_a = *a->find_upstream("pg");
  ServerState& v6 = up_a.server(0);
  TriedSet none;
  const TimePoint now = Clock::now();
  REQUIRE(up_a.pick(none, "", now) == 0);  // a session on [::1]:5001 (ties go to the first)
  v6.set_admin(AdminState::drain);
  v6.set_weight_override(5, 1);

  auto b = Snapshot::build(registry_config(short_form), registry, 2);
  const Upstream& up_b = *b->find_upstream("pg");
  CHECK(&up_b.server(0) == &v6);
  CHECK(up_b.server(0).active == 1);
  CHECK(up_b.server(0).admin() == AdminState::drain);
  CHECK(up_b.base_weight(0) == 5);
  CHECK(registry.servers().size() == 2);
  // The member has the file's spelling now; the state keeps its first one.
  CHECK(up_b.member(0).config.address.text == "[::1]:5001");
  CHECK(v6.address.text == "[0:0:0:0:0:0:0:1]:5001");
}

TEST_CASE("a host name that resolves elsewhere after a reload is a new server") {
  Registry registry;
  const std::string servers = R"({ address = "127.0.0.1:5001" }, { address = "127.0.0.1:5002" })";
  auto a = Snapshot::build(registry_config(servers), registry, 1);
  ServerState& before = a->find_upstream("pg")->server(0);
  ServerState& other = a->find_upstream("pg")->server(1);
  before.set_admin(AdminState::drain);
  before.active = 3;

  auto b = Snapshot::build(resolved_elsewhere(servers, 0, "127.0.0.9"), registry, 2);
  const Upstream& up_b = *b->find_upstream("pg");
  ServerState& after = up_b.server(0);
  CHECK(&after != &before);
  CHECK(after.active == 0);
  CHECK(after.admin() == AdminState::enabled);
  CHECK(&up_b.server(1) == &other);
  // The new state is the new address: what sessions connect to and checks probe.
  sockaddr_in sin{};
  std::memcpy(&sin, &after.address.addr, sizeof sin);
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &sin.sin_addr, ip, sizeof ip);
  CHECK(std::string(ip) == "127.0.0.9");
  CHECK(ntohs(sin.sin_port) == 5001);
  // The old address was forgotten: going back to it starts afresh.
  CHECK(registry.servers().size() == 2);
  auto c = Snapshot::build(registry_config(servers), registry, 3);
  CHECK(&c->find_upstream("pg")->server(0) != &before);
  CHECK(c->find_upstream("pg")->server(0).admin() == AdminState::enabled);
}

TEST_CASE("the same address in two upstreams is two servers") {
  const std::string text = "[global]\naccess_log = \"off\"\n"
                           "[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:0\"\nupstream = \"a\"\n"
                           "[upstream.a]\nservers = [{ address = \"127.0.0.1:5001\" }]\n"
                           "[upstream.b]\nservers = [{ address = \"127.0.0.1:5001\" }]\n";
  Registry registry;
  auto s = Snapshot::build(std::make_shared<const Config>(parse_config(text, "t.toml")), registry, 1);
  CHECK(&s->find_upstream("a")->server(0) != &s->find_upstream("b")->server(0));
}

TEST_CASE("a retired server is listed while it has sessions and forgotten once no Snapshot holds it") {
  Registry registry;
  auto a = Snapshot::build(registry_config("{ address = \"127.0.0.1:5001\" }, { address = \"127.0.0.1:5002\" }"),
                           registry, 1);
  std::shared_ptr<ServerState> gone = a->find_upstream("pg")->member(0).state;
  auto b = Snapshot::build(registry_config("{ address = \"127.0.0.1:5002\" }"), registry, 2);
  registry.retire("pg", gone);
  registry.retire("pg", gone);  // once is enough
  CHECK(registry.retired().empty());  // no session on it: nothing to show

  gone->active = 2;
  std::vector<RetiredServer> r = registry.retired();
  REQUIRE(r.size() == 1);
  CHECK(r[0].upstream == "pg");
  CHECK(r[0].state == gone);
  CHECK(r[0].retired_at_ms > 0);
  // A session of the old Snapshot may pick it after the removal: it shows then.
  gone->active = 0;
  CHECK(registry.retired().empty());
  gone->active = 1;
  CHECK(registry.retired().size() == 1);

  // The old Snapshot goes with its last session: so does the entry.
  gone->active = 0;
  gone.reset();
  a.reset();
  CHECK(registry.retired().empty());
}
