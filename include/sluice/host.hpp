// Host-name normalisation, the one rule used for SNI routes, SNI matching and
// hash keys: ASCII lower case, one trailing dot removed. And the split of an
// HTTP authority ("name:port", "[v6]:port").
#pragma once

#include <optional>
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

// An authority as HTTP's Host carries it: "name", "name:80", "10.0.0.1:80",
// "[::1]:80", "[::1]".
struct Authority {
  std::string_view host;  // without the brackets
  std::string_view port;  // empty when none was written
  bool bracketed = false;  // an IPv6 literal (not checked here)
};

// nullopt when `text` is not one: an empty host, a colon outside brackets
// in the host (a bare IPv6 address), brackets that do not pair, a port
// that is empty or not 1 to 5 digits.
inline std::optional<Authority> split_authority(std::string_view text) {
  Authority a;
  std::string_view rest;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    a.host = text.substr(1, close - 1);
    a.bracketed = true;
    rest = text.substr(close + 1);
  } else {
    const std::size_t colon = text.find(':');
    a.host = text.substr(0, colon);
    if (colon != std::string_view::npos) rest = text.substr(colon);
    if (a.host.find_first_of("[]") != std::string_view::npos) return std::nullopt;
  }
  if (a.host.empty()) return std::nullopt;
  if (!rest.empty()) {
    if (rest.front() != ':') return std::nullopt;
    a.port = rest.substr(1);
    if (a.port.empty() || a.port.size() > 5 || a.port.find_first_not_of("0123456789") != std::string_view::npos) {
      return std::nullopt;
    }
  }
  return a;
}

}  // namespace sluice
