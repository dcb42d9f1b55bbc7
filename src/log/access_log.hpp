// The access log: exactly one record per session, written when it ends
// (and, with log_interval, interim records while a long session runs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "sluice/cause.hpp"
#include "sluice/config.hpp"

namespace spdlog {
class logger;
}

namespace sluice {

// The moments of a session that an access record gives with [global]
// log_phases, in microseconds after accept4() returned its connection.
enum class Phase : std::uint8_t { pick, connect, connected, first_in, first_out, close };
inline constexpr std::size_t kPhases = 6;

// Where a session's time went, for the slowest against the median.
struct PhaseTimes {
  std::int32_t at_us[kPhases];  // per Phase; -1 where the session never got there
  // The worker's loop turn that accepted the connection: how long it had
  // run before this accept, and how many events its wait returned.
  std::int32_t turn_us = -1;
  std::uint32_t turn_events = 0;
};

struct AccessRecord {
  std::string_view listener;
  std::string_view upstream; // the upstream used (a fallback's name when one was used); empty if none
  std::string_view client;   // "ip:port"
  std::string_view server;   // "ip:port", empty if none was chosen
  std::string_view sni;      // empty if none
  std::string_view alpn;     // comma-separated, empty if none
  unsigned tries = 0;        // connect attempts
  bool fallback = false;     // the routed upstream had no server: `upstream` is its fallback
  std::uint64_t bytes_in = 0;   // received from the client
  std::uint64_t bytes_out = 0;  // sent to the client
  std::int64_t connect_ms = -1; // time to the successful connect, -1 if none
  std::int64_t duration_ms = 0;
  Cause cause = Cause::none;
  bool interim = false;      // a long session's progress record (log_interval): cause is "interim"
  const PhaseTimes* phases = nullptr;  // with log_phases only
};

class AccessLog {
 public:
  // `target`: "off", "stderr", "stdout" or a file path (appended). Throws
  // std::runtime_error when the file cannot be opened.
  AccessLog(const std::string& target, const std::string& format);
  ~AccessLog();

  bool enabled() const { return logger_ != nullptr; }
  void write(const AccessRecord& r) const;
  // The line as it is written (without the timestamp); exposed for tests.
  static std::string format_text(const AccessRecord& r);
  // The JSON members without the enclosing braces (the logger adds "time").
  static std::string format_json(const AccessRecord& r);

 private:
  std::shared_ptr<spdlog::logger> logger_;
  bool json_ = false;
};

}  // namespace sluice
