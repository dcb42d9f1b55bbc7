#include "discovery/answer.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <functional>
#include <tuple>

#include "sluice/host.hpp"

namespace sluice::discovery {

namespace {

// A bounded reader over one DNS message.
class Reader {
 public:
  Reader(const unsigned char* msg, std::size_t len) : msg_(msg), len_(len) {}

  bool ok() const { return ok_; }
  std::size_t pos() const { return pos_; }
  void seek(std::size_t p) {
    if (p > len_) ok_ = false;
    pos_ = std::min(p, len_);
  }
  std::uint16_t u16() {
    if (!need(2)) return 0;
    const auto v = static_cast<std::uint16_t>((msg_[pos_] << 8) | msg_[pos_ + 1]);
    pos_ += 2;
    return v;
  }
  std::uint32_t u32() {
    const std::uint32_t hi = u16();
    return (hi << 16) | u16();
  }
  const unsigned char* bytes(std::size_t n) {
    if (!need(n)) return nullptr;
    const unsigned char* p = msg_ + pos_;
    pos_ += n;
    return p;
  }
  // Reads a (possibly compressed) name at the current position and moves
  // past it; the name is returned dotted, lower-case, without the root dot.
  std::string name() {
    std::string out;
    std::size_t p = pos_;
    std::size_t end = 0;  // where reading resumes: after the first pointer, or after the name
    int jumps = 0;
    while (true) {
      if (p >= len_) return fail();
      const unsigned char n = msg_[p];
      if (n == 0) {
        if (end == 0) end = p + 1;
        break;
      }
      if ((n & 0xc0) == 0xc0) {
        if (p + 1 >= len_ || ++jumps > 64) return fail();
        if (end == 0) end = p + 2;
        p = static_cast<std::size_t>(((n & 0x3f) << 8) | msg_[p + 1]);
        continue;
      }
      if ((n & 0xc0) != 0 || p + 1 + n > len_) return fail();
      if (!out.empty()) out += '.';
      out.append(reinterpret_cast<const char*>(msg_ + p + 1), n);
      if (out.size() > 255) return fail();
      p += 1 + n;
    }
    pos_ = end;
    return normalize_host(out);
  }

 private:
  bool need(std::size_t n) {
    if (!ok_ || len_ - pos_ < n) {
      ok_ = false;
      return false;
    }
    return true;
  }
  std::string fail() {
    ok_ = false;
    return {};
  }

  const unsigned char* msg_;
  std::size_t len_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

constexpr std::uint16_t kClassIn = 1;
constexpr std::uint16_t kTypeCname = 5;
constexpr std::uint16_t kTypeSoa = 6;

void keep_min(std::optional<std::uint32_t>& ttl, std::uint32_t v) {
  // RFC 2181: a TTL with the top bit set is read as zero.
  if (v > 0x7fffffffU) v = 0;
  ttl = ttl ? std::min(*ttl, v) : v;
}

bool host_name_bytes(std::string_view name) {
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

std::string_view to_string(RecordType t) {
  switch (t) {
    case RecordType::a: return "A";
    case RecordType::aaaa: return "AAAA";
    case RecordType::srv: return "SRV";
  }
  return "?";
}

std::optional<Answer> parse_answer(const unsigned char* msg, std::size_t len, RecordType type) {
  Reader r(msg, len);
  r.u16();  // id
  r.u16();  // flags
  const std::uint16_t qd = r.u16();
  const std::uint16_t an = r.u16();
  const std::uint16_t ns = r.u16();
  r.u16();  // additional: not read (targets are asked for on their own)
  for (std::uint16_t i = 0; i < qd && r.ok(); ++i) {
    r.name();
    r.u16();
    r.u16();
  }
  Answer out;
  const auto want = static_cast<std::uint16_t>(type);
  for (std::uint16_t i = 0; i < an && r.ok(); ++i) {
    r.name();
    const std::uint16_t rtype = r.u16();
    const std::uint16_t rclass = r.u16();
    const std::uint32_t ttl = r.u32();
    const std::uint16_t rdlen = r.u16();
    const std::size_t rdata = r.pos();
    if (!r.ok()) break;
    if (rclass == kClassIn && (rtype == want || rtype == kTypeCname)) keep_min(out.ttl, ttl);
    if (rclass == kClassIn && rtype == want) {
      if (type == RecordType::a || type == RecordType::aaaa) {
        const std::size_t size = type == RecordType::a ? 4 : 16;
        if (rdlen != size) return std::nullopt;
        const unsigned char* p = r.bytes(size);
        char buf[INET6_ADDRSTRLEN] = {};
        if (p == nullptr ||
            ::inet_ntop(type == RecordType::a ? AF_INET : AF_INET6, p, buf, sizeof buf) == nullptr) {
          return std::nullopt;
        }
        out.ips.emplace_back(buf);
      } else {
        SrvRecord s;
        s.priority = r.u16();
        s.weight = r.u16();
        s.port = r.u16();
        s.target = r.name();
        // A target is asked for and shown: only a host name's bytes are taken.
        if (r.ok() && host_name_bytes(s.target)) out.srv.push_back(std::move(s));
      }
    }
    r.seek(rdata + rdlen);
  }
  // A negative answer: the SOA in the authority section says how long it holds.
  if (out.ips.empty() && out.srv.empty() && !out.ttl) {
    for (std::uint16_t i = 0; i < ns && r.ok(); ++i) {
      r.name();
      const std::uint16_t rtype = r.u16();
      r.u16();
      const std::uint32_t ttl = r.u32();
      const std::uint16_t rdlen = r.u16();
      const std::size_t rdata = r.pos();
      if (r.ok() && rtype == kTypeSoa && rdlen >= 20) {
        r.seek(rdata + rdlen - 4);
        keep_min(out.ttl, std::min(ttl, r.u32()));
      }
      r.seek(rdata + rdlen);
    }
  }
  if (!r.ok()) return std::nullopt;
  std::sort(out.ips.begin(), out.ips.end());
  out.ips.erase(std::unique(out.ips.begin(), out.ips.end()), out.ips.end());
  auto srv_less = [](const SrvRecord& a, const SrvRecord& b) {
    return std::tie(a.target, a.port, a.priority, a.weight) < std::tie(b.target, b.port, b.priority, b.weight);
  };
  std::sort(out.srv.begin(), out.srv.end(), srv_less);
  out.srv.erase(std::unique(out.srv.begin(), out.srv.end()), out.srv.end());
  return out;
}

Duration refresh_interval(std::optional<std::uint32_t> ttl, Duration valid) {
  if (valid.count() > 0) return valid;
  if (!ttl) return kNoTtlRefresh;
  const Duration d = std::chrono::seconds(*ttl);
  return std::clamp(d, kMinRefresh, kMaxRefresh);
}

Duration retry_interval(Duration refresh) { return std::clamp(refresh, kMinRefresh, kMaxRetry); }

std::string address_text(std::string_view ip, std::uint16_t port) {
  std::string out;
  if (ip.find(':') != std::string_view::npos) {
    out += '[';
    out += ip;
    out += ']';
  } else {
    out += ip;
  }
  out += ':';
  out += std::to_string(port);
  return out;
}

std::uint32_t srv_weight(std::uint16_t weight) {
  if (weight == 0) return 1;
  return std::min<std::uint32_t>(weight, 1000);
}

bool wants(AddressFamily family, RecordType t) {
  switch (t) {
    case RecordType::a: return family != AddressFamily::ipv6;
    case RecordType::aaaa: return family != AddressFamily::ipv4;
    case RecordType::srv: return true;
  }
  return false;
}

std::vector<Found> servers_of_host(std::uint16_t port, const std::vector<std::string>& ips) {
  std::vector<Found> out;
  out.reserve(ips.size());
  for (const std::string& ip : ips) out.push_back(Found{address_text(ip, port), 0, false});
  normalize(out);
  return out;
}

void normalize(std::vector<Found>& servers) {
  std::stable_sort(servers.begin(), servers.end());
  servers.erase(std::unique(servers.begin(), servers.end(),
                            [](const Found& a, const Found& b) { return a.address == b.address; }),
                servers.end());
}

std::size_t cap_records(std::vector<SrvRecord>& records, std::size_t max) {
  if (records.size() <= max) return 0;
  const std::size_t dropped = records.size() - max;
  auto preferred = [](const SrvRecord& a, const SrvRecord& b) {
    // Larger weights first: compare b's weight with a's.
    return std::tie(a.priority, b.weight, a.target, a.port) < std::tie(b.priority, a.weight, b.target, b.port);
  };
  std::sort(records.begin(), records.end(), preferred);
  records.resize(max);
  std::sort(records.begin(), records.end(), [](const SrvRecord& a, const SrvRecord& b) {
    return std::tie(a.target, a.port, a.priority, a.weight) < std::tie(b.target, b.port, b.priority, b.weight);
  });
  return dropped;
}

std::size_t cap_addresses(std::vector<std::string>& ips, std::size_t max) {
  if (ips.size() <= max) return 0;
  const std::size_t dropped = ips.size() - max;
  ips.resize(max);
  return dropped;
}

std::size_t cap_servers(std::vector<Found>& servers, std::size_t max) {
  if (servers.size() <= max) return 0;
  const std::size_t dropped = servers.size() - max;
  std::sort(servers.begin(), servers.end(), [](const Found& a, const Found& b) {
    return std::tie(a.backup, a.priority, b.weight, a.address) < std::tie(b.backup, b.priority, a.weight, b.address);
  });
  servers.resize(max);
  normalize(servers);
  return dropped;
}

std::vector<std::string> describe_changes(const std::vector<Found>& before, const std::vector<Found>& after, bool srv) {
  std::vector<std::string> out;
  auto added = [srv](const Found& f) {
    std::string line = f.address + " added";
    if (srv) {
      line += " (weight " + std::to_string(f.weight) + ", priority " + std::to_string(f.priority) +
              (f.backup ? ", a backup)" : ")");
    }
    return line;
  };
  std::size_t i = 0;
  std::size_t j = 0;
  while (i < before.size() || j < after.size()) {
    if (j == after.size() || (i < before.size() && before[i].address < after[j].address)) {
      out.push_back(before[i++].address + " removed");
      continue;
    }
    if (i == before.size() || after[j].address < before[i].address) {
      out.push_back(added(after[j++]));
      continue;
    }
    const Found& a = before[i++];
    const Found& b = after[j++];
    if (a.weight != b.weight) {
      out.push_back(b.address + " weight " + std::to_string(a.weight) + " -> " + std::to_string(b.weight));
    }
    const char* role = a.backup == b.backup ? "" : b.backup ? "now a backup" : "no longer a backup";
    if (a.priority != b.priority) {
      std::string line = b.address + " priority " + std::to_string(a.priority) + " -> " + std::to_string(b.priority);
      if (*role != '\0') line += std::string(" (") + role + ")";
      out.push_back(std::move(line));
    } else if (*role != '\0') {
      out.push_back(b.address + " " + role);  // another record's priority moved
    }
  }
  return out;
}

std::vector<Found> HoldSet::update(const std::vector<Found>& fresh, TimePoint now, Duration hold, std::size_t max) {
  std::map<std::string, const Found*> now_found;
  for (const Found& f : fresh) now_found.emplace(f.address, &f);
  // What left since the last update starts its hold now.
  for (const Found& f : current_) {
    if (now_found.count(f.address) == 0 && held_.count(f.address) == 0) held_.emplace(f.address, std::make_pair(f, now));
  }
  for (auto it = held_.begin(); it != held_.end();) {
    const bool back = now_found.count(it->first) != 0;
    const bool expired = now >= it->second.second + hold;
    it = back || expired ? held_.erase(it) : std::next(it);
  }
  std::vector<Found> out = fresh;
  if (fresh.size() + held_.size() > max) {
    // Too many: those that left most recently stay, the others go now.
    std::vector<std::pair<TimePoint, std::string>> by_age;
    for (const auto& [address, held] : held_) by_age.emplace_back(held.second, address);
    std::sort(by_age.begin(), by_age.end(), std::greater<>());
    const std::size_t room = max > fresh.size() ? max - fresh.size() : 0;
    for (std::size_t k = room; k < by_age.size(); ++k) held_.erase(by_age[k].second);
  }
  for (const auto& [address, held] : held_) out.push_back(held.first);
  normalize(out);
  current_ = out;
  return out;
}

TimePoint HoldSet::next_expiry(Duration hold) const {
  TimePoint next = TimePoint::max();
  for (const auto& [address, held] : held_) next = std::min(next, held.second + hold);
  return next;
}

std::vector<std::string> HoldSet::held() const {
  std::vector<std::string> out;
  for (const auto& [address, held] : held_) out.push_back(address);
  return out;
}

}  // namespace sluice::discovery
