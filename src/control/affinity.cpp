#include "control/affinity.hpp"

#include <sched.h>

#include <algorithm>
#include <cstring>

namespace sluice {

namespace {

std::string list(const std::vector<int>& cpus) {
  std::string out;
  for (int c : cpus) out += (out.empty() ? "" : ",") + std::to_string(c);
  return out;
}

cpu_set_t to_set(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  }
  return set;
}

}  // namespace

AffinityPlan plan_affinity(int control_cpu, const std::vector<int>& allowed) {
  AffinityPlan plan;
  if (control_cpu < 0) return plan;
  if (std::find(allowed.begin(), allowed.end(), control_cpu) == allowed.end()) {
    plan.message = "control_cpu = " + std::to_string(control_cpu) + " is not among the CPUs this process may use (" +
                   list(allowed) + "): no thread is pinned";
    return plan;
  }
  plan.apply = true;
  plan.control = control_cpu;
  for (int c : allowed) {
    if (c != control_cpu) plan.workers.push_back(c);
  }
  if (plan.workers.empty()) {
    plan.workers = {control_cpu};
    plan.message = "control thread on CPU " + std::to_string(control_cpu) +
                   ", the only CPU this process may use: the workers share it";
  } else {
    plan.message = "control thread on CPU " + std::to_string(control_cpu) + ", workers on CPU(s) " + list(plan.workers);
  }
  return plan;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

std::string apply_affinity(const AffinityPlan& plan, const std::vector<pthread_t>& workers) {
  if (!plan.apply) return {};
  const cpu_set_t worker_set = to_set(plan.workers);
  for (pthread_t t : workers) {
    if (int rc = ::pthread_setaffinity_np(t, sizeof worker_set, &worker_set); rc != 0) {
      return std::string("cannot pin a worker: ") + std::strerror(rc);
    }
  }
  const cpu_set_t control_set = to_set({plan.control});
  if (int rc = ::pthread_setaffinity_np(::pthread_self(), sizeof control_set, &control_set); rc != 0) {
    return std::string("cannot pin the control thread: ") + std::strerror(rc);
  }
  return {};
}

}  // namespace sluice
