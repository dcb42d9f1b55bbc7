#include "preread/sni_router.hpp"

#include "sluice/host.hpp"

namespace sluice::preread {

SniRouter::SniRouter(const std::vector<Route>& routes) {
  // The config loader hands over normalized, duplicate-free names; normalizing
  // again costs nothing and keeps the router correct on its own. On a
  // duplicate the first route wins, as it reads first in the file.
  for (std::size_t i = 0; i < routes.size(); ++i) {
    const Route& r = routes[i];
    upstreams_.push_back(r.upstream);
    std::string name = normalize_host(r.sni);
    if (name.starts_with("*.")) {
      wildcard_.emplace(name.substr(1), i);
    } else {
      exact_.emplace(std::move(name), i);
    }
  }
}

const std::string* SniRouter::match(std::string_view sni) const {
  const long i = match_index(sni);
  return i < 0 ? nullptr : &upstreams_[static_cast<std::size_t>(i)];
}

long SniRouter::match_index(std::string_view sni) const {
  const std::string host = normalize_host(sni);
  if (host.empty()) return -1;
  if (auto it = exact_.find(host); it != exact_.end()) return static_cast<long>(it->second);
  if (wildcard_.empty()) return -1;

  // Try ".b.c" then ".c" for "a.b.c": the first hit is the longest suffix,
  // hence the most specific wildcard. The search starts after the first
  // character so that at least one non-empty label precedes the suffix:
  // "*.example.com" never matches "example.com" or ".example.com".
  for (std::size_t dot = host.find('.', 1); dot != std::string::npos;
       dot = host.find('.', dot + 1)) {
    if (auto it = wildcard_.find(host.substr(dot)); it != wildcard_.end()) {
      return static_cast<long>(it->second);
    }
  }
  return -1;
}

}  // namespace sluice::preread
