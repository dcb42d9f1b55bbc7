#include "health/one_writer.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <utility>
#include <vector>

namespace sluice::health {

bool wants_one_writer(const HealthConfig& c) {
  switch (c.type) {
    case HealthType::postgres: return c.postgres_role == PostgresRole::primary;
    case HealthType::redis: return c.redis_role == RedisRole::master;
    case HealthType::mysql: return c.mysql_role == MysqlRole::primary;
    default: return false;
  }
}

Verdict judge(HealthType type, const RoleFacts& incumbent, const RoleFacts& newcomer, bool serving) {
  switch (type) {
    case HealthType::postgres: return judge_postgres(incumbent, newcomer, serving);
    case HealthType::redis: return judge_redis(incumbent, newcomer);
    case HealthType::mysql: return judge_mysql(incumbent, newcomer, serving);
    default: return {Winner::incumbent, FenceKind::waiting, "the serving one keeps serving"};
  }
}

// A promotion starts a new timeline, numbered above every one before it:
// the higher timeline is the later promotion, and the other node's writes
// since then are on a branch no standby follows.
Verdict judge_postgres(const RoleFacts& incumbent, const RoleFacts& newcomer, bool serving) {
  const auto tl = [](std::int64_t t) { return "timeline " + std::to_string(t); };
  if (newcomer.timeline > 0 && incumbent.timeline > 0) {
    if (newcomer.timeline > incumbent.timeline) {
      return {Winner::newcomer, FenceKind::lost, tl(newcomer.timeline) + " > " + tl(incumbent.timeline)};
    }
    if (newcomer.timeline < incumbent.timeline) {
      return {Winner::incumbent, FenceKind::lost, tl(incumbent.timeline) + " > " + tl(newcomer.timeline)};
    }
  }
  const std::string same = newcomer.timeline > 0 && newcomer.timeline == incumbent.timeline
                               ? "both on " + tl(newcomer.timeline)
                               : std::string("timelines unknown");
  if (serving) return {Winner::incumbent, FenceKind::waiting, same + ": the serving one keeps serving"};
  return {Winner::neither, FenceKind::waiting, same + ": neither serves until one is no longer primary"};
}

namespace {

bool real_replid(const std::string& id) {
  return !id.empty() && id.find_first_not_of('0') != std::string::npos;
}

}  // namespace

// A replica promoted keeps its old master's replication id as
// master_replid2: the node whose replid2 is the other's replid took over
// from it. Otherwise neither is the other's heir.
Verdict judge_redis(const RoleFacts& incumbent, const RoleFacts& newcomer) {
  if (real_replid(incumbent.replid) && newcomer.replid2 == incumbent.replid) {
    return {Winner::newcomer, FenceKind::lost, "it was promoted from the other (its master_replid2 is the other's master_replid)"};
  }
  if (real_replid(newcomer.replid) && incumbent.replid2 == newcomer.replid) {
    return {Winner::incumbent, FenceKind::lost, "the other was promoted from it (master_replid2 is its master_replid)"};
  }
  return {Winner::neither, FenceKind::waiting,
          "neither replication history descends from the other's: neither serves until one is no longer master"};
}

// GTIDs say which transactions a server has, not who was promoted after
// whom: the serving one may hold acknowledged writes the newcomer lacks,
// and sending writes to the newcomer would leave those behind for good.
// Only a newcomer that has everything the serving one has may take over.
Verdict judge_mysql(const RoleFacts& incumbent, const RoleFacts& newcomer, bool serving) {
  const std::optional<bool> new_has_all =
      newcomer.gtid.empty() ? std::nullopt : gtid_contains(newcomer.gtid, incumbent.gtid);
  if (new_has_all == true && serving && incumbent.reading < newcomer.reading) {
    // The serving one's position is older than the newcomer's: it may have
    // taken writes since. The newcomer waits for a newer reading of it.
    return {Winner::incumbent, FenceKind::waiting,
            "the serving one keeps serving until a reading of it taken after the newcomer's shows that the "
            "newcomer's GTID position (" + newcomer.gtid + ") contains its own (" + incumbent.gtid + ", read earlier)"};
  }
  if (new_has_all == true) {
    return {Winner::newcomer, FenceKind::lost,
            "its GTID position (" + newcomer.gtid + ") contains the other's (" + incumbent.gtid + ")"};
  }
  if (serving) {
    return {Winner::incumbent, FenceKind::waiting,
            "the serving one keeps serving: the newcomer's GTID position (" +
                (newcomer.gtid.empty() ? std::string("unknown") : newcomer.gtid) + ") lacks some of its own (" +
                (incumbent.gtid.empty() ? std::string("unknown") : incumbent.gtid) + ")"};
  }
  const std::optional<bool> old_has_all =
      incumbent.gtid.empty() ? std::nullopt : gtid_contains(incumbent.gtid, newcomer.gtid);
  if (old_has_all == true) {
    return {Winner::incumbent, FenceKind::waiting,
            "its GTID position (" + incumbent.gtid + ") contains the other's (" + newcomer.gtid + ")"};
  }
  return {Winner::neither, FenceKind::waiting, "neither GTID position contains the other's"};
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\r' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  while (true) {
    const auto at = s.find(sep);
    out.push_back(trim(s.substr(0, at)));
    if (at == std::string_view::npos) return out;
    s.remove_prefix(at + 1);
  }
}

bool number(std::string_view s, std::uint64_t& out) {
  if (s.empty()) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && p == s.data() + s.size();
}

using Intervals = std::vector<std::pair<std::uint64_t, std::uint64_t>>;

// MariaDB: domain -> highest sequence number.
std::optional<std::map<std::uint64_t, std::uint64_t>> mariadb_position(std::string_view text) {
  std::map<std::uint64_t, std::uint64_t> out;
  if (trim(text).empty()) return out;
  for (std::string_view gtid : split(text, ',')) {
    const auto parts = split(gtid, '-');
    std::uint64_t domain = 0, server = 0, seq = 0;
    if (parts.size() != 3 || !number(parts[0], domain) || !number(parts[1], server) || !number(parts[2], seq)) {
      return std::nullopt;
    }
    out[domain] = std::max(out[domain], seq);
  }
  return out;
}

// MySQL: uuid -> intervals.
std::optional<std::map<std::string, Intervals>> mysql_set(std::string_view text) {
  std::map<std::string, Intervals> out;
  if (trim(text).empty()) return out;
  for (std::string_view entry : split(text, ',')) {
    const auto parts = split(entry, ':');
    if (parts.size() < 2 || parts[0].empty()) return std::nullopt;
    Intervals& iv = out[std::string(parts[0])];
    for (std::size_t i = 1; i < parts.size(); ++i) {
      const auto ends = split(parts[i], '-');
      std::uint64_t lo = 0, hi = 0;
      if (ends.size() == 1 && number(ends[0], lo)) {
        hi = lo;
      } else if (ends.size() != 2 || !number(ends[0], lo) || !number(ends[1], hi) || hi < lo) {
        return std::nullopt;
      }
      iv.emplace_back(lo, hi);
    }
  }
  return out;
}

bool covered(const Intervals& have, std::uint64_t lo, std::uint64_t hi) {
  // Walk `have` in order, extending the covered prefix from lo.
  Intervals sorted = have;
  std::sort(sorted.begin(), sorted.end());
  std::uint64_t next = lo;
  for (const auto& [a, b] : sorted) {
    if (a > next) break;
    if (b >= next) next = b + 1;
    if (next > hi) return true;
  }
  return next > hi;
}

}  // namespace

std::optional<bool> gtid_contains(std::string_view a, std::string_view b) {
  const bool mysql = a.find(':') != std::string_view::npos || b.find(':') != std::string_view::npos;
  if (mysql) {
    const auto sa = mysql_set(a);
    const auto sb = mysql_set(b);
    if (!sa || !sb) return std::nullopt;
    for (const auto& [uuid, intervals] : *sb) {
      const auto it = sa->find(uuid);
      for (const auto& [lo, hi] : intervals) {
        if (it == sa->end() || !covered(it->second, lo, hi)) return false;
      }
    }
    return true;
  }
  const auto pa = mariadb_position(a);
  const auto pb = mariadb_position(b);
  if (!pa || !pb) return std::nullopt;
  for (const auto& [domain, seq] : *pb) {
    const auto it = pa->find(domain);
    if (it == pa->end() || it->second < seq) return false;
  }
  return true;
}

std::string info_field(std::string_view info, std::string_view field) {
  std::size_t at = 0;
  while (at < info.size()) {
    std::size_t end = info.find('\n', at);
    if (end == std::string_view::npos) end = info.size();
    std::string_view line = info.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.size() > field.size() && line.substr(0, field.size()) == field && line[field.size()] == ':') {
      return std::string(line.substr(field.size() + 1));
    }
    at = end + 1;
  }
  return {};
}

}  // namespace sluice::health
