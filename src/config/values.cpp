// Scalar value parsing for the config file: durations and addresses.
//
// Error strings are predicates ("must be ...") so the loader can put the key
// name in front: `connect_timeout` + " " + error.
#include "config/values.hpp"

#include <arpa/inet.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "config/quote.hpp"

namespace sluice {

namespace {

constexpr std::uint64_t kMaxDurationMs = 7ULL * 24 * 60 * 60 * 1000;

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool is_host_char(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' || c == '-' ||
         c == '_';
}

std::string address_shape_error(std::string_view text, std::string_view why = {}) {
  std::string msg = "must be \"host:port\" or \"[ipv6]:port\"";
  if (!why.empty()) {
    msg += " (";
    msg += why;
    msg += ')';
  }
  return msg + ", got " + quote(text);
}

// Parses the decimal port; nullopt when it is not 0..65535 digits.
std::optional<std::uint16_t> parse_port(std::string_view digits) {
  if (digits.empty() || digits.size() > 5) return std::nullopt;
  unsigned value = 0;
  for (char c : digits) {
    if (!is_digit(c)) return std::nullopt;
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > 65535) return std::nullopt;
  return static_cast<std::uint16_t>(value);
}

void set_port(sockaddr_storage& ss, std::uint16_t port) {
  if (ss.ss_family == AF_INET) {
    sockaddr_in sin{};
    std::memcpy(&sin, &ss, sizeof sin);
    sin.sin_port = htons(port);
    std::memcpy(&ss, &sin, sizeof sin);
  } else if (ss.ss_family == AF_INET6) {
    sockaddr_in6 sin6{};
    std::memcpy(&sin6, &ss, sizeof sin6);
    sin6.sin6_port = htons(port);
    std::memcpy(&ss, &sin6, sizeof sin6);
  }
}

// getaddrinfo() for one host; copies the first answer. Returns the failure
// reason, or an empty string on success.
std::string resolve(const std::string& host, int family, int flags, Endpoint& out) {
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags;
  addrinfo* result = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (rc != 0) {
    return rc == EAI_SYSTEM ? std::generic_category().message(errno) : std::string(::gai_strerror(rc));
  }
  if (result == nullptr || result->ai_addrlen > sizeof(sockaddr_storage)) {
    if (result != nullptr) ::freeaddrinfo(result);
    return "no usable address";
  }
  std::memcpy(&out.addr, result->ai_addr, result->ai_addrlen);
  out.addr_len = result->ai_addrlen;
  ::freeaddrinfo(result);
  return {};
}

}  // namespace

std::optional<Duration> parse_duration(std::string_view text, std::string& error) {
  auto fail = [&] {
    error = "must be a duration like \"250ms\", \"3s\", \"5m\", \"1h\", got " + quote(text);
    return std::nullopt;
  };
  std::size_t i = 0;
  std::uint64_t value = 0;
  bool too_large = false;
  while (i < text.size() && is_digit(text[i])) {
    if (value > kMaxDurationMs) {
      too_large = true;  // keep scanning so "99999999999999999999x" is still a syntax error
    } else {
      value = value * 10 + static_cast<std::uint64_t>(text[i] - '0');
    }
    ++i;
  }
  if (i == 0) return fail();
  const std::string_view unit = text.substr(i);
  std::uint64_t scale = 0;
  if (unit == "ms") {
    scale = 1;
  } else if (unit == "s") {
    scale = 1000;
  } else if (unit == "m") {
    scale = 60ULL * 1000;
  } else if (unit == "h") {
    scale = 60ULL * 60 * 1000;
  } else {
    return fail();
  }
  if (too_large || value > kMaxDurationMs / scale) {
    error = "must be at most 7 days (\"168h\"), got " + quote(text);
    return std::nullopt;
  }
  return Duration(static_cast<Duration::rep>(value * scale));
}

std::optional<Endpoint> parse_address(std::string_view text, bool allow_port_zero, std::string& error) {
  Endpoint ep;
  ep.text = std::string(text);
  std::string_view host;
  std::string_view port_text;
  bool bracketed = false;

  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) {
      error = address_shape_error(text, "missing \"]\"");
      return std::nullopt;
    }
    host = text.substr(1, close - 1);
    const std::string_view rest = text.substr(close + 1);
    if (rest.empty() || rest.front() != ':') {
      error = address_shape_error(text, "missing port");
      return std::nullopt;
    }
    port_text = rest.substr(1);
    bracketed = true;
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      error = address_shape_error(text, "missing port");
      return std::nullopt;
    }
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      error = "must put an IPv6 address in brackets, like \"[::1]:5432\", got " + quote(text);
      return std::nullopt;
    }
  }

  if (host.empty()) {
    error = "must name a host (\"0.0.0.0\" or \"[::]\" for all addresses), got " + quote(text);
    return std::nullopt;
  }
  const auto port = parse_port(port_text);
  if (!port || (*port == 0 && !allow_port_zero)) {
    error = std::string("must have a port ") + (allow_port_zero ? "0" : "1") + "..65535, got " + quote(text);
    return std::nullopt;
  }
  ep.port = *port;
  ep.host = std::string(host);

  if (bracketed) {
    if (!resolve(ep.host, AF_INET6, AI_NUMERICHOST, ep).empty()) {
      error = "must have a numeric IPv6 address inside \"[]\", got " + quote(text);
      return std::nullopt;
    }
  } else {
    sockaddr_in sin{};
    bool all_numeric = true;
    for (char c : host) {
      if (!is_digit(c) && c != '.') all_numeric = false;
    }
    if (::inet_pton(AF_INET, ep.host.c_str(), &sin.sin_addr) == 1) {
      sin.sin_family = AF_INET;
      std::memcpy(&ep.addr, &sin, sizeof sin);
      ep.addr_len = sizeof sin;
    } else if (all_numeric) {
      // getaddrinfo() would accept legacy forms such as "1.2.3" (= 1.2.0.3).
      error = "must have a valid IPv4 address, got " + quote(text);
      return std::nullopt;
    } else {
      for (char c : host) {
        if (!is_host_char(c)) {
          error = "must have a valid host name or IP address, got " + quote(text);
          return std::nullopt;
        }
      }
      const std::string reason = resolve(ep.host, AF_UNSPEC, 0, ep);
      if (!reason.empty()) {
        error = "must name a host that resolves, got " + quote(text) + ": " + reason;
        return std::nullopt;
      }
    }
  }
  set_port(ep.addr, ep.port);
  return ep;
}

}  // namespace sluice
