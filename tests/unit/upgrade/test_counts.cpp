#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "upgrade/counts.hpp"

using namespace sluice::upgrade;

namespace {

Figure server_active(std::uint64_t v) { return {"server", "pg", std::string("4\0\x7f\0\0\x01", 6), "active", v}; }
Figure listener_accepted(std::uint64_t v) { return {"listener", "main", "", "accepted", v}; }

}  // namespace

TEST_CASE("figures go through counts messages whole, binary names included, many per message") {
  std::vector<Figure> sent;
  for (int i = 0; i < 2000; ++i) {
    sent.push_back({"client", "main", std::string(16, static_cast<char>(i % 256)), "open", static_cast<std::uint64_t>(i)});
  }
  sent.push_back(server_active(3));
  const std::vector<Message> ms = counts_messages(sent);
  CHECK(ms.size() > 1);  // 2 001 figures do not fit one datagram's batch
  std::vector<Figure> got;
  for (const Message& m : ms) REQUIRE(read_counts(m, got));
  CHECK(got == sent);
}

TEST_CASE("a malformed counts message is refused whole") {
  Message m = counts_messages({server_active(1)}).front();
  std::vector<Figure> got;
  Message short_one = m;
  short_one.fields.pop_back();
  CHECK_FALSE(read_counts(short_one, got));
  Message not_a_number = m;
  not_a_number.fields[4] = "-1";
  CHECK_FALSE(read_counts(not_a_number, got));
  Message no_scope = m;
  no_scope.fields[0] = "";
  CHECK_FALSE(read_counts(no_scope, got));
  CHECK(got.empty());
}

TEST_CASE("a sender's tally reports only what changed, and what it no longer has as 0") {
  Tally sent;
  CHECK(sent.changed({server_active(2), listener_accepted(10)}) ==
        std::vector<Figure>{server_active(2), listener_accepted(10)});
  CHECK(sent.changed({server_active(2), listener_accepted(10)}).empty());
  CHECK(sent.changed({server_active(1), listener_accepted(10)}) == std::vector<Figure>{server_active(1)});
  // The server's sessions have all ended and it left the report.
  const std::vector<Figure> gone = sent.changed({listener_accepted(12)});
  CHECK(gone.size() == 2);
  CHECK(std::count(gone.begin(), gone.end(), listener_accepted(12)) == 1);
  CHECK(std::count(gone.begin(), gone.end(), server_active(0)) == 1);
  // A figure first seen at 0 is nothing new.
  CHECK(sent.changed({listener_accepted(12), server_active(0)}).empty());
}

TEST_CASE("a receiver's tally gives the change since the last report, and the gauges to take out at the end") {
  Tally got;
  CHECK(got.update(server_active(3)) == 3);
  CHECK(got.update(server_active(3)) == 0);
  CHECK(got.update(server_active(1)) == -2);
  CHECK(got.update(listener_accepted(100)) == 100);
  CHECK(got.last(server_active(0)) == 1);
  const std::vector<Figure> both = got.figures();
  CHECK(both.size() == 2);
  CHECK(std::count(both.begin(), both.end(), listener_accepted(100)) == 1);
  CHECK(std::count(both.begin(), both.end(), server_active(1)) == 1);
  CHECK(got.update(server_active(0)) == -1);
  CHECK(got.figures() == std::vector<Figure>{listener_accepted(100)});
}

TEST_CASE("how each counter is folded in") {
  CHECK(figure_kind("active") == FigureKind::gauge);
  CHECK(figure_kind("open") == FigureKind::gauge);
  CHECK(figure_kind("connections") == FigureKind::gauge);
  CHECK(figure_kind("peak") == FigureKind::peak);
  CHECK(figure_kind("sessions") == FigureKind::total);
  CHECK(figure_kind("closed.client_closed") == FigureKind::total);
}
