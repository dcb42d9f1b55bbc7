// What DNS discovery shows: filled on the control loop (src/discovery/),
// rendered by the admin API (/status, /metrics).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace sluice {

// One `servers` entry that comes from DNS.
struct DnsEntryStatus {
  std::string upstream;
  std::string entry;               // as written: "db.internal:5432" or the service name
  std::string type;                // "A/AAAA" or "SRV"
  std::string name;                // the name asked for
  std::vector<std::string> servers;  // server addresses from this entry now (held ones included)
  std::vector<std::string> held;     // of those, the ones DNS no longer gives (leaving after hold)
  std::int64_t ttl_seconds = -1;     // smallest TTL of its last answers; -1 = none yet
  std::int64_t next_refresh_ms = 0;  // wall clock of the next query; 0 = none planned
  std::int64_t last_answer_ms = 0;   // wall clock of the last good answer; 0 = none yet
  std::string last_error;            // "" when the last query of each of its names succeeded
  std::int64_t last_error_ms = 0;
};

struct DnsStatus {
  bool enabled = false;                 // some upstream discovers servers
  std::vector<std::string> nameservers; // empty: those of /etc/resolv.conf
  std::uint64_t queries = 0;
  std::map<std::string, std::uint64_t> errors;  // by kind: timeout, servfail, refused, nxdomain, network, other
  std::uint64_t changes = 0;            // answers that changed an upstream's servers
  std::vector<DnsEntryStatus> entries;
};

}  // namespace sluice
