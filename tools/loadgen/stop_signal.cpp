#include "stop_signal.hpp"

#include <csignal>

#include <sys/signalfd.h>
#include <unistd.h>

namespace loadgen {

StopSignal::StopSignal(Poller& poller, bool watch_stdin) : poller_(poller), watch_stdin_(watch_stdin) {
  std::signal(SIGPIPE, SIG_IGN);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigprocmask(SIG_BLOCK, &set, nullptr);
  fd_ = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd_ >= 0) poller_.add(fd_, EPOLLIN, this);
  if (watch_stdin_) poller_.add(STDIN_FILENO, EPOLLIN, &stdin_watch_);
}

StopSignal::~StopSignal() {
  if (watch_stdin_) poller_.remove(STDIN_FILENO);
  if (fd_ >= 0) close(fd_);
}

void StopSignal::on_event(std::uint32_t /*events*/) {
  signalfd_siginfo info{};
  while (read(fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    stopped_ = true;
  }
}

void StopSignal::StdinWatch::on_event(std::uint32_t /*events*/) {
  char buf[256];
  ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
  if (n <= 0) {
    // Stop watching: a closed stdin stays readable forever.
    owner_.poller_.remove(STDIN_FILENO);
    owner_.watch_stdin_ = false;
    owner_.stopped_ = true;
  }
}

}  // namespace loadgen
