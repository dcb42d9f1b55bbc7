// Scalar value parsing for the config file: durations, addresses, networks,
// rates, hex bytes, percentages and HTTP status ranges.
//
// Error strings are predicates ("must be ...") so the loader can put the key
// name in front: `connect_timeout` + " " + error.
#include "config/values.hpp"

#include <arpa/inet.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <system_error>

#include "config/quote.hpp"
#include "sluice/host.hpp"

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

// Unsigned decimal without sign or spaces; nullopt when empty, not all
// digits, or above `max`.
std::optional<std::uint64_t> parse_unsigned(std::string_view digits, std::uint64_t max) {
  if (digits.empty() || digits.size() > 19) return std::nullopt;
  std::uint64_t value = 0;
  for (char c : digits) {
    if (!is_digit(c)) return std::nullopt;
    value = value * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (value > max) return std::nullopt;
  return value;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
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

std::optional<Cidr> parse_cidr(std::string_view text, std::string& error) {
  const std::string like = "must be a network like \"10.0.0.0/8\" or \"2001:db8::/32\", or one address, got ";
  Cidr cidr;
  cidr.text = std::string(text);
  const auto slash = text.find('/');
  const std::string host(text.substr(0, slash));
  const bool v6 = host.find(':') != std::string::npos;
  cidr.family = v6 ? AF_INET6 : AF_INET;
  if (::inet_pton(cidr.family, host.c_str(), cidr.addr.data()) != 1) {
    error = like + quote(text);
    return std::nullopt;
  }
  const unsigned bits = v6 ? 128 : 32;
  cidr.prefix = bits;
  if (slash != std::string_view::npos) {
    const auto prefix = parse_unsigned(text.substr(slash + 1), bits);
    if (!prefix || text.size() - slash - 1 > 3) {
      error = "must have a prefix length 0.." + std::to_string(bits) + " after \"/\", got " + quote(text);
      return std::nullopt;
    }
    cidr.prefix = static_cast<unsigned>(*prefix);
  }
  Cidr network = cidr;
  network.addr = {};
  for (unsigned i = 0; i < cidr.prefix; ++i) {
    const auto bit = static_cast<std::uint8_t>(0x80U >> (i % 8));
    network.addr[i / 8] = static_cast<std::uint8_t>(network.addr[i / 8] | (cidr.addr[i / 8] & bit));
  }
  if (network.addr != cidr.addr) {
    char buf[INET6_ADDRSTRLEN] = {};
    ::inet_ntop(cidr.family, network.addr.data(), buf, sizeof buf);
    error = "must not have host bits set (bits after the prefix length): " + quote(text) + " has them; the network is " +
            quote(std::string(buf) + "/" + std::to_string(cidr.prefix));
    return std::nullopt;
  }
  return cidr;
}

std::optional<RateLimit> parse_rate_limit(std::string_view text, std::string& error) {
  const auto slash = text.find('/');
  const std::string_view unit = slash == std::string_view::npos ? std::string_view{} : text.substr(slash + 1);
  double seconds = 0;
  if (unit == "s") {
    seconds = 1;
  } else if (unit == "m") {
    seconds = 60;
  } else if (unit == "h") {
    seconds = 3600;
  }
  constexpr std::uint64_t kMaxCount = 1000000000;
  const auto count = parse_unsigned(text.substr(0, slash), kMaxCount);
  if (seconds == 0 || !count) {
    error = "must be a rate like \"100/s\", \"6000/m\" or \"10000/h\" (a count up to " + std::to_string(kMaxCount) +
            "), got " + quote(text);
    return std::nullopt;
  }
  if (*count == 0) {
    error = "must allow at least 1 connection, got " + quote(text) + " (leave the key out for no limit)";
    return std::nullopt;
  }
  return RateLimit{std::string(text), static_cast<double>(*count) / seconds};
}

std::optional<std::string> parse_hex_bytes(std::string_view text, std::string& error) {
  std::string out;
  int high = -1;  // first digit of a byte in progress
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' && high < 0 && !out.empty() && i + 1 < text.size() && text[i + 1] != ' ') continue;
    const int v = hex_value(c);
    if (v < 0) {
      error = "must be hex bytes like \"2a310d0a\" (single spaces allowed between bytes), got " + quote(text) +
              ": unexpected " + quote(text.substr(i, 1)) + " at offset " + std::to_string(i);
      return std::nullopt;
    }
    if (high < 0) {
      high = v;
    } else {
      out += static_cast<char>(high * 16 + v);
      high = -1;
    }
  }
  if (high >= 0) {
    error = "must have two hex digits per byte, got " + quote(text) + " (an odd number of digits)";
    return std::nullopt;
  }
  if (out.empty()) {
    error = "must not be empty";
    return std::nullopt;
  }
  return out;
}

std::optional<double> parse_percent(std::string_view text, std::string& error) {
  auto fail = [&] {
    error = "must be a percentage from \"0%\" to \"100%\" like \"10%\", got " + quote(text);
    return std::nullopt;
  };
  if (text.size() < 2 || text.back() != '%' || !is_digit(text.front())) return fail();
  const std::string_view number = text.substr(0, text.size() - 1);
  double value = 0;
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value,
                                         std::chars_format::fixed);
  if (ec != std::errc{} || end != number.data() + number.size() || !is_digit(number.back())) return fail();
  if (!(value >= 0.0 && value <= 100.0)) return fail();
  return value / 100.0;
}

std::optional<StatusRange> parse_status_range(std::string_view text, std::string& error) {
  const auto dash = text.find('-');
  const auto low = parse_unsigned(text.substr(0, dash), 599);
  const auto high = dash == std::string_view::npos ? low : parse_unsigned(text.substr(dash + 1), 599);
  if (!low || !high || *low < 100 || *high < 100) {
    error = "must be a status code 100..599 or a range like \"200-399\", got " + quote(text);
    return std::nullopt;
  }
  if (*low > *high) {
    error = "must be a range LOW-HIGH with LOW <= HIGH, got " + quote(text);
    return std::nullopt;
  }
  return StatusRange{static_cast<int>(*low), static_cast<int>(*high)};
}

std::optional<std::string> parse_allowed_host(std::string_view text, std::string& error) {
  const std::optional<Authority> a = split_authority(text);
  const std::string name = a ? normalize_host(a->host) : std::string();
  const auto name_byte = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
  };
  if (a && a->bracketed) {
    error = "needs no entry: every literal IP address is allowed, got " + quote(text);
    return std::nullopt;
  }
  if (!a || name.empty() || name.front() == '.' || name.find("..") != std::string::npos ||
      !std::all_of(name.begin(), name.end(), name_byte)) {
    error = "must be a host name like \"lb1.example\", or a name and a port like \"lb1.example:8443\" (letters, "
            "digits, '-', '_' and dots; no wildcard, no scheme), got " + quote(text);
    return std::nullopt;
  }
  in_addr v4{};
  if (::inet_pton(AF_INET, name.c_str(), &v4) == 1) {
    error = "needs no entry: every literal IP address is allowed, got " + quote(text);
    return std::nullopt;
  }
  if (a->port.empty()) return name;
  const auto port = parse_unsigned(a->port, 65535);
  if (!port || *port == 0) {
    error = "port must be 1..65535, got " + quote(text);
    return std::nullopt;
  }
  return name + ":" + std::to_string(*port);
}

}  // namespace sluice
