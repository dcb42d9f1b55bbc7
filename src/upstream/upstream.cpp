#include "upstream/upstream.hpp"

#include <algorithm>
#include <cmath>

#include "balance/hash.hpp"
#include "upstream/slow_start.hpp"

namespace sluice {

namespace {

// `base` (the file's units) in hundredths, ramped by slow start at `now`.
std::uint32_t ramped_centi(std::uint32_t base, TimePoint up_since, Duration slow_start, TimePoint now) {
  const double centi = base * 100.0;
  if (slow_start.count() <= 0 || up_since == TimePoint{}) return static_cast<std::uint32_t>(centi);
  const auto since = std::chrono::duration_cast<Duration>(now - up_since);
  const double w = std::round(centi * slow_start_factor(since, slow_start));
  return w < 1.0 ? 1U : static_cast<std::uint32_t>(w);
}

}  // namespace

Upstream::Upstream(const UpstreamConfig& config, std::vector<std::shared_ptr<ServerState>> states,
                   std::uint64_t random_seed)
    : config_(config),
      slow_start_(config.health ? config.health->slow_start : Duration{0}),
      hashing_(config.balance == Balance::hash) {
  const std::size_t n = config_.servers.size();
  members_.reserve(n);
  bool any_backup = false;
  for (std::size_t i = 0; i < n; ++i) {
    Member m;
    m.state = std::move(states[i]);
    m.config = config_.servers[i];
    m.seed = rendezvous_server_seed(m.config.address.text);
    any_backup = any_backup || m.config.backup;
    members_.push_back(std::move(m));
  }
  views_.resize(n);
  in_news_.assign(n, false);
  candidates_.resize(n);
  // Watch first, read after: a change in between is a notice for the first pick.
  for (std::size_t i = 0; i < n; ++i) members_[i].state->watch(this, i);

  std::lock_guard lock(mu_);
  const TimePoint now = Clock::now();
  for (std::size_t i = 0; i < n; ++i) {
    View& v = views_[i];
    v.seed = members_[i].seed;
    v.max_conns = members_[i].config.max_conns;
    v.backup = members_[i].config.backup;
    v.active = members_[i].state->active.load(std::memory_order_relaxed);
    read(i, now);
  }
  for (std::size_t tier = 0; tier < (any_backup ? 2U : 1U); ++tier) {
    tiers_[tier] = make_balancer(config_.balance, config_.hash_balance_factor, random_seed + tier);
    for (std::size_t i = 0; i < n; ++i) {
      describe(i, candidates_[i]);
      if (tier_of(i) != tier) candidates_[i].eligible = candidates_[i].up = false;
    }
    tiers_[tier]->reset(candidates_);
  }
}

Upstream::~Upstream() {
  for (const Member& m : members_) m.state->unwatch(this);
}

std::uint32_t Upstream::base_weight(std::size_t index) const {
  const Member& m = members_[index];
  const std::uint32_t o = m.state->weight_override();
  return o != 0 ? o : m.config.weight;
}

std::uint32_t Upstream::effective_weight_centi(std::size_t index, TimePoint now) const {
  // Hashing never ramps (see weight_at): report the weight it uses.
  const TimePoint up = slow_start_.count() > 0 && !hashing_ ? members_[index].state->up_since() : TimePoint{};
  return ramped_centi(base_weight(index), up, slow_start_, now);
}

std::uint32_t Upstream::weight_at(const View& v, TimePoint now) const {
  // Hashing keeps the file's weight (a ramp would move keys back and forth).
  return hashing_ ? v.base_weight : ramped_centi(v.base_weight, v.up_since, slow_start_, now);
}

void Upstream::server_changed(std::size_t index) {
  std::lock_guard lock(news_mu_);
  if (!in_news_[index]) {
    in_news_[index] = true;
    news_.push_back(index);
  }
  have_news_.store(true, std::memory_order_release);
}

void Upstream::read(std::size_t i, TimePoint now) {
  const ServerState& s = *members_[i].state;
  View& v = views_[i];
  const bool was_up = v.up;
  const TimePoint from = s.passive_eligible_from();
  v.enabled = s.admin() == AdminState::enabled;
  const ActiveState checked = s.active_state();
  v.fenced = s.fenced();
  v.usable = v.enabled && checked != ActiveState::down && checked != ActiveState::standby && !v.fenced;
  v.awaited = v.enabled && s.awaited();
  v.up = v.usable && now >= from;
  up_count_ = up_count_ + (v.up ? 1 : 0) - (was_up ? 1 : 0);
  v.recheck_at = now < from ? from : TimePoint::max();
  if (v.recheck_at != TimePoint::max()) {
    next_recheck_ = std::min(next_recheck_, v.recheck_at);
    if (!v.timed) timed_.push_back(i);
    v.timed = true;
  }
  v.base_weight = base_weight(i);
  v.up_since = slow_start_.count() > 0 && !hashing_ ? s.up_since() : TimePoint{};
  v.weight = weight_at(v, now);
  if (v.up_since != TimePoint{} && now < v.up_since + slow_start_ && !v.ramping) {
    ramping_.push_back(i);
    v.ramping = true;
  }
}

void Upstream::publish(std::size_t i) {
  views_[i].active = members_[i].state->active.load(std::memory_order_relaxed);
  Candidate c;
  describe(i, c);
  tiers_[tier_of(i)]->update(i, c);
}

void Upstream::catch_up(TimePoint now) {
  if (have_news_.load(std::memory_order_acquire)) {
    {
      std::lock_guard lock(news_mu_);
      noticed_.swap(news_);
      for (std::size_t i : noticed_) in_news_[i] = false;
      have_news_.store(false, std::memory_order_relaxed);
    }
    for (std::size_t i : noticed_) {
      read(i, now);
      publish(i);
    }
    noticed_.clear();
  }
  if (now >= next_recheck_) {
    next_recheck_ = TimePoint::max();
    std::size_t kept = 0;
    for (std::size_t k = 0; k < timed_.size(); ++k) {
      const std::size_t i = timed_[k];
      if (now >= views_[i].recheck_at) {
        read(i, now);  // appends nothing: i is still marked timed
        publish(i);
      }
      if (views_[i].recheck_at == TimePoint::max()) {
        views_[i].timed = false;
      } else {
        next_recheck_ = std::min(next_recheck_, views_[i].recheck_at);
        timed_[kept++] = i;
      }
    }
    timed_.resize(kept);
  }
  for (std::size_t k = 0; k < ramping_.size();) {
    const std::size_t i = ramping_[k];
    View& v = views_[i];
    if (const std::uint32_t w = weight_at(v, now); w != v.weight) {
      v.weight = w;
      publish(i);
    }
    if (v.up_since == TimePoint{} || now >= v.up_since + slow_start_) {
      v.ramping = false;
      ramping_[k] = ramping_.back();
      ramping_.pop_back();
    } else {
      ++k;
    }
  }
}

std::size_t Upstream::scan(bool ignore_health, const TriedSet& tried, std::string_view key) {
  // Views are as current as the balancers' indexes: no server state is read.
  for (std::size_t tier = 0; tier < 2 && tiers_[tier]; ++tier) {
    bool any = false;
    for (std::size_t i = 0; i < views_.size(); ++i) {
      const View& v = views_[i];
      Candidate& c = candidates_[i];
      describe(i, c);
      c.eligible = (ignore_health ? v.enabled && !v.fenced : v.up) && has_room(v) && tier_of(i) == tier && !tried.contains(i);
      any = any || c.eligible;
    }
    if (!any) continue;
    const std::size_t chosen = tiers_[tier]->choose(candidates_, key);
    if (chosen != kNoCandidate) return chosen;
  }
  return kNoCandidate;
}

std::size_t Upstream::lone_server(const TriedSet& tried) const {
  std::size_t found = kNoCandidate;
  for (std::size_t i = 0; i < views_.size(); ++i) {
    if (!views_[i].usable) continue;
    if (found != kNoCandidate) return kNoCandidate;  // two: the other takes the load
    found = i;
  }
  if (found == kNoCandidate || views_[found].up || !has_room(views_[found]) || tried.contains(found)) {
    return kNoCandidate;
  }
  return found;
}

long Upstream::pick(const TriedSet& tried, std::string_view key, TimePoint now, bool panic, bool* full) {
  std::lock_guard lock(mu_);
  catch_up(now);
  std::size_t chosen = kNoCandidate;
  if (tried.empty()) {
    for (std::size_t tier = 0; tier < 2 && tiers_[tier] && chosen == kNoCandidate; ++tier) {
      chosen = tiers_[tier]->choose_indexed(key);
    }
  } else {
    chosen = scan(false, tried, key);
  }
  // Panic mode (Envoy's term): only when no server at all passes its health
  // checks; servers that are merely full or already tried do not count.
  if (chosen == kNoCandidate && panic && config_.all_down == AllDown::fail_open && up_count_ == 0) {
    chosen = scan(true, tried, key);
  }
  // nginx's rule: passive failures never take out the only server left.
  // Refusing every client for fail_timeout after a lone backend restarts
  // protects nothing; a connect that fails costs one client one attempt.
  // Not on a fallback chain's first pass (panic false): a healthy fallback
  // is better than a lone server passive health just took out.
  bool lone = false;
  if (chosen == kNoCandidate && panic) {
    chosen = lone_server(tried);
    lone = chosen != kNoCandidate;
  }
  if (chosen == kNoCandidate) {
    if (full != nullptr) {
      *full = false;
      for (std::size_t i = 0; i < views_.size() && !*full; ++i) {
        *full = ((views_[i].up && !has_room(views_[i])) || views_[i].awaited) && !tried.contains(i);
      }
    }
    return -1;
  }
  ServerState& s = *members_[chosen].state;
  s.on_selected(now, lone);  // a trial that starts here comes back as a notice
  raise_peak(s.peak_active, s.active.fetch_add(1, std::memory_order_relaxed) + 1);
  s.total_sessions.fetch_add(1, std::memory_order_relaxed);
  publish(chosen);
  s.notify(this);  // other pools sharing the server see its count
  return static_cast<long>(chosen);
}

void Upstream::adopt(std::size_t index) {
  ServerState& s = *members_[index].state;
  {
    std::lock_guard lock(mu_);
    raise_peak(s.peak_active, s.active.fetch_add(1, std::memory_order_relaxed) + 1);
    publish(index);
  }
  s.notify(this);
}

void Upstream::release(std::size_t index) {
  ServerState& s = *members_[index].state;
  {
    std::lock_guard lock(mu_);
    s.active.fetch_sub(1, std::memory_order_relaxed);
    publish(index);
  }
  s.notify(this);
  if (queue_) queue_->serve(Clock::now());
}

}  // namespace sluice
