// What one system call costs on this machine by itself: entering and
// leaving the kernel (with whatever mitigations the kernel applies), for a
// call that does no work (getppid). It bounds what saving calls can buy: a
// proxy that makes C calls per operation spends at least C times this in
// the kernel's entry and exit, and at most that is saved by removing them
// (see docs/benchmarks-history.md).
//
//   build/tools/syscall_cost [CALLS]   (default 5 000 000; prints ns per call, best of 5)
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  const long calls = argc > 1 ? std::atol(argv[1]) : 5'000'000;
  if (calls <= 0) {
    std::fprintf(stderr, "usage: syscall_cost [CALLS]\n");
    return 2;
  }
  double best = 1e18;
  for (int round = 0; round < 5; ++round) {
    const auto start = std::chrono::steady_clock::now();
    // syscall(2) directly: glibc does not cache getppid, but says nothing
    // of the future.
    for (long i = 0; i < calls; ++i) ::syscall(SYS_getppid);
    const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count() / static_cast<double>(calls));
  }
  std::printf("%.1f ns per system call (getppid, best of 5 rounds of %ld)\n", best, calls);
  return 0;
}
