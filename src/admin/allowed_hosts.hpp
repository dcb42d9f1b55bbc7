// Which names a request that changes something may give in `Host`. A web
// page can point its own DNS name at 127.0.0.1 ("DNS rebinding"); the
// browser then sends that page's requests here with the page's name in
// both `Host` and `Origin`, so comparing the two proves nothing. The name
// in `Host` must be one of this admin API's own: its listen address,
// `localhost`, a literal IP (no page can rebind one), or a name the
// operator lists in `[admin] allowed_hosts`. Pure; unit-tested.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config.hpp"

namespace sluice::admin {

struct AllowedHosts {
  std::string listen_host;         // [admin] listen's host: lower case, no brackets, no trailing dot
  std::uint16_t listen_port = 0;   // as written
  std::uint16_t bound_port = 0;    // as bound (port 0 picks one)
  std::vector<std::string> names;  // [admin] allowed_hosts as the config left them ("lb1.example", "lb1.example:8443")
};

// The rules for the admin API listening on `bound_port` with `config`.
AllowedHosts allowed_hosts(const AdminConfig& config, std::uint16_t bound_port);

// True when `host`, a Host header's value, names this admin API: a literal
// IPv4 address or a bracketed IPv6 one, `localhost`, the listen address's
// host (without a port, or with the port written or bound), or an
// allowed_hosts entry (a bare name matches with any port, NAME:PORT only
// with that port). Names compare without regard to case and to one
// trailing dot. Anything malformed (two Host headers joined, a bare IPv6
// address, a port that is not a number) is false.
bool host_allowed(std::string_view host, const AllowedHosts& allowed);

}  // namespace sluice::admin
