// The hand-over channel of a binary upgrade: a Unix SOCK_SEQPACKET socket
// pair between the serving process and the new one it started. Each message
// is one datagram: a header (magic, format version, kind), a payload of a
// few fields, and descriptors passed with SCM_RIGHTS. A datagram is never
// split or merged, so a message arrives whole with its descriptors or not at
// all.
//
// Only the two sluice processes speak it; the format version is in every
// header, and the first message (hello) is where a new binary that speaks
// another version is told so and refused, before anything is handed over.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::upgrade {

// Raised whenever a message's layout or meaning changes. 2: a server
// message carries passive health too. 3: a session message carries the
// bytes it had read and not yet written. 4: client messages carry the
// client_rate_limit buckets. 5: the two processes' live counts travel
// ("counts"), a session carries its id and is closed by the old process
// only once the new one has acknowledged it ("adopted"), the new process
// starts accepting once the old one has stopped ("released"), and a new
// process that cannot start says why ("failed").
inline constexpr std::uint16_t kFormatVersion = 5;

// The environment variable that names the new process's end of the channel.
inline constexpr const char* kFdEnv = "SLUICE_UPGRADE_FD";

enum class Kind : std::uint16_t {
  hello = 1,     // new -> old: the format version it speaks, its PID
  refuse = 2,    // old -> new: the hand-over is off (reason in the payload)
  listener = 3,  // old -> new: one listening address: key, bound address; its sockets
  admin = 4,     // old -> new: the admin API's listening socket
  go = 5,        // old -> new: everything is handed over, start serving
  ready = 6,     // new -> old: serving (not accepting yet); stop accepting
  session = 7,   // old -> new: one live session: its record; client and server sockets
  server = 8,    // old -> new: runtime state and history of one server
  client = 9,    // old -> new: a listener's client_rate_limit buckets that are not full
  counts = 10,   // both ways: the sender's own live counts and totals (see Counts)
  service = 11,  // old -> new: what the service has done: start time, configuration generation, reloads
  released = 12, // old -> new: every worker here has stopped accepting: accept now
  adopted = 13,  // new -> old: a session is counted and registered here, untouched yet: worker, seq
  declined = 14, // new -> old: a session this process will not carry: worker, seq, why
  failed = 15,   // new -> old: why this process cannot start: level, message
  stopping = 16, // new -> old: this process was told to stop while sessions were on their way
};

struct Message {
  std::uint16_t version = kFormatVersion;
  Kind kind = Kind::hello;
  // Fields, in order; each a string of bytes (numbers as decimal text:
  // readable in a trace and independent of either build's layout).
  std::vector<std::string> fields;
  std::vector<int> fds;  // owned by whoever holds the message

  void close_fds();
};

// Sends `m` (blocking up to `timeout_ms` for room). Returns "" or the error.
std::string send(int fd, const Message& m, int timeout_ms);

// As send(), never blocking. `full`: the other process has not read enough
// yet for this message, and nothing of it was sent (a datagram goes whole
// or not at all): the caller tries again later. `error` names what broke.
// A worker's loop or the control loop sends this way what it can send
// again, so that a slow peer delays the hand-over but never the loop.
enum class SendStatus { ok, full, error };
SendStatus try_send(int fd, const Message& m, std::string& error);

enum class RecvStatus { ok, again, closed, error };
// Receives one message without blocking. On `ok`, `m` holds it (its
// descriptors are the caller's). `error` names what was wrong.
RecvStatus receive(int fd, Message& m, std::string& error);
// As receive(), waiting up to `timeout_ms` for a message.
RecvStatus receive_wait(int fd, Message& m, std::string& error, int timeout_ms);

// One end of the channel, closed with the last reference: the control loop
// reads it while worker threads send on it, so none may close it under the
// others.
class Channel {
 public:
  explicit Channel(int fd) : fd_(fd) {}
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

// The new process's word that it cannot start (a configuration error, a
// socket it cannot open), sent before it exits so that the old process can
// log it. Best effort: errors are ignored.
void tell_failure(int fd, std::string_view level, std::string_view message);

// A fault for the upgrade tests, set only by the test build sluice-next
// (SLUICE_TEST_EXIT_AFTER_ADOPTING): the process dies, as a crash would,
// instead of acknowledging its (n + 1)th adopted session. 0 = never (the
// production binary never sets it). Called before each "adopted" answer.
void exit_after_adopting(std::uint64_t n);
void before_adopted_answer();

// A fault for the upgrade tests, set only by sluice-next
// (SLUICE_TEST_STALL_RECEIVING_MS): the new process's control thread stops
// reading the channel for `ms` at the first session handed over, as a
// process the kernel does not schedule would. 0 = never.
void stall_receiving(std::uint64_t ms);
void on_session_received();

// Numbers as fields.
std::string field(std::uint64_t v);
std::uint64_t number(std::string_view s);
// As number(), but false unless `s` is all digits and fits.
bool parse_number(std::string_view s, std::uint64_t& v);

}  // namespace sluice::upgrade
