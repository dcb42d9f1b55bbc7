#include "upstream/availability.hpp"

#include <algorithm>
#include <utility>

#include "upstream/upstream.hpp"

namespace sluice {

Availability availability(const Upstream& up, TimePoint now) {
  Availability a;
  a.servers = up.size();
  for (std::size_t i = 0; i < up.size(); ++i) {
    const ServerState& s = up.server(i);
    if (s.eligible(now)) {
      const std::uint32_t max = up.member(i).config.max_conns;
      if (max == 0 || s.active.load(std::memory_order_relaxed) < max) {
        ++a.eligible;
      } else {
        ++a.unavailable["full"];
      }
      continue;
    }
    // Whatever the state is called (a state added later needs nothing here).
    std::string state = s.status(now).state;
    // Health let it in again between the two reads: not a reason to name.
    if (state == "up") state = "unavailable";
    ++a.unavailable[state];
  }
  return a;
}

std::string describe_unavailable(const Availability& a) {
  if (a.servers == 0) return "the pool is empty";
  std::vector<std::pair<std::string, std::size_t>> by_count(a.unavailable.begin(), a.unavailable.end());
  std::stable_sort(by_count.begin(), by_count.end(),
                   [](const auto& x, const auto& y) { return x.second > y.second; });
  std::string out;
  for (const auto& [state, n] : by_count) {
    if (n == 0) continue;
    if (!out.empty()) out += ", ";
    out += std::to_string(n) + " " + state;
  }
  return out;
}

std::optional<OutageTracker::Line> OutageTracker::observe(const std::string& name, const Availability& a,
                                                          TimePoint now, std::string_view note) {
  const auto it = open_.find(name);
  if (a.eligible == 0) {
    if (it != open_.end()) return std::nullopt;
    open_.emplace(name, now);
    std::string text = "upstream \"" + name + "\" has no server available: " + describe_unavailable(a);
    if (a.servers != 0) text += " (of " + std::to_string(a.servers) + ")";
    if (!note.empty()) text += "; " + std::string(note);
    return Line{true, std::move(text)};
  }
  if (it == open_.end()) return std::nullopt;
  const Duration lasted = std::chrono::duration_cast<Duration>(now - it->second);
  open_.erase(it);
  return Line{false, "upstream \"" + name + "\" has a server available again after " + format_duration(lasted) +
                         ": " + std::to_string(a.eligible) + " of " + std::to_string(a.servers) + " eligible"};
}

void OutageTracker::keep_only(const std::set<std::string>& names) {
  std::erase_if(open_, [&names](const auto& kv) { return names.count(kv.first) == 0; });
}

std::optional<TimePoint> OutageTracker::outage_since(const std::string& name) const {
  const auto it = open_.find(name);
  if (it == open_.end()) return std::nullopt;
  return it->second;
}

}  // namespace sluice
