// Parsing of the scalar value types used in the config file. Pure; they
// return an error message (without position) instead of throwing, so the
// loader can prefix file:line:column.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/address.hpp"  // format_sockaddr, used with parsed addresses
#include "sluice/config.hpp"

namespace sluice {

// "250ms", "3s", "5m", "1h" (one integer and one unit; "0s" allowed).
// On error returns nullopt and sets `error`.
std::optional<Duration> parse_duration(std::string_view text, std::string& error);

// "host:port", "[v6]:port". Port 0..65535 (0 only when allow_port_zero).
// Resolves the host (numeric, or via getaddrinfo) into Endpoint::addr.
std::optional<Endpoint> parse_address(std::string_view text, bool allow_port_zero, std::string& error);

}  // namespace sluice
