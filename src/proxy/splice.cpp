#include "proxy/splice.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "proxy/session.hpp"

namespace sluice {

namespace {

// Asked of every splice into a pipe: the kernel moves what fits.
constexpr std::size_t kChunk = 1 << 20;
// Rounds of read-then-write per turn, so that one fast session cannot
// starve the others on its loop; the rest is deferred to the next round.
constexpr int kMaxRounds = 16;
constexpr unsigned kSpliceFlags = SPLICE_F_MOVE | SPLICE_F_NONBLOCK;

bool open_pipe(int& r, int& w) {
  int fds[2];
  if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) return false;
  // 256 KiB instead of the default 64: a quarter of the splice calls per
  // GB, and still about what copy mode buffers per direction (128 KiB
  // queued plus a read buffer). Best effort: a smaller pipe only costs calls.
  ::fcntl(fds[1], F_SETPIPE_SZ, static_cast<int>(Splicer::kPipeBytes));
  r = fds[0];
  w = fds[1];
  return true;
}

void close_pipe(int& r, int& w) {
  if (r < 0) return;
  ::close(r);
  ::close(w);
  r = w = -1;
}

}  // namespace

bool Splicer::start(Pump& c2s, Pump& s2c) {
  started_ = true;
  c2s_ = Lane{&c2s, c2s.src, c2s.dst};
  s2c_ = Lane{&s2c, s2c.src, s2c.dst};
  for (Lane* l : {&c2s_, &s2c_}) {
    if (l->pump->eof) continue;  // that direction is over; it needs no pipe
    if (!open_pipe(l->pipe_r, l->pipe_w)) {
      close();  // closes the pipe already opened, if any
      return false;
    }
  }
  // What the sockets hold already moves now, edges or not.
  c2s.session->reactor().defer(*this);
  return true;
}

Splicer::~Splicer() {
  for (Lane* l : {&c2s_, &s2c_}) close_pipe(l->pipe_r, l->pipe_w);
}

void Splicer::close() {
  if (closed_) return;
  closed_ = true;
  if (c2s_.pump != nullptr) c2s_.pump->session->reactor().cancel(*this);
  for (Lane* l : {&c2s_, &s2c_}) close_pipe(l->pipe_r, l->pipe_w);
}

bool Splicer::session_closing() const { return c2s_.pump->session->closing(); }

void Splicer::on_io(Leg& /*leg*/) {
  // Both lanes: room made in a socket (or a pipe) may let either go on.
  run_deferred();
}

void Splicer::run_deferred() {
  if (closed_ || session_closing()) return;
  if (!run(c2s_)) return;
  run(s2c_);
}

bool Splicer::run(Lane& l) {
  Pump& p = *l.pump;
  Session* s = p.session;
  if (l.pipe_r < 0) return true;  // a direction that was over before the switch
  bool moved = false;
  for (int round = 0;; ++round) {
    if (round == kMaxRounds) {
      // Fair to the loop's other sessions: the rest after them.
      s->reactor().defer(*this);
      break;
    }
    bool progress = false;
    if (l.src->readable && !p.eof && !l.pipe_full) {
      const ssize_t n = ::splice(l.src->fd, nullptr, l.pipe_w, nullptr, kChunk, kSpliceFlags);
      if (n > 0) {
        l.in_pipe += static_cast<std::size_t>(n);
        progress = true;
        s->mark_read(p.src_is_client);
      } else if (n == 0) {
        l.src->readable = false;
        p.eof = true;
        s->on_pump_eof(p);
        if (s->closing()) return false;
      } else if (errno == EAGAIN) {
        // Either the socket is empty or the pipe has no room. An empty pipe
        // has room, so then the socket is empty; with bytes in the pipe,
        // assume it is full and try again once a write made room (at worst
        // one extra splice then), keeping the socket marked readable.
        if (l.in_pipe > 0) {
          l.pipe_full = true;
          ++p.pauses;
        } else {
          l.src->readable = false;
        }
      } else if (errno != EINTR) {
        s->on_pump_error(p, -errno, false);
        return false;
      }
    }
    if (l.in_pipe > 0 && l.dst->writable) {
      const ssize_t m = ::splice(l.pipe_r, nullptr, l.dst->fd, nullptr, l.in_pipe, kSpliceFlags);
      if (m > 0) {
        l.in_pipe -= static_cast<std::size_t>(m);
        p.bytes += static_cast<std::uint64_t>(m);
        progress = true;
        l.pipe_full = false;
      } else if (m < 0 && errno == EAGAIN) {
        l.dst->writable = false;  // room comes with a new edge
      } else if (m < 0 && errno != EINTR) {
        s->on_pump_error(p, -errno, true);
        return false;
      }
    }
    if (p.eof && l.in_pipe == 0 && !p.fin_sent) {
      // The last FIN of the session goes with the close (as in Pump).
      if (!s->fin_ends_session(p) && ::shutdown(l.dst->fd, SHUT_WR) != 0) {
        s->on_pump_error(p, -errno, true);
        return false;
      }
      p.fin_sent = true;
      s->on_pump_fin_sent(p);
      if (s->closing()) return false;
    }
    moved = moved || progress;
    if (!progress) break;
  }
  if (moved) s->touch();
  return !s->closing();
}

}  // namespace sluice
