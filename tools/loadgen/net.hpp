// Small non-blocking socket and epoll helpers shared by the server and clients.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <sys/epoll.h>
#include <sys/socket.h>

namespace loadgen {

using Clock = std::chrono::steady_clock;

inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The time point `seconds` after `from`.
inline Clock::time_point after_seconds(Clock::time_point from, double seconds) {
  return from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// A resolved "host:port" or "[v6]:port" (numeric hosts and names via getaddrinfo).
struct Target {
  std::string text;
  sockaddr_storage addr{};
  socklen_t len = 0;
};

// Returns false and fills `error` when the text does not resolve.
bool parse_target(const std::string& text, Target& out, std::string& error);

// Starts a non-blocking connect; returns the fd (connect may still be in
// progress) or -1 with errno set.
int start_connect(const Target& target);
// After EPOLLOUT on a connecting socket: 0 when connected, else the error.
int connect_result(int fd);

// Listening socket on host:port (port 0 = ephemeral); writes the bound port.
// Returns -1 with errno set on failure.
int listen_on(const std::string& host, std::uint16_t port, std::uint16_t& bound_port);

void set_nodelay(int fd);
void set_nonblocking(int fd);
// Raises the soft open-file limit to the hard limit (idle loads hold thousands).
void raise_fd_limit();
// utime + stime of this process in seconds.
double cpu_seconds_self();

// Something that reacts to readiness of one fd.
class Handler {
 public:
  virtual ~Handler() = default;
  virtual void on_event(std::uint32_t events) = 0;
};

// Level-triggered epoll dispatching to Handler objects.
// A handler may close its own fd or delete itself inside on_event; it must not
// delete another handler, which may still have an event pending in the batch.
class Poller {
 public:
  Poller();
  ~Poller();
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

  void add(int fd, std::uint32_t events, Handler* handler);
  void modify(int fd, std::uint32_t events, Handler* handler);
  // Closing an fd removes it from epoll as well; this is for fds that stay open.
  void remove(int fd);
  // Waits up to timeout_ms and dispatches; returns the number of events.
  int poll(int timeout_ms);

 private:
  int fd_ = -1;
};

// Milliseconds from now until `deadline`, clamped to [0, cap_ms].
int ms_until(Clock::time_point deadline, int cap_ms);

}  // namespace loadgen
