// SIGTERM/SIGINT (and optionally EOF on stdin) as an epoll event, so every
// loop can stop cleanly without async-signal-unsafe handlers.
#pragma once

#include "net.hpp"

namespace loadgen {

class StopSignal : public Handler {
 public:
  // Blocks SIGTERM/SIGINT for the process and ignores SIGPIPE; when
  // `watch_stdin` is set, EOF (or an error) on fd 0 also counts as a stop.
  StopSignal(Poller& poller, bool watch_stdin);
  ~StopSignal() override;
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;

  bool stopped() const { return stopped_; }
  void on_event(std::uint32_t events) override;

 private:
  class StdinWatch : public Handler {
   public:
    explicit StdinWatch(StopSignal& owner) : owner_(owner) {}
    void on_event(std::uint32_t events) override;

   private:
    StopSignal& owner_;
  };

  Poller& poller_;
  int fd_ = -1;
  bool stopped_ = false;
  bool watch_stdin_ = false;
  StdinWatch stdin_watch_{*this};
};

}  // namespace loadgen
