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
// Rounds of read-then-write per readiness event, so that one fast session
// cannot starve the others on its loop; level-triggered polling brings it
// back for the rest.
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

int fd_of(uv_stream_t* s) {
  uv_os_fd_t fd = -1;
  return uv_fileno(reinterpret_cast<uv_handle_t*>(s), &fd) == 0 ? fd : -1;
}

}  // namespace

bool Splicer::start(uv_loop_t* loop, Pump& c2s, Pump& s2c, int& open_handles, uv_close_cb close_cb) {
  client_.fd = fd_of(c2s.src);
  server_.fd = fd_of(c2s.dst);
  if (client_.fd < 0 || server_.fd < 0) return false;
  c2s_ = Lane{&c2s, &client_, &server_};
  s2c_ = Lane{&s2c, &server_, &client_};
  client_.reads = &c2s_;
  client_.writes = &s2c_;
  server_.reads = &s2c_;
  server_.writes = &c2s_;
  for (Lane* l : {&c2s_, &s2c_}) {
    if (l->pump->eof) continue;  // that direction is over; it needs no pipe
    if (!open_pipe(l->pipe_r, l->pipe_w)) {
      close(close_cb);  // closes the pipe already opened, if any
      return false;
    }
  }
  for (Side* s : {&client_, &server_}) {
    s->session = c2s.session;
    s->splicer = this;
    s->poll.data = static_cast<HandleOwner*>(s);
  }
  for (Side* s : {&client_, &server_}) {
    if (uv_poll_init(loop, &s->poll, s->fd) != 0) {
      // A poll handle opened already must be closed like any other handle
      // of the session (this object lives until its callback).
      close(close_cb);
      return false;
    }
    s->open = true;
    ++open_handles;
  }
  update_interest(client_);
  update_interest(server_);
  return true;
}

Splicer::~Splicer() {
  for (Lane* l : {&c2s_, &s2c_}) close_pipe(l->pipe_r, l->pipe_w);
}

void Splicer::close(uv_close_cb close_cb) {
  if (closed_) return;
  closed_ = true;
  for (Side* s : {&client_, &server_}) {
    if (!s->open) continue;
    // uv_close stops the poll first, so the descriptor leaves epoll before
    // the session's uv_tcp_t closes it.
    uv_close(reinterpret_cast<uv_handle_t*>(&s->poll), close_cb);
  }
  for (Lane* l : {&c2s_, &s2c_}) close_pipe(l->pipe_r, l->pipe_w);
}

bool Splicer::session_closing() const { return c2s_.pump->session->closing(); }

void Splicer::on_poll(uv_poll_t* h, int status, int events) {
  Side* side = static_cast<Side*>(static_cast<HandleOwner*>(h->data));
  Splicer* sp = side->splicer;
  if (sp->closed_ || sp->session_closing()) return;
  if (status < 0) {
    side->reads->pump->session->on_pump_error(*side->reads->pump, status, false);
    return;
  }
  // Writes first: room in a pipe lets its reader go on in the same round.
  if ((events & UV_WRITABLE) != 0 && !sp->run(*side->writes, false)) return;
  if ((events & UV_READABLE) != 0 && !sp->run(*side->reads, true)) return;
  sp->update_interest(sp->client_);
  sp->update_interest(sp->server_);
}

bool Splicer::run(Lane& l, bool try_read) {
  Pump& p = *l.pump;
  Session* s = p.session;
  if (l.pipe_r < 0) return true;  // a direction that was over before the switch
  bool moved = false;
  for (int round = 0; round < kMaxRounds; ++round) {
    bool progress = false;
    if (try_read && !p.eof && !l.pipe_full) {
      const ssize_t n = ::splice(l.src->fd, nullptr, l.pipe_w, nullptr, kChunk, kSpliceFlags);
      if (n > 0) {
        l.in_pipe += static_cast<std::size_t>(n);
        progress = true;
      } else if (n == 0) {
        p.eof = true;
        s->on_pump_eof(p);
      } else if (errno == EAGAIN) {
        // Either the socket is empty or the pipe has no room; with bytes in
        // the pipe assume the latter until a write makes room (at worst one
        // extra splice then).
        if (l.in_pipe > 0) {
          l.pipe_full = true;
          ++p.pauses;
        }
        try_read = false;
      } else if (errno != EINTR) {
        s->on_pump_error(p, uv_translate_sys_error(errno), false);
        return false;
      }
    }
    if (l.in_pipe > 0) {
      const ssize_t m = ::splice(l.pipe_r, nullptr, l.dst->fd, nullptr, l.in_pipe, kSpliceFlags);
      if (m > 0) {
        l.in_pipe -= static_cast<std::size_t>(m);
        p.bytes += static_cast<std::uint64_t>(m);
        progress = true;
        l.dst_blocked = false;
        if (l.pipe_full) {
          l.pipe_full = false;
          try_read = true;
        }
      } else if (m < 0 && errno == EAGAIN) {
        l.dst_blocked = true;
      } else if (m < 0 && errno != EINTR) {
        s->on_pump_error(p, uv_translate_sys_error(errno), true);
        return false;
      }
    }
    if (p.eof && l.in_pipe == 0 && !p.fin_sent) {
      // The last FIN of the session goes with the close (as in Pump).
      if (!s->fin_ends_session(p) && ::shutdown(l.dst->fd, SHUT_WR) != 0) {
        s->on_pump_error(p, uv_translate_sys_error(errno), true);
        return false;
      }
      p.fin_sent = true;
      s->on_pump_fin_sent(p);
      if (s->closing()) return false;
    }
    moved = moved || progress;
    if (!progress || (!try_read && l.in_pipe == 0)) break;
  }
  if (moved) s->touch();
  return !s->closing();
}

void Splicer::update_interest(Side& side) {
  int want = 0;
  const Lane& in = *side.reads;
  const Lane& out = *side.writes;
  if (in.pipe_r >= 0 && !in.pump->eof && !in.pipe_full) want |= UV_READABLE;
  if (out.pipe_r >= 0 && out.in_pipe > 0) want |= UV_WRITABLE;
  if (want == side.events) return;
  side.events = want;
  if (want == 0) {
    uv_poll_stop(&side.poll);
  } else {
    uv_poll_start(&side.poll, want, on_poll);
  }
}

}  // namespace sluice
