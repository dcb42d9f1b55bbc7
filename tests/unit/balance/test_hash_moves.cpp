// hash moves only what it must: over many random server sets (1 to 1 000
// servers, mixed weights) and random changes (down, up, down and back,
// weight, removal, addition), a key changes server only when the changed
// server is on one side of the move, and a balancer kept current through
// the changes agrees, key for key, with one built afresh from the same
// servers listed in another order.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "balance/hash.hpp"
#include "pool.hpp"

using namespace sluice;

namespace {

struct Spec {
  std::string text;
  std::uint32_t weight = 1;
  bool up = true;
};

Candidate candidate_of(const Spec& s) {
  Candidate c;
  c.seed = rendezvous_server_seed(s.text);
  c.weight = s.weight;
  c.up = c.eligible = s.up;
  return c;
}

// A balancer over `listed` (in that order), asked for first choices.
struct Listed {
  explicit Listed(std::vector<Spec> listed) : specs(std::move(listed)) {
    std::vector<Candidate> c;
    for (const Spec& s : specs) c.push_back(candidate_of(s));
    h.reset(c);
  }
  // The address text each key goes to ("" when no server is up).
  std::vector<std::string> firsts(const std::vector<std::string>& keys) {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) {
      const std::size_t i = h.choose_indexed(k);
      out.push_back(i == kNoCandidate ? std::string() : specs[i].text);
    }
    return out;
  }
  // Server i changed to `s`.
  void set(std::size_t i, const Spec& s) {
    specs[i] = s;
    h.update(i, candidate_of(s));
  }

  std::vector<Spec> specs;
  HashBalancer h;
};

std::vector<Spec> shuffled(std::vector<Spec> specs, std::mt19937& rng) {
  std::shuffle(specs.begin(), specs.end(), rng);
  return specs;
}

// Keys that moved between `before` and `after` must all have `changed` on
// one side (`onto_only`: the after side; `off_only`: the before side).
// Returns how many moved.
std::size_t check_moves(const std::vector<std::string>& keys, const std::vector<std::string>& before,
                        const std::vector<std::string>& after, const std::string& changed, const std::string& what,
                        bool onto_only = false, bool off_only = false) {
  std::size_t moved = 0;
  std::size_t wrong = 0;
  std::string example;
  for (std::size_t k = 0; k < keys.size(); ++k) {
    if (before[k] == after[k]) continue;
    ++moved;
    const bool ok = onto_only ? after[k] == changed : off_only ? before[k] == changed
                                                                : before[k] == changed || after[k] == changed;
    if (!ok && wrong++ == 0) example = keys[k] + " moved from " + before[k] + " to " + after[k];
  }
  INFO(what << " " << changed << ": " << wrong << " of " << keys.size() << " keys moved between other servers, e.g. "
            << example);
  CHECK(wrong == 0);
  return moved;
}

std::string text_of(std::mt19937& rng, std::size_t i) {
  return "10." + std::to_string(rng() % 256) + "." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1) +
         ":" + std::to_string(1024 + rng() % 60000);
}

// One random history over `n` servers.
void history(std::mt19937& rng, std::size_t n, const std::vector<std::string>& keys, int changes) {
  const int weights = static_cast<int>(rng() % 3);  // all 1; 1..5; 1..1000
  const auto weight = [&]() -> std::uint32_t {
    if (weights == 0) return 1;
    return weights == 1 ? 1 + rng() % 5 : 1 + rng() % 1000;
  };
  std::vector<Spec> specs;
  std::size_t next_text = 0;
  for (; next_text < n; ++next_text) specs.push_back({text_of(rng, next_text), weight(), rng() % 10 != 0});
  Listed cur(specs);
  std::vector<std::string> before = cur.firsts(keys);

  for (int step = 0; step < changes; ++step) {
    const std::size_t size = cur.specs.size();
    const int kind = static_cast<int>(rng() % 6);
    const std::size_t j = size == 0 ? 0 : rng() % size;
    std::vector<std::string> after;
    if (size == 0 || kind == 5) {  // addition, at any place in the list
      Spec s{text_of(rng, next_text++), weight(), rng() % 5 != 0};
      std::vector<Spec> more = cur.specs;
      more.insert(more.begin() + static_cast<long>(size == 0 ? 0 : rng() % (size + 1)), s);
      cur = Listed(shuffled(more, rng));
      after = cur.firsts(keys);
      const std::size_t moved = check_moves(keys, before, after, s.text, "adding", true);
      if (!s.up) CHECK(moved == 0);
    } else if (kind == 4) {  // removal
      const Spec gone = cur.specs[j];
      std::vector<Spec> fewer = cur.specs;
      fewer.erase(fewer.begin() + static_cast<long>(j));
      cur = Listed(shuffled(fewer, rng));
      after = cur.firsts(keys);
      check_moves(keys, before, after, gone.text, "removing", false, true);
      CHECK(std::count(after.begin(), after.end(), gone.text) == 0);
    } else if (kind == 3) {  // a new weight
      Spec s = cur.specs[j];
      const std::uint32_t old = s.weight;
      while (s.weight == old) s.weight = weight() + (weights == 0 ? static_cast<std::uint32_t>(rng() % 3) : 0);
      cur.set(j, s);
      after = cur.firsts(keys);
      check_moves(keys, before, after, s.text, s.weight > old ? "raising the weight of" : "lowering the weight of",
                  s.weight > old, s.weight < old);
    } else if (kind == 2) {  // down and back up: every key where it was
      Spec s = cur.specs[j];
      const bool was_up = s.up;
      s.up = !was_up;
      cur.set(j, s);
      check_moves(keys, before, cur.firsts(keys), s.text, "bouncing");
      s.up = was_up;
      cur.set(j, s);
      after = cur.firsts(keys);
      INFO("down or up and back: " << s.text);
      CHECK(after == before);
    } else {  // down (disabled, drained, failed checks) or up
      Spec s = cur.specs[j];
      s.up = !s.up;
      cur.set(j, s);
      after = cur.firsts(keys);
      const std::size_t moved = check_moves(keys, before, after, s.text, s.up ? "up:" : "down:", s.up, !s.up);
      std::size_t owned = 0;
      for (const auto& b : (s.up ? after : before)) owned += b == s.text ? 1 : 0;
      CHECK(moved == owned);  // all of its keys, and only those
    }
    // Built afresh from the same servers in another order: the same choices.
    Listed fresh(shuffled(cur.specs, rng));
    const std::vector<std::string> again = fresh.firsts(keys);
    std::size_t disagree = 0;
    for (std::size_t k = 0; k < keys.size(); ++k) disagree += again[k] != after[k] ? 1 : 0;
    INFO(cur.specs.size() << " servers after change " << step << " (kind " << kind << "): " << disagree
                          << " keys differ from a balancer built afresh in another order");
    CHECK(disagree == 0);
    before = std::move(after);
  }
}

}  // namespace

TEST_CASE("hash moves only the changed server's keys, over random server sets and changes") {
  const std::vector<std::string> keys = test::client_keys(20000);
  std::mt19937 rng(36);
  // The edges, then sizes spread over 1..1000 (log-uniform).
  std::vector<std::size_t> sizes = {1, 2, 3, 1000};
  for (int i = 0; i < 28; ++i) {
    sizes.push_back(static_cast<std::size_t>(std::exp(std::uniform_real_distribution<double>(0, std::log(1000.0))(rng))));
  }
  for (const std::size_t n : sizes) {
    CAPTURE(n);
    history(rng, n, keys, 8);
  }
}
