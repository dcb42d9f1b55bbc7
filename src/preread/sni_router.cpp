#include "preread/sni_router.hpp"

#include "sluice/host.hpp"

namespace sluice::preread {

// On a duplicate the first route wins, as it reads first in the file (the
// config loader refuses duplicates; the router stays correct on its own).
void SniRouter::add(Entry& e, const Route& r, std::size_t index) {
  if (r.alpn.empty()) {
    if (e.any < 0) e.any = static_cast<long>(index);
  } else {
    e.by_alpn.emplace(r.alpn, index);
  }
}

long SniRouter::Entry::pick(const std::vector<std::string>& alpn) const {
  if (!by_alpn.empty()) {
    for (const std::string& p : alpn) {
      if (auto it = by_alpn.find(p); it != by_alpn.end()) return static_cast<long>(it->second);
    }
  }
  return any;
}

SniRouter::SniRouter(const std::vector<Route>& routes) {
  // The config loader hands over normalized names; normalizing again costs
  // nothing and keeps the router correct on its own.
  for (std::size_t i = 0; i < routes.size(); ++i) {
    const Route& r = routes[i];
    upstreams_.push_back(r.upstream);
    if (r.sni.empty()) {
      if (!r.alpn.empty()) alpn_only_.by_alpn.emplace(r.alpn, i);
      continue;
    }
    std::string name = normalize_host(r.sni);
    if (name.starts_with("*.")) {
      add(wildcard_[name.substr(1)], r, i);
    } else {
      add(exact_[std::move(name)], r, i);
    }
  }
}

const std::string* SniRouter::match(std::string_view sni, const std::vector<std::string>& alpn) const {
  const long i = match_index(sni, alpn);
  return i < 0 ? nullptr : &upstreams_[static_cast<std::size_t>(i)];
}

long SniRouter::match_index(std::string_view sni, const std::vector<std::string>& alpn) const {
  const std::string host = normalize_host(sni);
  if (!host.empty()) {
    if (auto it = exact_.find(host); it != exact_.end()) {
      if (const long i = it->second.pick(alpn); i >= 0) return i;
    }
    // Try ".b.c" then ".c" for "a.b.c": the first hit is the longest suffix,
    // hence the most specific wildcard. The search starts after the first
    // character so that at least one non-empty label precedes the suffix:
    // "*.example.com" never matches "example.com" or ".example.com".
    if (!wildcard_.empty()) {
      for (std::size_t dot = host.find('.', 1); dot != std::string::npos; dot = host.find('.', dot + 1)) {
        if (auto it = wildcard_.find(host.substr(dot)); it != wildcard_.end()) {
          if (const long i = it->second.pick(alpn); i >= 0) return i;
        }
      }
    }
  }
  return alpn_only_.pick(alpn);
}

}  // namespace sluice::preread
