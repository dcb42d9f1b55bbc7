// Snapshot and Registry: a reload builds a new Snapshot that shares each
// server's long-lived state by identity (upstream name + address).
#include <doctest/doctest.h>

#include <memory>
#include <string>

#include "runtime/registry.hpp"
#include "runtime/snapshot.hpp"
#include "upstream/tried_set.hpp"

using namespace sluice;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<const Config> config_of(const std::string& servers, const std::string& extra = "") {
  const std::string text = "[global]\naccess_log = \"off\"\n"
                           "[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:0\"\nupstream = \"pg\"\n"
                           "[upstream.pg]\nmax_fails = 2\n" + extra + "servers = [" + servers + "]\n";
  return std::make_shared<const Config>(parse_config(text, "t.toml"));
}

const std::string kAB = R"({ address = "127.0.0.1:5001" }, { address = "127.0.0.1:5002", weight = 2 })";
const std::string kBC = R"({ address = "127.0.0.1:5002", weight = 2 }, { address = "127.0.0.1:5003" })";

}  // namespace

TEST_CASE("a Snapshot swap keeps each server's active count and health") {
  Registry registry;
  auto a = Snapshot::build(config_of(kAB), registry, 1);
  Upstream* up_a = a->find_upstream("pg");
  REQUIRE(up_a != nullptr);
  REQUIRE(up_a->size() == 2);

  // Two sessions on 5002 (weight 2 wins ties at first), 5001 refuses twice.
  TriedSet none;
  const TimePoint now = Clock::now();
  ServerState& s5001 = up_a->server(0);
  ServerState& s5002 = up_a->server(1);
  s5001.report(ConnectResult::failed, "connection refused", now);
  s5001.report(ConnectResult::failed, "connection refused", now);
  REQUIRE_FALSE(s5001.passive_up());
  CHECK(up_a->pick(none, "", now) == 1);
  CHECK(up_a->pick(none, "", now) == 1);
  CHECK(s5002.active == 2);

  // Reload: 5001 removed, 5002 kept, 5003 added.
  auto b = Snapshot::build(config_of(kBC), registry, 2);
  Upstream* up_b = b->find_upstream("pg");
  REQUIRE(up_b->size() == 2);
  CHECK(&up_b->server(0) == &s5002);           // the same state object, by identity
  CHECK(up_b->server(0).active == 2);          // least_conn still sees the live sessions
  CHECK(up_b->server(1).active == 0);
  CHECK(up_b->server(1).address.text == "127.0.0.1:5003");
  // New picks through the new Snapshot take the existing load into account.
  CHECK(up_b->pick(none, "", now) == 1);

  // Sessions of the old Snapshot release into the shared state.
  up_a->release(1);
  CHECK(up_b->server(0).active == 1);

  // The registry knows only the current Snapshot's servers, although the
  // old Snapshot (its sessions) still holds 5001's state.
  CHECK(registry.servers().size() == 2);
  CHECK_FALSE(s5001.passive_up());

  // Put 5001 back while the old Snapshot lives: the removal forgot it, so
  // it comes back afresh, not with the failures it had before.
  auto c = Snapshot::build(config_of(kAB), registry, 3);
  CHECK(&c->find_upstream("pg")->server(0) != &s5001);
  CHECK(c->find_upstream("pg")->server(0).passive_up());
  CHECK(&c->find_upstream("pg")->server(1) == &s5002);
  CHECK(registry.servers().size() == 2);
}

TEST_CASE("a server removed and put back forgets its drain, weight and health, even with old sessions") {
  Registry registry;
  auto a = Snapshot::build(config_of(kAB), registry, 1);
  ServerState& old5001 = a->find_upstream("pg")->server(0);
  old5001.set_admin(AdminState::drain);
  old5001.set_weight_override(9, 1);
  old5001.set_active(ActiveState::down, "HTTP 503");

  auto b = Snapshot::build(config_of(kBC), registry, 2);  // a stays alive: a session holds it
  auto c = Snapshot::build(config_of(kAB), registry, 3);
  const Upstream& up = *c->find_upstream("pg");
  CHECK(up.server(0).admin() != AdminState::drain);
  CHECK(up.server(0).active_state() != ActiveState::down);
  CHECK(up.base_weight(0) == 1);
  CHECK(old5001.admin() == AdminState::drain);  // the old sessions' state is untouched
}

TEST_CASE("active health, drain and runtime weight survive a reload; a changed file weight wins") {
  Registry registry;
  auto a = Snapshot::build(config_of(kAB), registry, 1);
  ServerState& s5002 = a->find_upstream("pg")->server(1);
  s5002.set_active(ActiveState::down, "HTTP 503");
  s5002.set_admin(AdminState::drain);
  s5002.set_weight_override(7, 2);

  auto b = Snapshot::build(config_of(kBC), registry, 2);
  const Upstream& up = *b->find_upstream("pg");
  CHECK(up.server(0).active_state() == ActiveState::down);
  CHECK(up.server(0).admin() == AdminState::drain);
  CHECK(up.base_weight(0) == 7);

  const std::string changed = R"({ address = "127.0.0.1:5002", weight = 3 })";
  auto c = Snapshot::build(config_of(changed), registry, 3);
  CHECK(c->find_upstream("pg")->base_weight(0) == 3);
}

TEST_CASE("listener counters and process counters are the Registry's, not the Snapshot's") {
  Registry registry;
  auto a = Snapshot::build(config_of(kAB), registry, 1);
  a->listeners[0].stats->accepted = 5;
  registry.counters().connections = 3;
  auto b = Snapshot::build(config_of(kBC), registry, 2);
  CHECK(b->listeners[0].stats->accepted == 5);
  CHECK(b->listeners[0].stats.get() == a->listeners[0].stats.get());
  CHECK(registry.counters().connections == 3);
}
