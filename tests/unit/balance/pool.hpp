// Test helpers: a pool of balancer candidates built from "address:weight"
// specs. No server state is involved: the algorithms are pure.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "balance/hash.hpp"

namespace sluice::test {

struct Pool {
  std::vector<Candidate> c;
  std::vector<std::string> texts;

  // Candidates are returned by reference for tests to set `active`: the
  // storage never moves (pools here are small).
  Pool() { c.reserve(256); }

  Candidate& add(const std::string& text, std::uint32_t weight = 1) {
    c.push_back(Candidate{rendezvous_server_seed(text), weight, 0, true});
    texts.push_back(text);
    return c.back();
  }
  // Only these indices are eligible.
  void only(std::initializer_list<std::size_t> eligible) {
    for (auto& x : c) x.eligible = false;
    for (std::size_t i : eligible) c[i].eligible = true;
  }
  Candidate& operator[](std::size_t i) { return c[i]; }
  const std::string& text(std::size_t i) const { return texts[i]; }
};

// `n` candidates for random histories: weights from `weight()`, about four
// in five eligible.
template <typename Weight>
std::vector<Candidate> random_candidates(std::mt19937& rng, std::size_t n, Weight weight) {
  std::vector<Candidate> c(n);
  for (Candidate& x : c) {
    x.weight = weight();
    x.eligible = rng() % 5 != 0;
  }
  return c;
}

// Client-address-like hash keys from a fixed seed, so every run sees the same set.
inline std::vector<std::string> client_keys(std::size_t n) {
  std::mt19937_64 rng(20240611);
  std::vector<std::string> keys;
  keys.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = rng();
    keys.push_back(std::to_string(10 + (r & 0x7f)) + "." + std::to_string((r >> 8) & 0xff) + "." +
                   std::to_string((r >> 16) & 0xff) + "." + std::to_string((r >> 24) & 0xff));
  }
  return keys;
}

// `picks` picks from `pool` with no hash key, as letters: server 0 is 'a'.
inline std::string run(Balancer& b, Pool& pool, int picks) {
  std::string seq;
  for (int i = 0; i < picks; ++i) seq += static_cast<char>('a' + b.choose(pool.c, ""));
  return seq;
}

}  // namespace sluice::test
