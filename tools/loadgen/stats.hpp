// Latency samples and the one-line JSON report every client load prints.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "net.hpp"

namespace loadgen {

// Keeps every sample (microseconds) up to a cap; percentiles by sorting once.
class LatencyRecorder {
 public:
  void add(Clock::duration d);
  std::uint64_t count() const { return count_; }
  // p in [0, 100]; 0 when there are no samples.
  double percentile_us(double p);

 private:
  static constexpr std::size_t kMaxSamples = 20'000'000;
  std::vector<std::uint32_t> us_;
  std::uint64_t count_ = 0;
  bool sorted_ = false;
};

// Counts failures and keeps the first message so a broken run says why.
class ErrorTally {
 public:
  void add(const std::string& what);
  std::uint64_t count() const { return count_; }
  const std::string& first() const { return first_; }

 private:
  std::uint64_t count_ = 0;
  std::string first_;
};

// Builds {"k":v,...} with keys in insertion order.
class JsonLine {
 public:
  JsonLine& add(const std::string& key, const std::string& value);
  JsonLine& add(const std::string& key, double value);
  JsonLine& add(const std::string& key, std::uint64_t value);
  std::string str() const { return "{" + body_ + "}"; }
  // Writes the line to stdout and flushes.
  void print() const;

 private:
  void key(const std::string& k);
  std::string body_;
};

}  // namespace loadgen
