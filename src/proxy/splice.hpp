// The kernel fast path of a session (listener key `splice`): once both
// sockets are quiet, the session's two copy pumps hand their sockets to a
// Splicer, which moves bytes socket -> pipe -> socket with splice(2), so the
// payload never passes through sluice's memory. HAProxy's splicing, driven by
// libuv readiness events.
//
// How it sits on libuv: the session's uv_tcp_t handles stay open (they own
// the descriptors and close them), but neither reads nor writes any more; a
// uv_poll_t per socket takes over the descriptor's readiness. libuv allows a
// poll handle on a descriptor whose stream watcher is idle, which is why the
// switch waits until no write or shutdown is in flight on either socket.
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

#include <uv.h>

#include "proxy/pump.hpp"
#include "proxy/session_host.hpp"

namespace sluice {

class Splicer {
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

  // Takes over the descriptors of `c2s.src` (client) and `c2s.dst` (server).
  // The caller has stopped both pumps' reading and made sure no write or
  // shutdown is in flight. Returns false when no pipe can be had (out of
  // descriptors): the session stays in copy mode, and keeps this object
  // until its last close callback. `open_handles` is the session's count of
  // handles awaiting a close callback (`close_cb`), raised for each poll
  // handle opened.
  bool start(uv_loop_t* loop, Pump& c2s, Pump& s2c, int& open_handles, uv_close_cb close_cb);
  // Stops both polls and closes their handles (callbacks go to the session's
  // close callback, `close_cb`) and closes the pipes. Call before the
  // session's uv_tcp_t handles are closed.
  void close(uv_close_cb close_cb);

 private:
  struct Lane;
  struct Side : HandleOwner {
    uv_poll_t poll{};
    Splicer* splicer = nullptr;
    int fd = -1;
    int events = 0;     // what the poll is started with now
    bool open = false;  // poll initialised (closed with the session)
    Lane* reads = nullptr;   // the lane that reads this socket
    Lane* writes = nullptr;  // the lane that writes it
  };
  struct Lane {
    Pump* pump = nullptr;
    Side* src = nullptr;
    Side* dst = nullptr;
    int pipe_r = -1;
    int pipe_w = -1;
    std::size_t in_pipe = 0;   // bytes spliced in and not yet out
    bool pipe_full = false;    // the last splice into the pipe found no room
    bool dst_blocked = false;  // the last splice out found the socket full
  };

  static void on_poll(uv_poll_t* h, int status, int events);
  // Moves what it can in one lane. `try_read`: the source may have bytes.
  // Returns false when the session ended inside (do not touch `this`).
  bool run(Lane& l, bool try_read);
  void update_interest(Side& s);
  bool session_closing() const;

  Side client_;
  Side server_;
  Lane c2s_;
  Lane s2c_;
  bool closed_ = false;
};

}  // namespace sluice
