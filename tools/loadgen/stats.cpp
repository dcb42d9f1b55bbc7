#include "stats.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace loadgen {

void LatencyRecorder::add(Clock::duration d) {
  ++count_;
  if (us_.size() >= kMaxSamples) return;
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  if (us < 0) us = 0;
  if (us > 0xffffffffLL) us = 0xffffffffLL;
  us_.push_back(static_cast<std::uint32_t>(us));
  sorted_ = false;
}

double LatencyRecorder::percentile_us(double p) {
  if (us_.empty()) return 0.0;
  if (!sorted_) {
    std::sort(us_.begin(), us_.end());
    sorted_ = true;
  }
  double rank = p / 100.0 * static_cast<double>(us_.size() - 1);
  auto idx = static_cast<std::size_t>(std::llround(rank));
  return static_cast<double>(us_[std::min(idx, us_.size() - 1)]);
}

void ErrorTally::add(const std::string& what) {
  if (count_ == 0) first_ = what;
  ++count_;
}

void JsonLine::key(const std::string& k) {
  if (!body_.empty()) body_ += ",";
  body_ += "\"" + k + "\":";
}

JsonLine& JsonLine::add(const std::string& k, const std::string& value) {
  key(k);
  body_ += "\"";
  for (char c : value) {
    if (c == '"' || c == '\\') {
      body_ += '\\';
      body_ += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      body_ += ' ';
    } else {
      body_ += c;
    }
  }
  body_ += "\"";
  return *this;
}

JsonLine& JsonLine::add(const std::string& k, double value) {
  key(k);
  char buf[64];
  if (!std::isfinite(value)) value = 0.0;
  std::snprintf(buf, sizeof buf, "%.6g", value);
  body_ += buf;
  return *this;
}

JsonLine& JsonLine::add(const std::string& k, std::uint64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}

void JsonLine::print() const {
  std::string line = str() + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

}  // namespace loadgen
