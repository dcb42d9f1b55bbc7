#include "preread/sni_router.hpp"

#include "sluice/host.hpp"

namespace sluice::preread {

// On a duplicate the first route wins, as it reads first in the file (the
// config loader refuses duplicates; the router stays correct on its own).
void SniRouter::add(Entry& e, const Route& r) {
  if (r.alpn.empty()) {
    if (!e.has_any) {
      e.any = r.upstream;
      e.has_any = true;
    }
  } else {
    e.by_alpn.emplace(r.alpn, r.upstream);
  }
}

const std::string* SniRouter::Entry::pick(const std::vector<std::string>& alpn) const {
  if (!by_alpn.empty()) {
    for (const std::string& p : alpn) {
      if (auto it = by_alpn.find(p); it != by_alpn.end()) return &it->second;
    }
  }
  return has_any ? &any : nullptr;
}

SniRouter::SniRouter(const std::vector<Route>& routes) {
  // The config loader hands over normalized names; normalizing again costs
  // nothing and keeps the router correct on its own.
  for (const Route& r : routes) {
    if (r.sni.empty()) {
      if (!r.alpn.empty()) alpn_only_.by_alpn.emplace(r.alpn, r.upstream);
      continue;
    }
    std::string name = normalize_host(r.sni);
    if (name.starts_with("*.")) {
      add(wildcard_[name.substr(1)], r);
    } else {
      add(exact_[std::move(name)], r);
    }
  }
}

const std::string* SniRouter::match(std::string_view sni, const std::vector<std::string>& alpn) const {
  const std::string host = normalize_host(sni);
  if (!host.empty()) {
    if (auto it = exact_.find(host); it != exact_.end()) {
      if (const std::string* up = it->second.pick(alpn)) return up;
    }
    // Try ".b.c" then ".c" for "a.b.c": the first hit is the longest suffix,
    // hence the most specific wildcard. The search starts after the first
    // character so that at least one non-empty label precedes the suffix:
    // "*.example.com" never matches "example.com" or ".example.com".
    if (!wildcard_.empty()) {
      for (std::size_t dot = host.find('.', 1); dot != std::string::npos; dot = host.find('.', dot + 1)) {
        if (auto it = wildcard_.find(host.substr(dot)); it != wildcard_.end()) {
          if (const std::string* up = it->second.pick(alpn)) return up;
        }
      }
    }
  }
  return alpn_only_.pick(alpn);
}

}  // namespace sluice::preread
