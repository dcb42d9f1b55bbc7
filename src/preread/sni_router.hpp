// Maps a ClientHello's SNI host name and ALPN protocols to a route (and so
// an upstream name). A route names a host (exact, or "*.suffix"), an ALPN
// protocol, or both; a route with an ALPN protocol matches when the client
// offers it.
//
// The most specific match wins, in this order:
//   1. the exact host name with a matching ALPN protocol, then without one;
//   2. the longest matching wildcard, likewise with ALPN, then without;
//   3. an ALPN-only route;
// and nothing (the listener's default_upstream) after that. Among ALPN
// routes at one level, the client's own order of preference decides.
// Host names are case-insensitive, a trailing dot ignored; ALPN protocol
// names are compared byte for byte (RFC 7301 defines no case folding).
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
  // Upstream name for `sni` (empty: none sent) and the client's ALPN
  // protocols, or nullptr when nothing matches.
  const std::string* match(std::string_view sni, const std::vector<std::string>& alpn = {}) const;
  // Index in the routes given to the constructor of the route taken, or -1
  // when nothing matches (for per-route counters).
  long match_index(std::string_view sni, const std::vector<std::string>& alpn = {}) const;

 private:
  // The routes of one host pattern (or of none, for ALPN-only routes), as
  // route indexes.
  struct Entry {
    std::unordered_map<std::string, std::size_t> by_alpn;
    long any = -1;  // the route without alpn; -1: none
    long pick(const std::vector<std::string>& alpn) const;
  };
  static void add(Entry& e, const Route& r, std::size_t index);

  std::vector<std::string> upstreams_;  // by route index
  std::unordered_map<std::string, Entry> exact_;
  std::unordered_map<std::string, Entry> wildcard_;  // key: ".suffix" (with the dot)
  Entry alpn_only_;
};

}  // namespace sluice::preread
