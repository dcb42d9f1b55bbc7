// Parsing of the scalar value types used in the config file. Pure; they
// return an error message (without position) instead of throwing, so the
// loader can prefix file:line:column.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/address.hpp"  // format_sockaddr, used with parsed addresses
#include "sluice/cidr.hpp"     // cidr_contains, any_contains: matching parsed networks
#include "sluice/config.hpp"

namespace sluice {

// "250ms", "3s", "5m", "1h" (one integer and one unit; "0s" allowed).
// On error returns nullopt and sets `error`.
std::optional<Duration> parse_duration(std::string_view text, std::string& error);

// "host:port", "[v6]:port". Port 0..65535 (0 only when allow_port_zero).
// Resolves the host (numeric, or via getaddrinfo) into Endpoint::addr.
std::optional<Endpoint> parse_address(std::string_view text, bool allow_port_zero, std::string& error);

// "10.0.0.0/8", "2001:db8::/32", or a bare address ("192.0.2.7" = /32,
// "::1" = /128). No brackets, no zone ids. An address with bits set below the
// prefix ("10.1.2.3/8") is an error: the message names the network meant.
std::optional<Cidr> parse_cidr(std::string_view text, std::string& error);

// "100/s", "6000/m", "10000/h": a positive integer count per second, minute or
// hour, stored as RateLimit::per_second.
std::optional<RateLimit> parse_rate_limit(std::string_view text, std::string& error);

// Hex digits, two per byte, either case, optionally with single spaces between
// bytes ("2a310d0a", "2A 31 0D 0A"). Returns the decoded bytes; never empty.
std::optional<std::string> parse_hex_bytes(std::string_view text, std::string& error);

// "10%", "0%", "12.5%": 0..100 percent, returned as a fraction 0..1.
std::optional<double> parse_percent(std::string_view text, std::string& error);

// One HTTP status range: "200-399", or a single code "204". Codes 100..599.
std::optional<StatusRange> parse_status_range(std::string_view text, std::string& error);

// An [admin] allowed_hosts entry: a host name ("lb1.example") or a host
// name and a port ("lb1.example:8443"), returned as the admin API compares
// it (lower case, no trailing dot). IP addresses need no entry (every
// literal IP is allowed) and are an error, as are wildcards and URLs.
std::optional<std::string> parse_allowed_host(std::string_view text, std::string& error);

}  // namespace sluice
