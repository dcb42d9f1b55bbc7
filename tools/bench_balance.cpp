// Balancer microbenchmark: nanoseconds per pick at 1, 64 and 1 000 servers,
// for every algorithm, four ways:
//   - "choose() scan": Balancer::choose() over a prepared candidate span;
//   - "choose_indexed()": the balancer's own index, kept current with
//     update() after every pick and release, as Upstream does;
//   - "Upstream::pick": what a session pays (the pick lock, the choice, the
//     accounting), with release() after each pick so the counts stay put;
//   - "retry": Upstream::pick() with one server already tried, which scans
//     every server (not measured at one server: nothing is left to pick).
// A pick whose cost grows with the number of servers shows here first.
// Then, for hash, what keeping its table costs: reset() (a reload builds the
// table afresh) and update() of one server going down or coming back up
// with the pick that follows (a health change, paid by the next pick on a
// worker: a balancer may defer the work to it).
// Times are the thread's CPU time, so that other work on the machine does
// not count (it still slows the caches).
//
//   build/tools/bench_balance [SECONDS_PER_CASE [ALGORITHM...]]   (default 0.3, all)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <time.h>

#include "balance/balancer.hpp"
#include "balance/hash.hpp"
#include "config/values.hpp"
#include "upstream/tried_set.hpp"
#include "upstream/upstream.hpp"

namespace {

using namespace sluice;
// The calling thread's CPU time.
struct BenchClock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<BenchClock>;
  static constexpr bool is_steady = true;
  static time_point now() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return time_point(duration(static_cast<rep>(ts.tv_sec) * 1000000000 + ts.tv_nsec));
  }
};

const char* name_of(Balance b) {
  switch (b) {
    case Balance::least_conn: return "least_conn";
    case Balance::round_robin: return "round_robin";
    case Balance::hash: return "hash";
    case Balance::random: return "random";
  }
  return "?";
}

// Runs `pick` in batches until `seconds` have passed; returns ns per call.
// Calls come in batches of `batch`.
template <typename F>
double time_per_call(double seconds, F pick, int batch = 256) {
  const auto until = BenchClock::now() + std::chrono::duration_cast<BenchClock::duration>(
                                             std::chrono::duration<double>(seconds));
  std::uint64_t calls = 0;
  const auto start = BenchClock::now();
  auto now = start;
  do {
    for (int i = 0; i < batch; ++i) pick(calls + static_cast<std::uint64_t>(i));
    calls += static_cast<std::uint64_t>(batch);
    now = BenchClock::now();
  } while (now < until);
  return std::chrono::duration<double, std::nano>(now - start).count() / static_cast<double>(calls);
}

std::string address(std::size_t i) {
  return "10." + std::to_string((i >> 16) & 255) + "." + std::to_string((i >> 8) & 255) + "." +
         std::to_string(i & 255) + ":5432";
}

// Hash keys from a small set, as SNI names would be.
const std::vector<std::string>& keys() {
  static const std::vector<std::string> k = [] {
    std::vector<std::string> v;
    for (std::uint64_t i = 0; i < 997; ++i) v.push_back("tenant-" + std::to_string(i) + ".db.example");
    return v;
  }();
  return k;
}

std::vector<Candidate> candidates(std::size_t n, bool equal_weights = false) {
  std::vector<Candidate> cands(n);
  for (std::size_t i = 0; i < n; ++i) {
    cands[i].seed = rendezvous_server_seed(address(i));
    cands[i].weight = equal_weights ? 1 : 1 + static_cast<std::uint32_t>(i % 3);
    cands[i].active = static_cast<std::uint32_t>(i % 7);
    cands[i].eligible = true;
    cands[i].up = true;
  }
  return cands;
}

double bench_scan(Balance b, std::size_t n, double seconds) {
  std::vector<Candidate> cands = candidates(n);
  auto balancer = make_balancer(b, 0.0, 42);
  std::size_t sink = 0;
  const double ns = time_per_call(seconds, [&](std::uint64_t i) {
    const std::size_t k = balancer->choose(cands, keys()[i % keys().size()]);
    // Keep the counts moving as sessions would, so least_conn cannot settle.
    cands[k].active ^= 1;
    sink += k;
  });
  if (sink == 1) std::puts("");  // keeps the loop from being optimised away
  return ns;
}

double bench_indexed(Balance b, std::size_t n, double seconds) {
  std::vector<Candidate> cands = candidates(n);
  auto balancer = make_balancer(b, 0.0, 42);
  balancer->reset(cands);
  std::deque<std::size_t> held;  // a few sessions stay open, so counts differ
  return time_per_call(seconds, [&](std::uint64_t i) {
    const std::size_t k = balancer->choose_indexed(keys()[i % keys().size()]);
    ++cands[k].active;
    balancer->update(k, cands[k]);
    held.push_back(k);
    if (held.size() > 32) {
      const std::size_t r = held.front();
      held.pop_front();
      --cands[r].active;
      balancer->update(r, cands[r]);
    }
  });
}

// hash's table: microseconds per reset() over `n` servers, and per update()
// of a server going down or coming back up (the two alternate) and the pick
// after it.
struct TableCosts {
  double reset_us;
  double change_us;
};

TableCosts bench_table(std::size_t n, bool equal_weights, double seconds) {
  const std::vector<Candidate> cands = candidates(n, equal_weights);
  auto balancer = make_balancer(Balance::hash, 0.0, 42);
  balancer->reset(cands);  // once before timing: one-off set-up is not a reset's cost
  TableCosts c{};
  c.reset_us = time_per_call(seconds, [&](std::uint64_t) { balancer->reset(cands); }, 1) / 1000;
  balancer->reset(cands);
  std::vector<bool> down(n, false);
  c.change_us = time_per_call(seconds, [&](std::uint64_t i) {
    // Servers spread over the pool, each down then up again.
    const std::size_t k = (i / 2 * 7919) % n;
    Candidate x = cands[k];
    down[k] = !down[k];
    x.up = x.eligible = !down[k];
    balancer->update(k, x);
    if (balancer->choose_indexed(keys()[i % keys().size()]) == kNoCandidate) std::abort();
  }, 2) / 1000;
  return c;
}

std::unique_ptr<Upstream> make_upstream(Balance b, std::size_t n) {
  UpstreamConfig uc;
  uc.name = "u";
  uc.balance = b;
  std::vector<std::shared_ptr<ServerState>> states;
  for (std::size_t i = 0; i < n; ++i) {
    std::string error;
    ServerConfig sc;
    sc.address = *parse_address(address(i), false, error);
    sc.weight = 1 + static_cast<std::uint32_t>(i % 3);
    uc.servers.push_back(sc);
    states.push_back(std::make_shared<ServerState>("u", sc.address, uc.max_fails, uc.fail_timeout));
  }
  return std::make_unique<Upstream>(uc, states, 42);
}

double bench_upstream(Balance b, std::size_t n, double seconds, bool retry) {
  auto up = make_upstream(b, n);
  TriedSet tried;
  if (retry) tried.add(0);
  std::deque<std::size_t> held;
  const TimePoint now = Clock::now();
  return time_per_call(seconds, [&](std::uint64_t i) {
    const long k = up->pick(tried, keys()[i % keys().size()], now);
    if (k < 0) std::abort();
    held.push_back(static_cast<std::size_t>(k));
    if (held.size() > 32) {
      up->release(held.front());
      held.pop_front();
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 0.3;
  std::printf(
      "| algorithm | servers | choose() scan | choose_indexed() | Upstream::pick | Upstream::pick, retry |\n"
      "|---|---|---|---|---|---|\n");
  for (Balance b : {Balance::least_conn, Balance::round_robin, Balance::hash, Balance::random}) {
    bool wanted = argc <= 2;
    for (int a = 2; a < argc; ++a) wanted = wanted || std::strcmp(argv[a], name_of(b)) == 0;
    if (!wanted) continue;
    for (std::size_t n : {1UL, 64UL, 1000UL}) {
      std::printf("| %s | %zu | %.1f | %.1f | %.1f | ", name_of(b), n, bench_scan(b, n, seconds),
                  bench_indexed(b, n, seconds), bench_upstream(b, n, seconds, false));
      if (n > 1) {
        std::printf("%.1f |\n", bench_upstream(b, n, seconds, true));
      } else {
        std::printf("- |\n");
      }
      std::fflush(stdout);
    }
  }
  bool hash_wanted = argc <= 2;
  for (int a = 2; a < argc; ++a) hash_wanted = hash_wanted || std::strcmp(argv[a], "hash") == 0;
  if (!hash_wanted) return 0;
  std::printf(
      "\n| hash table | servers | reset() µs | one server down or up: update() and a pick, µs |\n"
      "|---|---|---|---|\n");
  for (const bool equal : {true, false}) {
    for (std::size_t n : {10UL, 1000UL}) {
      const TableCosts c = bench_table(n, equal, seconds);
      std::printf("| %s | %zu | %.0f | %.0f |\n", equal ? "weights equal" : "weights 1, 2, 3", n, c.reset_us,
                  c.change_us);
      std::fflush(stdout);
    }
  }
  return 0;
}
