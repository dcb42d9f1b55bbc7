// Pieces every client load shares: reading --target, the timed event loop,
// and the common fields of the JSON report.
#pragma once

#include <functional>
#include <string>

#include "net.hpp"
#include "options.hpp"
#include "stats.hpp"
#include "stop_signal.hpp"

namespace loadgen {

// Resolves --target; prints "loadgen CMD: ..." and returns false on failure.
bool target_option(const Options& opts, const char* cmd, Target& out);

// Runs the poller until `deadline`, a stop signal, or `done()` returns true.
// `after_batch` runs after every wakeup (restarting parked slots and the like).
void run_until(Poller& poller, const StopSignal& stop, Clock::time_point deadline,
               const std::function<bool()>& done, const std::function<void()>& after_batch);

// Adds "elapsed", "errors", "first_error" (when any) and "cpu_s".
void add_common(JsonLine& line, double elapsed, const ErrorTally& errors);

// "connect: Connection refused" style message for errno values.
std::string errno_text(const char* what, int err);

// How long a client slot waits after a failure before it tries again.
inline constexpr std::chrono::milliseconds kRetryDelay{1};

// Sends as much as the socket takes; returns bytes written (0 on EAGAIN) or -1.
long send_some(int fd, const char* data, std::size_t len);

}  // namespace loadgen
