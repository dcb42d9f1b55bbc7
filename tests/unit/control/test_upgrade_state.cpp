#include <doctest/doctest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "control/upgrade_state.hpp"

using namespace sluice;
using S = UpgradeState;

namespace {

const std::vector<S> kAll = {S::idle,   S::starting,  S::handing_over, S::finishing,
                             S::handed_over, S::failed, S::receiving,    S::took_over};

// Every move the upgrade may make, one line each: anything else is refused.
const std::set<std::pair<S, S>> kAllowed = {
    {S::idle, S::starting},           // SIGUSR2 / POST /upgrade
    {S::idle, S::receiving},          // started by an upgrade: serving, sessions on their way
    {S::starting, S::handing_over},   // the new process serves
    {S::starting, S::failed},         // it exited, hung, spoke another format, could not start
    {S::handing_over, S::finishing},  // upgrade_finish_timeout
    {S::handing_over, S::handed_over},// every session moved or ended
    {S::handing_over, S::failed},     // the new process died: serve on
    {S::finishing, S::handed_over},
    {S::finishing, S::failed},
    {S::failed, S::starting},         // try again
    {S::receiving, S::took_over},     // the previous process has gone
    {S::took_over, S::starting},      // this process may be upgraded in turn
};

}  // namespace

TEST_CASE("the table of moves: exactly the listed ones are allowed") {
  for (S from : kAll) {
    for (S to : kAll) {
      CAPTURE(to_string(from));
      CAPTURE(to_string(to));
      CHECK(upgrade_move_allowed(from, to) == (kAllowed.count({from, to}) == 1));
    }
  }
}

TEST_CASE("transition() refuses an illegal move and keeps the state and message") {
  UpgradeMachine m;
  CHECK(m.state() == S::idle);
  REQUIRE(m.transition(S::receiving, "took over from process 41"));
  CHECK_FALSE(m.transition(S::starting, "second SIGUSR2"));
  CHECK(m.state() == S::receiving);
  CHECK(m.message() == "took over from process 41");
  CHECK_FALSE(m.transition(S::idle, ""));
  REQUIRE(m.transition(S::took_over, "done"));
  CHECK(m.transition(S::starting, "again"));
}

TEST_CASE("an upgrade may start only from a serving state that has no upgrade under way") {
  UpgradeMachine m;
  CHECK(m.refusal().empty());
  REQUIRE(m.transition(S::starting, "new process 7 started"));
  CHECK(m.refusal().find("already under way") != std::string::npos);
  CHECK(m.old_side());
  REQUIRE(m.transition(S::failed, "it exited"));
  CHECK(m.refusal().empty());
  CHECK_FALSE(m.old_side());
  REQUIRE(m.transition(S::starting, "again"));
  REQUIRE(m.transition(S::handing_over, "new process 8 serves"));
  CHECK_FALSE(m.refusal().empty());
  REQUIRE(m.transition(S::handed_over, "done"));
  CHECK_FALSE(m.refusal().empty());

  UpgradeMachine fresh;
  REQUIRE(fresh.transition(S::receiving, "process 9 hands its sessions over"));
  const std::string why = fresh.refusal();
  CHECK(why.find("still receiving sessions") != std::string::npos);
  CHECK(why.find("process 9") != std::string::npos);
  CHECK_FALSE(fresh.old_side());
}

TEST_CASE("the names /status shows") {
  CHECK(to_string(S::idle) == "none");
  CHECK(to_string(S::starting) == "starting");
  CHECK(to_string(S::handing_over) == "handing_over");
  CHECK(to_string(S::finishing) == "finishing");
  CHECK(to_string(S::handed_over) == "handed_over");
  CHECK(to_string(S::failed) == "failed");
  CHECK(to_string(S::receiving) == "receiving");
  CHECK(to_string(S::took_over) == "took_over");
}
