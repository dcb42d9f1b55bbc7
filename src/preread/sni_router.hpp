// Maps an SNI host name to an upstream name. Exact names and "*.suffix"
// wildcards; the most specific match wins (exact, then the longest suffix);
// case-insensitive, trailing dot ignored.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sluice/config.hpp"

namespace sluice::preread {

class SniRouter {
 public:
  explicit SniRouter(const std::vector<Route>& routes);
  // Upstream name for `sni`, or nullptr when nothing matches.
  const std::string* match(std::string_view sni) const;

 private:
  std::unordered_map<std::string, std::string> exact_;
  std::unordered_map<std::string, std::string> wildcard_;  // key: ".suffix" (with the dot)
};

}  // namespace sluice::preread
