#include "proxy/reactor.hpp"

#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <string>

namespace sluice {

Deferred::~Deferred() { unlink(); }

void Deferred::unlink() {
  if (!queued_) return;
  if (prev_ != nullptr) {
    prev_->next_ = next_;
  } else {
    *head_ = next_;
  }
  if (next_ != nullptr) next_->prev_ = prev_;
  prev_ = next_ = nullptr;
  head_ = nullptr;
  queued_ = false;
}

Reactor::Reactor(uv_loop_t* loop) : loop_(loop) {
  epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0) throw std::runtime_error(std::string("epoll_create1: ") + uv_strerror(-errno));
}

Reactor::~Reactor() {
  if (epfd_ >= 0) ::close(epfd_);
}

int Reactor::add(int fd, std::uint32_t events, IoWatcher* w) {
  epoll_event e{};
  e.events = events;
  e.data.ptr = w;
  return ::epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &e) == 0 ? 0 : -errno;
}

int Reactor::remove(int fd) {
  epoll_event e{};  // ignored, but old kernels want one
  return ::epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, &e) == 0 ? 0 : -errno;
}

void Reactor::defer(Deferred& d) {
  if (d.queued_) return;
  // At the front: the order among deferred work does not matter.
  d.prev_ = nullptr;
  d.next_ = deferred_;
  if (deferred_ != nullptr) deferred_->prev_ = &d;
  deferred_ = &d;
  d.head_ = &deferred_;
  d.queued_ = true;
}

int Reactor::run_once(int timeout_ms) {
  if (deferred_ != nullptr) timeout_ms = 0;
  epoll_event events[kMaxEvents];
  int n = ::epoll_wait(epfd_, events, kMaxEvents, timeout_ms);
  if (n < 0) n = 0;  // EINTR: a signal for another thread; nothing to do
  uv_update_time(loop_);
  if (timing_) {
    woke_ns_ = uv_hrtime();
    last_events_ = n;
  }
  for (int i = 0; i < n; ++i) static_cast<IoWatcher*>(events[i].data.ptr)->on_io(events[i].events);
  // The work deferred before this point runs now; what it defers again
  // waits for the next round (after a wait that does not block).
  Deferred* running = deferred_;
  deferred_ = nullptr;
  for (Deferred* d = running; d != nullptr; d = d->next_) d->head_ = &running;
  while (running != nullptr) {
    Deferred* d = running;
    d->unlink();
    d->run_deferred();
  }
  return n;
}

}  // namespace sluice
