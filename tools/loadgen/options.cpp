#include "options.hpp"

#include <cstdlib>
#include <stdexcept>

namespace loadgen {

bool Options::parse(int argc, char** argv, int first, const std::set<std::string>& allowed,
                    std::string& error) {
  std::string current;
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.size() > 2 && arg.compare(0, 2, "--") == 0) {
      current = arg.substr(2);
      if (allowed.count(current) == 0) {
        error = "unknown option --" + current;
        return false;
      }
      if (values_.count(current) != 0) {
        error = "option --" + current + " given twice";
        return false;
      }
      values_[current];
      continue;
    }
    if (current.empty()) {
      error = "unexpected argument '" + arg + "'";
      return false;
    }
    values_[current].push_back(arg);
  }
  return true;
}

const std::vector<std::string>& Options::values(const std::string& name) const {
  static const std::vector<std::string> none;
  auto it = values_.find(name);
  return it == values_.end() ? none : it->second;
}

std::string Options::str(const std::string& name, const std::string& fallback) const {
  const auto& v = values(name);
  return v.empty() ? fallback : v.front();
}

std::uint64_t Options::count(const std::string& name, std::uint64_t fallback) const {
  const auto& v = values(name);
  if (v.empty()) return fallback;
  try {
    return parse_size(v.front());
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument("--" + name + ": not a count: '" + v.front() + "'");
  }
}

double Options::seconds(const std::string& name, double fallback) const {
  const auto& v = values(name);
  if (v.empty()) return fallback;
  char* end = nullptr;
  double d = std::strtod(v.front().c_str(), &end);
  if (end == v.front().c_str() || *end != '\0' || !(d > 0.0)) {
    throw std::invalid_argument("--" + name + ": not a positive number of seconds: '" +
                                v.front() + "'");
  }
  return d;
}

std::uint64_t parse_size(const std::string& text) {
  if (text.empty()) throw std::invalid_argument("empty size");
  std::size_t pos = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(text, &pos);
  } catch (const std::exception&) {
    throw std::invalid_argument("bad size");
  }
  std::string suffix = text.substr(pos);
  std::uint64_t mult = 1;
  if (suffix.empty()) {
    mult = 1;
  } else if (suffix == "k" || suffix == "K") {
    mult = 1ULL << 10;
  } else if (suffix == "m" || suffix == "M") {
    mult = 1ULL << 20;
  } else if (suffix == "g" || suffix == "G") {
    mult = 1ULL << 30;
  } else {
    throw std::invalid_argument("bad size suffix");
  }
  return static_cast<std::uint64_t>(n) * mult;
}

}  // namespace loadgen
