// Errors by origin. A connect that fails because sluice itself ran out of
// something (file descriptors, ephemeral ports, kernel buffers, memory) says
// nothing about the server: it must never count against the server's health,
// and it ends the session with its own cause (local_resource).
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

#include <uv.h>

namespace sluice {

inline bool is_local_resource_error(int uv_err) {
  return uv_err == UV_EMFILE || uv_err == UV_ENFILE || uv_err == UV_EADDRNOTAVAIL || uv_err == UV_ENOBUFS ||
         uv_err == UV_ENOMEM;
}

// At most one warning per second, process-wide, however many threads report;
// the next line says how many were held back. For errors that come in storms.
class RateLimitedWarning {
 public:
  explicit RateLimitedWarning(std::uint64_t interval_ms = 1000) : interval_ms_(interval_ms) {}
  // `message` is only formatted into the log when the line is written.
  void warn(std::string_view message);

 private:
  std::uint64_t interval_ms_;
  std::atomic<std::uint64_t> next_ms_{0};
  std::atomic<std::uint64_t> held_back_{0};
};

}  // namespace sluice
