#include "admin/allowed_hosts.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <charconv>

#include "sluice/host.hpp"

namespace sluice::admin {

namespace {

bool is_ipv4(const std::string& s) {
  in_addr a{};
  return ::inet_pton(AF_INET, s.c_str(), &a) == 1;
}

bool is_ipv6(std::string_view s) {
  in6_addr a{};
  return ::inet_pton(AF_INET6, std::string(s).c_str(), &a) == 1;
}

// A port as split_authority() left it (1 to 5 digits), or -1 past 65535.
long port_number(std::string_view digits) {
  long n = 0;
  std::from_chars(digits.data(), digits.data() + digits.size(), n);
  return n > 65535 ? -1 : n;
}

}  // namespace

AllowedHosts allowed_hosts(const AdminConfig& config, std::uint16_t bound_port) {
  AllowedHosts a;
  a.listen_host = normalize_host(config.listen.host);
  a.listen_port = config.listen.port;
  a.bound_port = bound_port;
  a.names = config.allowed_hosts;
  return a;
}

bool host_allowed(std::string_view host, const AllowedHosts& allowed) {
  // Optional white space around a field value (http-parser keeps trailing).
  while (!host.empty() && (host.back() == ' ' || host.back() == '\t')) host.remove_suffix(1);
  while (!host.empty() && (host.front() == ' ' || host.front() == '\t')) host.remove_prefix(1);
  const std::optional<Authority> a = split_authority(host);
  if (!a) return false;
  if (!a->port.empty() && port_number(a->port) < 0) return false;
  // No page can be served from a name that is an address: a literal IP
  // cannot be rebound.
  if (a->bracketed) return is_ipv6(a->host);
  const std::string name = normalize_host(a->host);
  if (name.empty()) return false;
  if (is_ipv4(name) || name == "localhost") return true;
  if (name == allowed.listen_host) {
    if (a->port.empty()) return true;
    const long port = port_number(a->port);
    if (port == allowed.listen_port || port == allowed.bound_port) return true;
  }
  const std::string with_port = a->port.empty() ? std::string() : name + ":" + std::string(a->port);
  return std::any_of(allowed.names.begin(), allowed.names.end(), [&](const std::string& entry) {
    return entry == name || (!with_port.empty() && entry == with_port);
  });
}

}  // namespace sluice::admin
