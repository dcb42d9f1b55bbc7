// Command-line options for loadgen: "--name value..." pairs after a subcommand.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace loadgen {

class Options {
 public:
  // Parses argv[first..argc). Every name must be in `allowed`; a name takes the
  // values that follow it up to the next "--name" (zero values = a flag).
  // Returns false and fills `error` on an unknown or repeated name.
  bool parse(int argc, char** argv, int first, const std::set<std::string>& allowed,
             std::string& error);

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  const std::vector<std::string>& values(const std::string& name) const;
  std::string str(const std::string& name, const std::string& fallback = "") const;
  // Throws std::invalid_argument naming the option when the value is not a number.
  std::uint64_t count(const std::string& name, std::uint64_t fallback) const;
  double seconds(const std::string& name, double fallback) const;

 private:
  std::map<std::string, std::vector<std::string>> values_;
};

// Parses "1024", "64k", "2g", "512m" (binary multiples). Throws std::invalid_argument.
std::uint64_t parse_size(const std::string& text);

}  // namespace loadgen
