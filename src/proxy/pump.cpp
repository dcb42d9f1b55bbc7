#include "proxy/pump.hpp"

#include <sys/socket.h>

#include <cerrno>

#include "proxy/buffer_pool.hpp"
#include "proxy/session.hpp"
#include "proxy/splice.hpp"

namespace sluice {

namespace {

Pump* pump_of(const uv_handle_t* h) { return static_cast<Pump*>(static_cast<HandleOwner*>(h->data)); }

// The socket's pending error (SO_ERROR) as a libuv error code, 0 if none.
int pending_error(uv_stream_t* s) {
  uv_os_fd_t fd = -1;
  int err = 0;
  socklen_t len = sizeof err;
  if (uv_fileno(reinterpret_cast<uv_handle_t*>(s), &fd) != 0 ||
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err == 0) {
    return 0;
  }
  return uv_translate_sys_error(err);
}

}  // namespace

int Pump::start() {
  reading = true;
  return uv_read_start(src, on_alloc, on_read);
}

void Pump::stop() {
  if (reading) {
    uv_read_stop(src);
    reading = false;
  }
}

int Pump::write_initial(char* data, std::size_t len) {
  // Borrowed until the callback, which libuv always calls (ECANCELED when
  // the stream closes first).
  uv_write_t* req = session->pool().borrow<uv_write_t>();
  req->data = this;
  initial_len = static_cast<std::uint32_t>(len);
  ++writes_in_flight;
  uv_buf_t buf = uv_buf_init(data, static_cast<unsigned>(len));
  const int r = uv_write(req, dst, &buf, 1, [](uv_write_t* done, int status) {
    auto* p = static_cast<Pump*>(done->data);
    p->session->pool().give_back(done);
    --p->writes_in_flight;
    if (status < 0) {
      if (status != UV_ECANCELED && !p->session->closing()) p->session->on_pump_error(*p, status, true);
      return;
    }
    p->bytes += p->initial_len;
    p->session->touch();
    p->session->on_initial_written();
  });
  if (r < 0) {
    --writes_in_flight;
    session->pool().give_back(req);
  }
  return r;
}

void Pump::on_alloc(uv_handle_t* h, std::size_t /*suggested*/, uv_buf_t* buf) {
  Pump* p = pump_of(h);
  Buffer* b = p->session->pool().get();
  *buf = uv_buf_init(b->data, Buffer::kSize);
}

void Pump::on_read(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf) {
  Pump* p = pump_of(reinterpret_cast<uv_handle_t*>(s));
  if (nread > 0) {
    p->handle_data(buf->base, static_cast<std::size_t>(nread));
    return;
  }
  // An EOF that read(2) returned comes with the buffer libuv allocated for
  // it; libuv's other EOF, for a hang-up after a short read (it does not
  // read again), comes without one.
  const bool hangup = buf->base == nullptr;
  if (!hangup) p->session->pool().put(Buffer::from_data(buf->base));
  if (nread == 0 || p->session->closing()) return;  // 0 is EAGAIN, not EOF
  if (nread == UV_EOF) {
    // A reset is a hang-up too: only the socket's pending error tells a peer
    // that aborted from one that finished. Forwarding a FIN for a reset
    // would pass a truncated stream off as complete. (A read(2) that returns
    // 0 has no pending error to find: the kernel reports a reset instead.)
    if (const int err = hangup ? pending_error(s) : 0; err != 0) {
      p->session->on_pump_error(*p, err, false);
      return;
    }
    // libuv has stopped reading this stream. Forward the FIN once every byte
    // already queued for dst has been written (uv_shutdown waits for them).
    p->reading = false;
    p->eof = true;
    p->session->on_pump_eof(*p);
    if (uv_stream_get_write_queue_size(p->dst) == 0) {
      p->send_fin_now();
      return;
    }
    // Borrowed until on_shutdown, which libuv always calls (ECANCELED when
    // the stream closes first).
    uv_shutdown_t* req = p->session->pool().borrow<uv_shutdown_t>();
    req->data = p;
    int r = uv_shutdown(req, p->dst, on_shutdown);
    if (r < 0) {
      p->session->pool().give_back(req);
      p->session->on_pump_error(*p, r, true);
    }
    return;
  }
  p->session->on_pump_error(*p, static_cast<int>(nread), false);
}

void Pump::handle_data(char* base, std::size_t len) {
  Buffer* b = Buffer::from_data(base);
  session->touch();
  uv_buf_t out = uv_buf_init(base, static_cast<unsigned>(len));
  // Most writes complete at once; only the remainder is queued.
  int w = uv_try_write(dst, &out, 1);
  if (w == static_cast<int>(len)) {
    bytes += len;
    session->pool().put(b);
    // A read that filled a whole buffer, well into a session: a stream that
    // splice = "auto" hands to the kernel.
    if (len == Buffer::kSize && bytes >= Splicer::kAutoBytes) session->on_pump_stream();
    return;
  }
  if (w < 0 && w != UV_EAGAIN) {
    session->pool().put(b);
    session->on_pump_error(*this, w, true);
    return;
  }
  if (w > 0) {
    bytes += static_cast<std::size_t>(w);
    out.base += w;
    out.len -= static_cast<unsigned>(w);
  }
  b->pump = this;
  b->queued = static_cast<std::uint32_t>(out.len);
  int r = uv_write(&b->req, dst, &out, 1, on_write);
  if (r >= 0) ++writes_in_flight;
  if (r < 0) {
    session->pool().put(b);
    session->on_pump_error(*this, r, true);
    return;
  }
  if (uv_stream_get_write_queue_size(dst) > kHighWater) {
    uv_read_stop(src);
    reading = false;
    paused = true;
    ++pauses;
  }
}

void Pump::on_write(uv_write_t* req, int status) {
  Buffer* b = reinterpret_cast<Buffer*>(req);  // req is Buffer's first member
  Pump* p = b->pump;
  Session* s = p->session;
  const std::uint32_t queued = b->queued;
  s->pool().put(b);
  --p->writes_in_flight;
  if (status < 0) {
    if (status != UV_ECANCELED && !s->closing()) s->on_pump_error(*p, status, true);
    return;
  }
  p->bytes += queued;
  // A slow reader draining a queue is activity too: it must not be cut by
  // idle_timeout or fin_timeout.
  s->touch();
  p->after_write_progress();
  if (p->writes_in_flight == 0) s->on_pump_settled();
}

void Pump::after_write_progress() {
  if (!paused || eof || session->closing()) return;
  if (uv_stream_get_write_queue_size(dst) > kLowWater) return;
  paused = false;
  int r = start();
  if (r < 0) session->on_pump_error(*this, r, false);
}

// Nothing is queued for dst: the FIN goes now, with shutdown(2) itself.
// uv_shutdown would arm POLLOUT, wait a loop iteration for it and disarm it
// again: two epoll_ctl calls per direction for nothing.
//
// When the other direction is already done, the session closes both sockets
// as soon as this FIN is "sent", and close(2) sends it: dst's peer has
// finished sending, so nothing unread makes the close a reset. A shutdown(2)
// first would be one system call per session for nothing (nginx closes
// without one too).
void Pump::send_fin_now() {
  if (session->fin_ends_session(*this)) {
    fin_sent = true;
    session->on_pump_fin_sent(*this);
    return;
  }
  uv_os_fd_t fd = -1;
  int r = uv_fileno(reinterpret_cast<uv_handle_t*>(dst), &fd);
  if (r == 0 && ::shutdown(fd, SHUT_WR) != 0) r = uv_translate_sys_error(errno);
  if (r < 0) {
    session->on_pump_error(*this, r, true);
    return;
  }
  fin_sent = true;
  session->on_pump_fin_sent(*this);
}

void Pump::on_shutdown(uv_shutdown_t* req, int status) {
  auto* p = static_cast<Pump*>(req->data);
  p->session->pool().give_back(req);
  if (status == UV_ECANCELED || p->session->closing()) return;
  if (status < 0) {
    p->session->on_pump_error(*p, status, true);
    return;
  }
  p->fin_sent = true;
  p->session->on_pump_fin_sent(*p);
}

}  // namespace sluice
