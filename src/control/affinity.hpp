// [global] control_cpu: the control thread (admin API, checks, DNS, reloads)
// on one CPU and the workers on the others, so that a scrape or a reload
// never takes a worker's core. The plan is pure; apply_affinity() applies
// it with sched/pthread affinity calls.
#pragma once

#include <pthread.h>

#include <string>
#include <vector>

namespace sluice {

struct AffinityPlan {
  bool apply = false;            // false: leave every thread where it is
  int control = -1;              // the control thread's CPU
  std::vector<int> workers;      // the CPUs the workers may run on
  std::string message;           // what was done, or why not (for the log)
};

// `allowed`: the CPUs this process may run on (sched_getaffinity), sorted.
// A CPU outside them is not applied (and says why); with only that CPU
// allowed, the workers share it (said too).
AffinityPlan plan_affinity(int control_cpu, const std::vector<int>& allowed);

// The CPUs this process may run on now.
std::vector<int> allowed_cpus();

// Pins the calling (control) thread and `workers` as planned; returns ""
// or the failure.
std::string apply_affinity(const AffinityPlan& plan, const std::vector<pthread_t>& workers);

}  // namespace sluice
