// The kernel fast path of a session (listener key `splice`): once both
// sockets are quiet, the session's two copy pumps hand their sockets to a
// Splicer, which moves bytes socket -> pipe -> socket with splice(2), so the
// payload never passes through sluice's memory. HAProxy's splicing, driven by
// the worker's edge-triggered readiness events.
//
// How it sits on the Reactor: the session's Legs stay registered as they
// are (edge-triggered, for reading and writing) and keep their readiness
// flags; once the session has handed over (both pumps stopped with empty
// queues), their events come here instead of to the pumps.
//
// Everything the copy pumps promise holds here too, and is kept in the same
// Pump objects so that the session cannot tell the modes apart:
// - backpressure: each direction owns one pipe (kPipeBytes, bounded by the
//   kernel); a full pipe stops reading from its source until the
//   destination takes bytes;
// - `Pump::bytes` counts what the destination's kernel accepted; bytes still
//   in a pipe when a session is reset were never delivered and do not count;
// - half-close: EOF from a source becomes shutdown(2) on the destination once
//   its pipe is empty; the other direction keeps flowing;
// - errors and EOFs go to the session's on_pump_* callbacks, so causes and
//   timeouts are the copy mode's.
//
// Each spliced session opens its two pipes (four descriptors) when it
// switches and closes them when it ends. No pool: descriptors come back the
// moment a session ends, and a session that splices is long enough for a
// pipe2(2) and two close(2)s not to matter (HAProxy pools them, bounded by
// maxpipes).
#pragma once

#include <cstddef>
#include <cstdint>

#include "proxy/leg.hpp"
#include "proxy/pump.hpp"
#include "proxy/reactor.hpp"

namespace sluice {

class Splicer final : public Deferred {
 public:
  // Bytes a direction must have moved, with its last read filling a whole
  // buffer, before splice = "auto" switches the session.
  static constexpr std::uint64_t kAutoBytes = 256 * 1024;
  // Capacity asked for each pipe (fcntl F_SETPIPE_SZ).
  static constexpr std::size_t kPipeBytes = 256 * 1024;

  Splicer() = default;
  ~Splicer();
  Splicer(const Splicer&) = delete;
  Splicer& operator=(const Splicer&) = delete;

  // Takes over the sockets of `c2s.src` (client) and `c2s.dst` (server).
  // The caller has stopped both pumps, whose write queues were empty.
  // Returns false when no pipe can be had (out of descriptors): the session
  // stays in copy mode, and keeps this object (never tried twice).
  bool start(Pump& c2s, Pump& s2c);
  // The events of one of the two Legs.
  void on_io(Leg& leg);
  // Closes the pipes (the session closes the sockets).
  void close();
  // No byte waits in either pipe (a binary upgrade may move the session).
  bool idle() const { return c2s_.in_pipe == 0 && s2c_.in_pipe == 0; }

  void run_deferred() override;

 private:
  struct Lane {
    Pump* pump = nullptr;
    Leg* src = nullptr;
    Leg* dst = nullptr;
    int pipe_r = -1;
    int pipe_w = -1;
    std::size_t in_pipe = 0;   // bytes spliced in and not yet out
    bool pipe_full = false;    // the last splice into the pipe found no room
  };

  // Moves what it can in one lane. Returns false when the session ended
  // inside (do not touch `this`).
  bool run(Lane& l);
  bool session_closing() const;

  Lane c2s_;
  Lane s2c_;
  bool started_ = false;
  bool closed_ = false;
};

}  // namespace sluice
