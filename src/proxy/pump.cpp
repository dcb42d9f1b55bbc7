#include "proxy/pump.hpp"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "proxy/buffer_pool.hpp"
#include "proxy/session.hpp"
#include "proxy/splice.hpp"

namespace sluice {

namespace {

constexpr int kMaxIov = 16;

// Both legs are sockets: recv/send/sendmsg go to the socket layer without
// read(2)'s file-position lookup and VFS dispatch, which showed in profiles
// of keep-alive traffic.
ssize_t send_iov(int fd, iovec* iov, int n) {
  if (n == 1) return ::send(fd, iov[0].iov_base, iov[0].iov_len, MSG_NOSIGNAL);
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<std::size_t>(n);
  return ::sendmsg(fd, &msg, MSG_NOSIGNAL);
}

}  // namespace

void Pump::start() {
  running = true;
  flush();  // what queue_initial() put first
  if (!session->closing()) pull();
}

void Pump::stop() {
  running = false;
  session->reactor().cancel(*this);
  while (head_ != nullptr) {
    Buffer* b = head_;
    head_ = b->next;
    session->pool().put(b);
  }
  tail_ = nullptr;
  queued = 0;
}

void Pump::hold() {
  running = false;
  session->reactor().cancel(*this);
}

void Pump::queue_initial(const std::uint8_t* data, std::size_t len) {
  while (len > 0) {
    Buffer* b = session->pool().get();
    const std::size_t n = std::min(len, Buffer::kSize);
    std::memcpy(b->data, data, n);
    b->end = static_cast<std::uint32_t>(n);
    enqueue(b);
    data += n;
    len -= n;
  }
}

void Pump::append_queued(std::string& out) const {
  for (const Buffer* b = head_; b != nullptr; b = b->next) {
    out.append(reinterpret_cast<const char*>(b->data + b->begin), b->size());
  }
}

void Pump::enqueue(Buffer* b) {
  b->next = nullptr;
  if (tail_ != nullptr) {
    tail_->next = b;
  } else {
    head_ = b;
  }
  tail_ = b;
  queued += b->size();
}

void Pump::pull() {
  int reads = 0;
  while (running && !paused && !eof && src->readable) {
    if (reads == kReadsPerTurn) {
      session->reactor().defer(*this);
      return;
    }
    ++reads;
    Buffer* b = session->pool().get();
    const ssize_t n = ::recv(src->fd, b->data, Buffer::kSize, 0);
    if (n > 0) {
      // A short read emptied the socket: the next bytes bring a new edge.
      // After the peer's FIN it did not: read on, to the EOF.
      if (static_cast<std::size_t>(n) < Buffer::kSize && !src->rdhup) src->readable = false;
      b->end = static_cast<std::uint32_t>(n);
      session->touch();
      session->mark_read(src_is_client);
      const bool full = static_cast<std::size_t>(n) == Buffer::kSize;
      if (!deliver(b)) return;
      // A read that filled a whole buffer, well into a session: a stream
      // that splice = "auto" hands to the kernel.
      if (full && bytes >= Splicer::kAutoBytes) session->on_pump_stream();
      continue;
    }
    session->pool().put(b);
    if (n == 0) {
      src->readable = false;
      on_eof();
      return;
    }
    const int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      src->readable = false;
      return;
    }
    if (err == EINTR) continue;
    session->on_pump_error(*this, -err, false);
    return;
  }
}

// `b` is either new (written at once if nothing is queued before it) or
// already at the head of the queue.
bool Pump::deliver(Buffer* b) {
  if (head_ != nullptr || !dst->writable) {
    enqueue(b);
  } else {
    const ssize_t w = ::send(dst->fd, b->data + b->begin, b->size(), MSG_NOSIGNAL);
    if (w == static_cast<ssize_t>(b->size())) {
      bytes += static_cast<std::uint64_t>(w);
      session->pool().put(b);
      return true;
    }
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      const int err = errno;
      session->pool().put(b);
      session->on_pump_error(*this, -err, true);
      return false;
    }
    // Cut short or refused: the kernel's buffer is full, and it says so
    // with an edge when it has room again.
    dst->writable = false;
    if (w > 0) {
      bytes += static_cast<std::uint64_t>(w);
      b->begin += static_cast<std::uint32_t>(w);
    }
    enqueue(b);
  }
  if (queued > kHighWater && !paused) {
    paused = true;
    ++pauses;
  }
  return true;
}

void Pump::flush() {
  if (!running || head_ == nullptr || !dst->writable) return;
  bool progress = false;
  while (head_ != nullptr) {
    iovec iov[kMaxIov];
    int n = 0;
    std::size_t want = 0;
    for (Buffer* b = head_; b != nullptr && n < kMaxIov; b = b->next, ++n) {
      iov[n].iov_base = b->data + b->begin;
      iov[n].iov_len = b->size();
      want += b->size();
    }
    const ssize_t w = send_iov(dst->fd, iov, n);
    if (w < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        dst->writable = false;
        break;
      }
      session->on_pump_error(*this, -err, true);
      return;
    }
    progress = true;
    bytes += static_cast<std::uint64_t>(w);
    queued -= static_cast<std::uint32_t>(w);
    auto left = static_cast<std::size_t>(w);
    while (left > 0) {
      Buffer* b = head_;
      const std::size_t take = std::min<std::size_t>(left, b->size());
      b->begin += static_cast<std::uint32_t>(take);
      left -= take;
      if (b->size() == 0) {
        head_ = b->next;
        if (head_ == nullptr) tail_ = nullptr;
        session->pool().put(b);
      }
    }
    if (static_cast<std::size_t>(w) < want) {
      dst->writable = false;  // cut short: room comes with a new edge
      break;
    }
  }
  if (!progress) return;
  // A slow reader draining a queue is activity too: it must not be cut by
  // idle_timeout or fin_timeout.
  session->touch();
  after_write_progress();
}

void Pump::after_write_progress() {
  if (head_ == nullptr) {
    if (eof && !fin_sent) {
      send_fin_now();
      return;
    }
    session->on_pump_settled();
    if (session->closing()) return;
  }
  if (paused && queued <= kLowWater) {
    paused = false;
    pull();
  }
}

void Pump::on_eof() {
  eof = true;
  session->on_pump_eof(*this);
  if (session->closing()) return;
  // The FIN follows the queued bytes (flush() sends it when they are out).
  if (head_ == nullptr) send_fin_now();
}

// Nothing is queued for dst: the FIN goes now.
//
// When the other direction is already done, the session closes both sockets
// as soon as this FIN is "sent", and close(2) sends it: dst's peer has
// finished sending, so nothing unread makes the close a reset. A shutdown(2)
// first would be one system call per session for nothing (nginx closes
// without one too).
void Pump::send_fin_now() {
  if (!session->fin_ends_session(*this) && ::shutdown(dst->fd, SHUT_WR) != 0) {
    session->on_pump_error(*this, -errno, true);
    return;
  }
  fin_sent = true;
  session->on_pump_fin_sent(*this);
}

}  // namespace sluice
