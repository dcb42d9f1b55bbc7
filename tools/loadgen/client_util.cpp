#include "client_util.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <sys/socket.h>

namespace loadgen {

bool target_option(const Options& opts, const char* cmd, Target& out) {
  std::string text = opts.str("target");
  if (text.empty()) {
    std::fprintf(stderr, "loadgen %s: --target HOST:PORT is required\n", cmd);
    return false;
  }
  std::string error;
  if (!parse_target(text, out, error)) {
    std::fprintf(stderr, "loadgen %s: %s\n", cmd, error.c_str());
    return false;
  }
  return true;
}

void run_until(Poller& poller, const StopSignal& stop, Clock::time_point deadline,
               const std::function<bool()>& done, const std::function<void()>& after_batch) {
  while (!stop.stopped() && !done() && Clock::now() < deadline) {
    poller.poll(ms_until(deadline, 10));
    after_batch();
  }
}

void add_common(JsonLine& line, double elapsed, const ErrorTally& errors) {
  line.add("elapsed", elapsed);
  line.add("errors", errors.count());
  if (errors.count() > 0) line.add("first_error", errors.first());
  line.add("cpu_s", cpu_seconds_self());
}

std::string errno_text(const char* what, int err) {
  return std::string(what) + ": " + std::strerror(err);
}

long send_some(int fd, const char* data, std::size_t len) {
  ssize_t w = send(fd, data, len, MSG_NOSIGNAL);
  if (w < 0) return errno == EAGAIN ? 0 : -1;
  return static_cast<long>(w);
}

}  // namespace loadgen
