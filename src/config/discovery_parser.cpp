#include "config/discovery_parser.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>

#include "config/quote.hpp"
#include "config/table_reader.hpp"
#include "config/values.hpp"
#include "sluice/address.hpp"
#include "sluice/host.hpp"

namespace sluice::config_detail {

namespace {

bool is_ip_literal(std::string_view host) {
  const std::string h(host);
  in6_addr a6{};
  in_addr a4{};
  return ::inet_pton(AF_INET, h.c_str(), &a4) == 1 || ::inet_pton(AF_INET6, h.c_str(), &a6) == 1;
}

}  // namespace

std::string normalize_dns_name(std::string_view text) {
  std::string out = normalize_host(text);
  if (out.empty() || out.size() > 253) return {};
  std::size_t label = 0;
  for (char c : out) {
    if (c == '.') {
      if (label == 0) return {};
      label = 0;
      continue;
    }
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    if (!ok || ++label > 63) return {};
  }
  if (label == 0) return {};
  return out;
}

bool is_discovered_entry(const toml::table& table) {
  if (table.contains("service")) return true;
  const toml::node* resolve = table.get("resolve");
  // A resolve key of the wrong type is reported by parse_discovered_entry.
  return resolve != nullptr && (!resolve->is_boolean() || resolve->as_boolean()->get());
}

std::optional<AddressFamily> parse_family(const TableReader& r) {
  return r.choice<AddressFamily>("family", {{"any", AddressFamily::any},
                                            {"ipv4", AddressFamily::ipv4},
                                            {"ipv6", AddressFamily::ipv6}});
}

DiscoveredEntry parse_discovered_entry(const toml::table& table, const std::string& context, const std::string& path,
                                       bool hashing, AddressFamily family) {
  TableReader r(table, context, path);
  DiscoveredEntry e;
  e.family = parse_family(r).value_or(family);
  if (r.has("service")) {
    r.reject_unknown_keys({"service", "max_conns", "backup", "family"});
    const std::string text = *r.string("service");
    e.kind = DiscoveryKind::service;
    e.text = text;
    e.name = normalize_dns_name(text);
    if (e.name.empty()) {
      r.fail(*r.get("service"), "service must be a DNS name like \"_postgresql._tcp.db.service.consul\", got " +
                                    quote(text));
    }
  } else {
    r.reject_unknown_keys({"address", "resolve", "weight", "max_conns", "backup", "family"});
    if (!r.boolean("resolve").value_or(false)) r.fail(*r.get("resolve"), "resolve must be true or false");
    const toml::node& address_node = r.require("address");
    const auto text = r.string("address");
    e.text = *text;
    const auto colon = text->rfind(':');
    std::string port_error;
    std::optional<Endpoint> port_only;
    if (colon != std::string::npos && colon > 0) {
      // The port through the common parser, on a stand-in numeric host.
      port_only = parse_address("0.0.0.0" + text->substr(colon), false, port_error);
    }
    if (!port_only) {
      r.fail(address_node, "address must be \"host:port\" with a port 1..65535, got " + quote(*text));
    }
    e.port = port_only->port;
    const std::string_view host = std::string_view(*text).substr(0, colon);
    if (host.starts_with('[') || is_ip_literal(host)) {
      r.fail(address_node, "address " + quote(*text) +
                               " is an IP address: resolve = true needs a host name (leave resolve out for a fixed "
                               "address)");
    }
    e.name = normalize_dns_name(host);
    if (e.name.empty()) r.fail(address_node, "address must have a valid host name, got " + quote(*text));
    if (auto v = r.integer("weight", 1, 1000)) e.weight = static_cast<std::uint32_t>(*v);
  }
  if (auto v = r.integer("max_conns", 0, 1000000)) e.max_conns = static_cast<std::uint32_t>(*v);
  if (auto v = r.boolean("backup")) {
    if (*v && hashing) r.fail(*r.get("backup"), "backup = true is not allowed with balance = \"hash\"");
    e.backup = *v;
  }
  return e;
}

SentinelConfig parse_sentinel(const toml::table& table, const std::string& context, const std::string& path) {
  TableReader r(table, context + " sentinel", path);
  r.reject_unknown_keys({"addresses", "master", "password_file"});
  SentinelConfig c;
  const toml::node& addresses_node = r.require("addresses");
  const toml::array* list = r.array("addresses", "an array of sentinel addresses like [\"10.0.0.1:26379\"]");
  if (list->empty()) r.fail(addresses_node, "addresses must list at least one sentinel, like [\"10.0.0.1:26379\"]");
  for (const toml::node& node : *list) {
    const auto* s = node.as_string();
    if (s == nullptr) r.fail(node, "addresses entries must be strings like \"10.0.0.1:26379\", got " + describe(node));
    std::string error;
    std::optional<Endpoint> ep = parse_address(s->get(), false, error);
    if (!ep) r.fail(node, "addresses entry " + error);
    for (const Endpoint& other : c.addresses) {
      if (other.port == ep->port && same_ip(other.addr, ep->addr)) {
        r.fail(node, "addresses lists sentinel " + quote(s->get()) + " twice (as " + quote(other.text) + ")");
      }
    }
    c.addresses.push_back(std::move(*ep));
  }
  const toml::node& master_node = r.require("master");
  c.master = *r.string("master");
  // The name goes into a command line and is matched in +switch-master
  // messages, whose fields are separated by spaces.
  const bool printable = std::all_of(c.master.begin(), c.master.end(),
                                     [](char ch) { return ch > ' ' && ch < 0x7f; });
  if (c.master.empty() || c.master.size() > 200 || !printable) {
    r.fail(master_node, "master must be the name the sentinels monitor (like \"mymaster\"; printable, no spaces), "
                        "got " + quote(c.master));
  }
  if (auto v = r.readable_file("password_file")) c.password_file = *v;
  return c;
}

std::optional<Endpoint> parse_nameserver(std::string_view text, std::string& error) {
  std::string with_port(text);
  const bool bare_v6 = text.find(':') != text.rfind(':') && !text.starts_with('[');
  if (bare_v6) {
    with_port = "[" + with_port + "]:53";
  } else if (text.starts_with('[') ? text.find("]:") == std::string_view::npos
                                   : text.find(':') == std::string_view::npos) {
    with_port += ":53";
  }
  const std::string host = with_port.substr(0, with_port.rfind(':'));
  const std::string bare = host.starts_with('[') ? host.substr(1, host.size() - 2) : host;
  if (!is_ip_literal(bare)) {
    error = "must be a numeric address \"ip\" or \"ip:port\" (like \"10.0.0.2\", \"127.0.0.1:8600\", "
            "\"[::1]:53\"), got " + quote(text);
    return std::nullopt;
  }
  std::string inner;
  auto ep = parse_address(with_port, false, inner);
  if (!ep) {
    error = "must be \"ip\" or \"ip:port\" with a port 1..65535, got " + quote(text);
    return std::nullopt;
  }
  ep->text = std::string(text);
  return ep;
}

ResolverConfig parse_resolver(const toml::table& table, const std::string& path) {
  TableReader r(table, "[resolver]", path);
  r.reject_unknown_keys({"nameservers", "timeout", "attempts", "valid", "hold", "family", "max_targets",
                         "max_addresses"});
  ResolverConfig c;
  if (r.has("nameservers")) {
    const toml::array* list = r.array("nameservers", "an array of addresses like [\"10.0.0.2\", \"127.0.0.1:8600\"]");
    if (list->empty()) {
      r.fail(*r.get("nameservers"), "nameservers must not be empty (leave it out to use /etc/resolv.conf's)");
    }
    for (const toml::node& node : *list) {
      const auto* s = node.as_string();
      if (s == nullptr) r.fail(node, "nameservers entries must be strings like \"10.0.0.2:53\", got " + describe(node));
      std::string error;
      auto ep = parse_nameserver(s->get(), error);
      if (!ep) r.fail(node, "nameservers entry " + error);
      c.nameservers.push_back(std::move(*ep));
    }
  }
  if (auto v = r.duration("timeout", false)) c.timeout = *v;
  if (auto v = r.integer("attempts", 1, 10)) c.attempts = static_cast<std::uint32_t>(*v);
  if (auto v = r.duration("valid", true)) {
    if (v->count() != 0 && *v < std::chrono::seconds(1)) {
      r.fail(*r.get("valid"), "valid must be at least \"1s\" (or \"0s\": follow the TTL), got " +
                                  quote(*r.string("valid")));
    }
    c.valid = *v;
  }
  if (auto v = r.duration("hold", true)) c.hold = *v;
  if (auto v = parse_family(r)) c.family = *v;
  if (auto v = r.integer("max_targets", 1, 100000)) c.max_targets = static_cast<std::uint32_t>(*v);
  if (auto v = r.integer("max_addresses", 1, 100000)) c.max_addresses = static_cast<std::uint32_t>(*v);
  return c;
}

}  // namespace sluice::config_detail
