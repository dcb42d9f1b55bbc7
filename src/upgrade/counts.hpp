// The figures the two processes of a binary upgrade tell each other while
// both hold sessions: live counts that limits depend on (a server's active
// sessions for max_conns and least_conn, a listener's and the process's
// open connections for max_connections, a client address's open sessions
// for client_max_connections), and the totals and peaks an operator reads.
//
// A report carries absolute values, each a figure: what is counted
// (scope, name, sub, counter) and its value now at the sender, counting
// only the sender's own sessions. The receiver keeps the last value of each
// and adds the difference to its own counter, so that a report lost in a
// burst, or two in a row, changes nothing; the sender sends only the
// figures that changed since its last report. When the sender has gone,
// the receiver takes its gauges out again (its totals and peaks stay).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "upgrade/channel.hpp"

namespace sluice::upgrade {

struct Figure {
  std::string scope;    // "server", "listener", "client", "process"
  std::string name;     // the upstream (server) or listener (listener, client) name; "" for the process
  std::string sub;      // the server's identity or the client's address (16 bytes); "" otherwise
  std::string counter;  // "active", "sessions", "bytes_in", "closed.client_closed", "peak", ...
  std::uint64_t value = 0;

  // The figure's identity (everything but its value), as a map key.
  std::string key() const;
  bool operator==(const Figure&) const = default;
};

// How the receiver folds a figure in.
enum class FigureKind {
  gauge,  // live: the receiver counts the sender's value with its own, and drops it when the sender goes
  total,  // grows: the receiver adds what the sender added
  peak,   // the highest: the receiver keeps the larger of the two
};
FigureKind figure_kind(std::string_view counter);

// Figures as "counts" messages, each well under a datagram's size.
std::vector<Message> counts_messages(const std::vector<Figure>& figures);
// False (and `out` as it was) when `m` is not a whole counts message.
bool read_counts(const Message& m, std::vector<Figure>& out);

// The last value of each figure, by key: what a sender last sent, or what a
// receiver last folded in.
class Tally {
 public:
  // The figures of `now` whose value differs from the last recorded (a
  // figure never recorded counts as 0), each recorded as it is now.
  // Recorded figures absent from `now` are reported with value 0: what
  // the sender no longer has is none.
  std::vector<Figure> changed(const std::vector<Figure>& now);
  // Records `f` and returns its value minus the last recorded (0 when new).
  std::int64_t update(const Figure& f);
  // The last recorded value of `f`'s key (0 when never recorded).
  std::uint64_t last(const Figure& f) const;
  // Every figure recorded with a value other than 0.
  std::vector<Figure> figures() const;
  void clear() { last_.clear(); }

 private:
  std::map<std::string, Figure> last_;
};

}  // namespace sluice::upgrade
