// [resolver] and the `servers` entries that come from DNS
// ({ address = "host:port", resolve = true } and { service = "_x._tcp.name" }).
#pragma once

#include <optional>
#include <string>

#include <toml++/toml.h>

#include "sluice/config.hpp"

namespace sluice::config_detail {

class TableReader;

// True when a `servers` entry asks for DNS discovery (resolve = true, or a
// service key); such an entry is read by parse_discovered_entry instead of
// as a server.
bool is_discovered_entry(const toml::table& table);

// One discovery entry of an upstream. `hashing`: the upstream balances by
// hash (no backups); `family`: [resolver]'s, for an entry that does not
// say. Throws ConfigError.
DiscoveredEntry parse_discovered_entry(const toml::table& table, const std::string& context, const std::string& path,
                                       bool hashing, AddressFamily family);

// `family = "ipv4" | "ipv6" | "any"`, absent: nullopt. Throws ConfigError.
std::optional<AddressFamily> parse_family(const TableReader& r);

// An upstream's `sentinel = { addresses = [...], master = "...",
// password_file = "..." }`. Throws ConfigError.
SentinelConfig parse_sentinel(const toml::table& table, const std::string& context, const std::string& path);

// [resolver]. Throws ConfigError.
ResolverConfig parse_resolver(const toml::table& table, const std::string& path);

// "1.2.3.4", "1.2.3.4:5353", "::1", "[::1]:5353": a numeric name server
// address, port 53 unless written. On error returns nullopt and sets `error`.
std::optional<Endpoint> parse_nameserver(std::string_view text, std::string& error);

// A DNS name as discovery takes it: letters, digits, '-', '_' and dots,
// labels of 1..63, at most 253 in all; returned lower-case without a
// trailing dot, or empty when not valid.
std::string normalize_dns_name(std::string_view text);

}  // namespace sluice::config_detail
