// What a live session needs to carry on in a new process after a binary
// upgrade, besides its two sockets: where it belongs (listener, upstream,
// server identity, so that least_conn counts, max_conns and health
// bookkeeping stay exact), what it has done (bytes, tries, times as ages so
// that two processes' clocks need not agree), and what a preread or a PROXY
// header learnt. Its access record is written by the process that ends it,
// with these figures included.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "upgrade/channel.hpp"

namespace sluice::upgrade {

struct SessionRecord {
  // Which session this is, for the new process's answer (adopted or
  // declined): the old process's worker and that worker's count of moves.
  std::uint64_t worker = 0;
  std::uint64_t seq = 0;
  std::string listener;
  std::string upstream;         // the upstream in use (a fallback, maybe)
  std::string origin_upstream;  // the one routed to
  std::string server_identity;  // server_identity(address): family, IP, scope, port
  std::string peer;             // the client's address (sockaddr bytes; empty: unknown)
  std::string destination;      // from a PROXY header (sockaddr bytes; empty: none)
  std::string sni;
  std::string alpn;
  std::uint64_t bytes_in = 0;   // client -> server, delivered
  std::uint64_t bytes_out = 0;  // server -> client, delivered
  std::uint64_t age_ms = 0;     // since accept
  std::uint64_t connect_ms = 0; // from accept to connected
  std::uint64_t idle_ms = 0;    // since the last byte either way
  std::uint64_t tries = 0;
  // Bytes read and not yet written, sent along (copy mode): client ->
  // server first, then server -> client, in a memory file passed as a
  // third descriptor (any size, not bound by a datagram's).
  std::uint64_t pending_in = 0;
  std::uint64_t pending_out = 0;

  // The message, with the client's and the server's sockets and, when
  // bytes are pending, the memory file that holds them (none owned).
  Message to_message(int client_fd, int server_fd, int pending_fd = -1) const;
  // False when `m` is not a whole session record (its descriptors are then
  // still the caller's to close).
  static bool from_message(const Message& m, SessionRecord& out);
};

// The new process's answer about one session: `adopted` (counted and
// registered, not touched yet: the old process may close its copies) or
// `declined` (it will not carry it: the old process carries on with it).
Message session_answer(Kind kind, std::uint64_t worker, std::uint64_t seq, std::string_view why = {});
// False when `m` is not such an answer.
bool read_session_answer(const Message& m, std::uint64_t& worker, std::uint64_t& seq);

}  // namespace sluice::upgrade
