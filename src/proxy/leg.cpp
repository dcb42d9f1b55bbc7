#include "proxy/leg.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proxy/fork_guard.hpp"
#include "proxy/session.hpp"

namespace sluice {

void Leg::on_io(std::uint32_t events) {
  if (fd < 0) return;  // closed earlier in this round
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) readable = true;
  if ((events & (EPOLLRDHUP | EPOLLHUP)) != 0) rdhup = true;
  if ((events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) != 0) writable = true;
  session->on_leg_io(*this, events);
}

void Leg::close(bool reset) {
  if (fd < 0) return;
  if (reset) {
    // An RST instead of a FIN: the only way TCP can say "aborted".
    const linger l{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  }
  // close(2) also takes it out of the Reactor's set, unless a fork's child
  // (fork_guard.hpp) or another process (`shared`) holds a copy of it:
  // then it goes out first.
  const bool forking = fork_guard::begin_close();
  if ((forking || shared) && registered) session->reactor().remove(fd);
  ::close(fd);
  fork_guard::end_close();
  fd = -1;
  registered = false;
  readable = false;
  writable = false;
  rdhup = false;
}

}  // namespace sluice
