// Configurations that load but cannot work: a listener that sends to its own
// address, and SNI hashing behind a listener that never reads an SNI.
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <string>

#include <doctest/doctest.h>

#include "config_cases.hpp"
#include "sluice/address.hpp"
#include "sluice/config.hpp"

using namespace config_test;

namespace {

std::string listener(const std::string& name, const std::string& listen, const std::string& upstream) {
  return "[[listener]]\nname = \"" + name + "\"\nlisten = \"" + listen + "\"\nupstream = \"" + upstream + "\"\n";
}

std::string upstream(const std::string& name, const std::string& server) {
  return "[upstream." + name + "]\nservers = [\n  { address = \"10.9.9.9:1\" },\n  { address = \"" + server +
         "\" },\n]\n";
}

std::string loop_error(int line, const std::string& up, const std::string& server, const std::string& name,
                       const std::string& listen) {
  const std::string column = std::to_string(15);
  return "x.toml:" + std::to_string(line) + ":" + column + ": upstream \"" + up + "\" server 2: address \"" + server +
         "\" is where listener \"" + name + "\" listens (\"" + listen +
         "\") and that listener sends to this upstream: connections would loop back into sluice";
}

// A non-loopback IPv4 address of this host, or "" when it has none.
std::string local_ipv4() {
  ifaddrs* list = nullptr;
  std::string found;
  if (::getifaddrs(&list) != 0) return found;
  for (const ifaddrs* it = list; it != nullptr && found.empty(); it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    const std::string ip = sluice::format_ip(it->ifa_addr);
    if (ip.rfind("127.", 0) != 0) found = ip;
  }
  ::freeifaddrs(list);
  return found;
}

}  // namespace

TEST_CASE("a listener whose address is a server of its upstream is a loop") {
  // Servers are on line 8 (the upstream block starts on line 5).
  check_cases({
      {listener("l", "127.0.0.1:7000", "u") + upstream("u", "127.0.0.1:7000"),
       loop_error(8, "u", "127.0.0.1:7000", "l", "127.0.0.1:7000")},
      {listener("l", "0.0.0.0:7000", "u") + upstream("u", "127.0.0.1:7000"),
       loop_error(8, "u", "127.0.0.1:7000", "l", "0.0.0.0:7000")},
      {listener("l", "0.0.0.0:7000", "u") + upstream("u", "127.3.4.5:7000"),
       loop_error(8, "u", "127.3.4.5:7000", "l", "0.0.0.0:7000")},
      {listener("l", "[::]:7000", "u") + upstream("u", "[::1]:7000"),
       loop_error(8, "u", "[::1]:7000", "l", "[::]:7000")},
      {listener("l", "[::1]:7000", "u") + upstream("u", "[0:0::1]:7000"),
       loop_error(8, "u", "[0:0::1]:7000", "l", "[::1]:7000")},
      {listener("l", "127.0.0.1:7000", "u") + upstream("u", "0.0.0.0:7000"),
       loop_error(8, "u", "0.0.0.0:7000", "l", "127.0.0.1:7000")},
      // Through a route and through default_upstream of a TLS listener.
      {"[[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:8443\"\npreread = \"tls\"\n"
       "routes = [{ sni = \"a.test\", upstream = \"v\" }]\ndefault_upstream = \"u\"\n" +
           upstream("v", "10.0.0.1:443") + upstream("u", "127.0.0.1:8443"),
       loop_error(15, "u", "127.0.0.1:8443", "t", "127.0.0.1:8443")},
      {"[[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:8443\"\npreread = \"tls\"\n"
       "routes = [{ sni = \"a.test\", upstream = \"v\" }]\ndefault_upstream = \"u\"\n" +
           upstream("v", "127.0.0.1:8443") + upstream("u", "10.0.0.1:443"),
       loop_error(10, "v", "127.0.0.1:8443", "t", "127.0.0.1:8443")},
  });
  // Servers written as an array of tables: the position is still the address.
  CHECK(error_of(listener("l", "127.0.0.1:7000", "u") +
                 "[[upstream.u.servers]]\naddress = \"10.0.0.1:1\"\n[[upstream.u.servers]]\naddress = "
                 "\"127.0.0.1:7000\"\n") ==
        "x.toml:8:11: upstream \"u\" server 2: address \"127.0.0.1:7000\" is where listener \"l\" listens "
        "(\"127.0.0.1:7000\") and that listener sends to this upstream: connections would loop back into sluice");
}

TEST_CASE("near misses are not loops") {
  const std::string cases[] = {
      listener("l", "127.0.0.1:7000", "u") + upstream("u", "127.0.0.1:7001"),  // another port
      listener("l", "127.0.0.1:7000", "u") + upstream("u", "127.0.0.2:7000"),  // another loopback address
      listener("l", "0.0.0.0:7000", "u") + upstream("u", "[::1]:7000"),         // IPv4 listener, IPv6 server
      listener("l", "[::]:7000", "u") + upstream("u", "127.0.0.1:7000"),        // IPv6 listeners are IPv6-only
      listener("l", "0.0.0.0:7000", "u") + upstream("u", "198.51.100.77:7000"),  // not an address of this host
      listener("l", "127.0.0.1:0", "u") + upstream("u", "127.0.0.1:7000"),      // kernel-chosen port
      // The loop is in an upstream that this listener does not use.
      listener("l", "127.0.0.1:7000", "u") + upstream("u", "10.0.0.1:1") + upstream("other", "127.0.0.1:7000"),
  };
  for (const auto& text : cases) {
    CAPTURE(text);
    CHECK(error_of(text) == "no error");
  }
}

TEST_CASE("a wildcard listener loops to this host's own interface address") {
  const std::string ip = local_ipv4();
  if (ip.empty()) return;  // only loopback here: nothing more to check
  CHECK(error_of(listener("l", "0.0.0.0:7000", "u") + upstream("u", ip + ":7000")) ==
        loop_error(8, "u", ip + ":7000", "l", "0.0.0.0:7000"));
  CHECK(error_of(listener("l", ip + ":7000", "u") + upstream("u", ip + ":7000")) ==
        loop_error(8, "u", ip + ":7000", "l", ip + ":7000"));
  CHECK(error_of(listener("l", ip + ":7000", "u") + upstream("u", ip + ":7001")) == "no error");
}

TEST_CASE("hash_key = \"sni\" needs a listener that reads an SNI") {
  const std::string hashed = "[upstream.h]\nbalance = \"hash\"\nhash_key = \"sni\"\n"
                             "servers = [{ address = \"10.0.0.1:443\" }]\n";
  const std::string message =
      "x.toml:7:12: upstream \"h\": hash_key = \"sni\" needs an SNI, but listener \"plain\" uses this upstream "
      "without preread = \"tls\" or \"postgres\": every key would be empty and all connections would go to one "
      "server; use \"sni_or_client_ip\" or \"client_ip\"";
  check_cases({
      {listener("plain", "127.0.0.1:0", "h") + hashed, message},
      {listener("plain", "127.0.0.1:0", "h") + hashed + "[[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:0\"\n"
                                                        "preread = \"tls\"\ndefault_upstream = \"h\"\n",
       message},
  });
  const std::string fine[] = {
      "[[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:0\"\npreread = \"tls\"\ndefault_upstream = \"h\"\n" + hashed,
      "[[listener]]\nname = \"p\"\nlisten = \"127.0.0.1:0\"\npreread = \"postgres\"\n"
      "routes = [{ sni = \"db.test\", upstream = \"h\" }]\n" + hashed,
      listener("plain", "127.0.0.1:0", "h") +
          "[upstream.h]\nbalance = \"hash\"\nhash_key = \"sni_or_client_ip\"\nservers = [{ address = \"10.0.0.1:443\" }]\n",
      // An SNI-hashed upstream that no plain listener uses.
      listener("plain", "127.0.0.1:0", "u") + kUpstreamU + hashed,
  };
  for (const auto& text : fine) {
    CAPTURE(text);
    CHECK(error_of(text) == "no error");
  }
}
