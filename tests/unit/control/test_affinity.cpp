#include <doctest/doctest.h>

#include "control/affinity.hpp"

using sluice::plan_affinity;

TEST_CASE("control_cpu: unset leaves every thread where it is") {
  const auto p = plan_affinity(-1, {0, 1});
  CHECK_FALSE(p.apply);
  CHECK(p.message.empty());
}

TEST_CASE("control_cpu: the control thread on its CPU, the workers on the rest") {
  const auto p = plan_affinity(1, {0, 1, 2, 3});
  CHECK(p.apply);
  CHECK(p.control == 1);
  CHECK(p.workers == std::vector<int>{0, 2, 3});
  CHECK(p.message == "control thread on CPU 1, workers on CPU(s) 0,2,3");
}

TEST_CASE("control_cpu: a CPU the process may not use is not applied") {
  const auto p = plan_affinity(5, {0, 1});
  CHECK_FALSE(p.apply);
  CHECK(p.message.find("control_cpu = 5 is not among the CPUs this process may use (0,1)") == 0);
}

TEST_CASE("control_cpu: with one CPU allowed, the workers share it") {
  const auto p = plan_affinity(0, {0});
  CHECK(p.apply);
  CHECK(p.workers == std::vector<int>{0});
  CHECK(p.message.find("the workers share it") != std::string::npos);
}
