// The connection handling the conn and rr slots share: a non-blocking connect
// to the target, reads into the load's scratch buffer, and parking for
// kRetryDelay after a failure so the slot driver restarts the slot later.
#pragma once

#include <cerrno>
#include <cstddef>
#include <string>

#include <unistd.h>

#include "slot_driver.hpp"

namespace loadgen {

// Load: a SlotLoad with a `std::vector<char> scratch` for replies.
template <class Load>
class TcpSlot : public Handler {
 public:
  explicit TcpSlot(Load& load) : load_(load) {}
  bool ready_to_start(Clock::time_point now) const { return fd_ < 0 && now >= retry_at_; }

  void abandon() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 protected:
  // Starts connecting; a connect that fails at once is counted and parks the slot.
  void connect() {
    fd_ = start_connect(load_.target);
    if (fd_ < 0) {
      load_.errors.add(errno_text("connect", errno));
      retry_at_ = Clock::now() + kRetryDelay;
      return;  // parked; the driver retries
    }
    connecting_ = true;
    load_.poller.add(fd_, EPOLLOUT, this);
  }

  // For the first event while connecting_: true once connected, false when the
  // connect failed (the slot is failed and parked).
  bool finish_connect() {
    int err = connect_result(fd_);
    if (err != 0) {
      fail(errno_text("connect", err));
      return false;
    }
    connecting_ = false;
    return true;
  }

  // Reads what has arrived into load_.scratch. Returns the byte count, or 0
  // when nothing has yet (EAGAIN) or the slot failed; `closed_why` names a close
  // by the peer.
  std::size_t read_reply(const char* closed_why) {
    ssize_t n = read(fd_, load_.scratch.data(), load_.scratch.size());
    if (n < 0) {
      if (errno != EAGAIN) fail(errno_text("read", errno));
      return 0;
    }
    if (n == 0) fail(closed_why);
    return static_cast<std::size_t>(n);
  }

  // Closes the connection and parks the slot; errors after the deadline are not counted.
  void fail(const std::string& why) {
    close(fd_);
    fd_ = -1;
    retry_at_ = Clock::now() + kRetryDelay;
    if (load_.running) load_.errors.add(why);
  }

  Load& load_;
  int fd_ = -1;
  bool connecting_ = false;

 private:
  Clock::time_point retry_at_;
};

}  // namespace loadgen
