// Host-name normalisation, the one rule used for SNI routes, SNI matching and
// hash keys: ASCII lower case, one trailing dot removed.
#pragma once

#include <string>
#include <string_view>

namespace sluice {

inline std::string normalize_host(std::string_view host) {
  std::string out(host);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

}  // namespace sluice
