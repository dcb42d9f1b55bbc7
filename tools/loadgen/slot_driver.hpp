// The closed loop behind the conn, rr and tls loads: C slots each run one
// operation after another until the deadline; a slot that failed parks and is
// restarted once its retry time has come.
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "client_util.hpp"

namespace loadgen {

// What every slot load keeps; a load's own struct adds its settings and buffers.
struct SlotLoad {
  Poller poller;
  Target target;
  // Cleared at the deadline: slots stop starting operations and late
  // completions or failures are not counted.
  bool running = true;
  std::uint64_t ops = 0;  // completed operations
  LatencyRecorder latency;
  ErrorTally errors;
};

// The size option of a slot load (--payload, --size): its name, default and
// largest value, and how the usage message writes that largest value.
struct SizeOption {
  const char* name;
  std::uint64_t fallback;
  std::uint64_t max;
  const char* max_text;
};

struct SlotOptions {
  double duration = 0;
  std::uint64_t concurrency = 0;
  std::uint64_t size = 0;
};

// Reads --duration, --concurrency and the size option, in that order. Prints
// "loadgen CMD: --concurrency 1..10000, --NAME 1..MAX" and returns nothing when
// either count is out of range; a value that is not a number throws, as
// Options::count does.
std::optional<SlotOptions> slot_options(const Options& opts, const char* cmd,
                                        std::uint64_t default_concurrency, const SizeOption& size);

// start(): begin an operation (a no-op once the load stopped running);
// ready_to_start(now): parked after a failure and due for a retry;
// abandon(): close whatever the slot has open.
template <class Slot>
concept DrivenSlot = requires(Slot& slot, const Slot& cslot, Clock::time_point now) {
  slot.start();
  slot.abandon();
  { cslot.ready_to_start(now) } -> std::convertible_to<bool>;
};

// Runs `concurrency` slots for `duration` seconds (or until `stop`), then
// clears load.running and abandons every slot. Returns the seconds elapsed,
// taken before the slots are torn down.
template <DrivenSlot Slot, class Load>
double drive_slots(Load& load, const StopSignal& stop, std::uint64_t concurrency, double duration) {
  std::vector<std::unique_ptr<Slot>> slots;
  for (std::uint64_t i = 0; i < concurrency; ++i) slots.push_back(std::make_unique<Slot>(load));
  auto start = Clock::now();
  auto deadline = after_seconds(start, duration);
  for (auto& s : slots) s->start();
  run_until(load.poller, stop, deadline, [] { return false; }, [&] {
    auto now = Clock::now();
    for (auto& s : slots) {
      if (s->ready_to_start(now)) s->start();
    }
  });
  load.running = false;
  double elapsed = seconds_between(start, Clock::now());
  for (auto& s : slots) s->abandon();
  return elapsed;
}

// Prints the JSON line of a slot load and returns the exit code (0 when at
// least one operation completed). Fields in order: "load", "target",
// "concurrency", those `own_fields` adds, the operation count under `ops_key`,
// "rate", "p50_us", "p99_us", then the common ones (see add_common).
int report_slot_load(const char* name, SlotLoad& load, std::uint64_t concurrency, double elapsed,
                     const char* ops_key, const std::function<void(JsonLine&)>& own_fields);

}  // namespace loadgen
