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
  // Index in the routes given to the constructor of the route `sni` takes,
  // or -1 when nothing matches (for per-route counters).
  long match_index(std::string_view sni) const;

 private:
  std::vector<std::string> upstreams_;                 // by route index
  std::unordered_map<std::string, std::size_t> exact_;     // name -> route index
  std::unordered_map<std::string, std::size_t> wildcard_;  // ".suffix" (with the dot) -> route index
};

}  // namespace sluice::preread
