// One configured server's shared state: read and written by every worker.
// Hot counters are atomics; passive health sits behind a small mutex that is
// taken only on the rare paths (failure, trial, recovery) and on selection.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "sluice/config.hpp"
#include "upstream/passive_health.hpp"

namespace sluice {

// Typed result of one connect attempt, reported by the data path.
enum class ConnectResult { connected, failed, timed_out };

class ServerState {
 public:
  ServerState(const std::string& upstream_name, const ServerConfig& server,
              std::uint32_t max_fails, Duration fail_timeout);

  const std::string upstream;   // owning upstream's name (for logs)
  const Endpoint address;
  const std::uint32_t weight;
  const std::uint32_t max_conns;  // 0 = unlimited
  const bool backup;

  // Sessions in CONNECTING or PROXYING on this server.
  std::atomic<std::uint32_t> active{0};
  std::atomic<std::uint64_t> total_sessions{0};
  std::atomic<std::uint64_t> total_failures{0};

  // Health and max_conns: may a new connection be sent here now?
  bool eligible(TimePoint now) const;
  // Called (under the upstream's pick lock) when the balancer chose this server.
  void on_selected(TimePoint now);
  // The data path reports each connect attempt's outcome. Logs every up/down
  // transition once, with the reason. `error` is e.g. "connection refused".
  void report(ConnectResult result, std::string_view error, TimePoint now);

  bool passive_up() const;  // for status/metrics and tests

 private:
  mutable std::mutex mu_;
  PassiveHealth health_;
  // Fast path: true while health_ is up with no recent failure, so eligible()
  // need not lock on the common path.
  std::atomic<bool> clean_{true};
};

}  // namespace sluice
