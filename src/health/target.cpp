#include "health/target.hpp"

#include <string_view>
#include <utility>

#include <spdlog/spdlog.h>

#include "health/schedule.hpp"
#include "log/rate_limited_warning.hpp"
#include "sluice/address.hpp"

namespace sluice::health {

bool same_check(const HealthConfig& a, const HealthConfig& b) {
  const auto ranges_equal = [](const std::vector<StatusRange>& x, const std::vector<StatusRange>& y) {
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (x[i].low != y[i].low || x[i].high != y[i].high) return false;
    }
    return true;
  };
  return a.type == b.type && a.interval == b.interval && a.timeout == b.timeout && a.rise == b.rise &&
         a.fall == b.fall && a.jitter == b.jitter && a.port == b.port && a.initial == b.initial &&
         a.on_down == b.on_down && a.on_role_change == b.on_role_change && a.slow_start == b.slow_start && a.path == b.path && a.method == b.method &&
         a.host == b.host && ranges_equal(a.expect_status, b.expect_status) && a.expect_body == b.expect_body &&
         a.send == b.send && a.expect == b.expect && a.expect_match == b.expect_match &&
         a.redis_role == b.redis_role && a.postgres_role == b.postgres_role && a.user == b.user &&
         a.database == b.database && a.sslmode == b.sslmode && a.password_file == b.password_file &&
         a.send_proxy == b.send_proxy && a.mysql_role == b.mysql_role && a.galera == b.galera &&
         a.max_lag == b.max_lag;
}

bool same_target(const Endpoint& a, const Endpoint& b) {
  return a.text == b.text && a.port == b.port && a.addr_len == b.addr_len && same_ip(a.addr, b.addr);
}

namespace {

RateLimitedWarning g_local_warning;

std::string_view check_type_name(HealthType t) {
  switch (t) {
    case HealthType::tcp: return "tcp";
    case HealthType::http: return "http";
    case HealthType::send_expect: return "send_expect";
    case HealthType::postgres: return "postgres";
    case HealthType::redis: return "redis";
    case HealthType::mysql: return "mysql";
  }
  return "tcp";
}

bool starts_up(const ServerState& state, const HealthConfig& config) {
  switch (state.active_state()) {
    case ActiveState::up: return true;
    case ActiveState::down:
    case ActiveState::standby: return false;
    case ActiveState::unchecked: break;
  }
  return config.initial == HealthInitial::up;
}

// Did a check fail because the server answered with the wrong role? The
// database judges (postgres_probe, redis_probe, mysql_probe) all say so as
// "role is ROLE, want ROLE"; lag, replication and Galera failures do not.
bool wrong_role(std::string_view reason) {
  return reason.starts_with("role is ") && reason.find(", want ") != std::string_view::npos;
}

}  // namespace

Target::Target(HealthChecker& owner, std::shared_ptr<ServerState> state, const HealthConfig& config,
               const Endpoint& address)
    : owner_(owner),
      state_(std::move(state)),
      config_(config),
      address_(address),
      probe_(make_probe(owner.loop_, config_, address_)),
      counter_(config_.rise, config_.fall, starts_up(*state_, config_)),
      last_passed_(counter_.up()) {
  timer_ = handles_.add(new Timer(this));
  uv_timer_init(owner.loop_, &timer_->uv);
}

void Target::start() {
  if (state_->active_state() == ActiveState::unchecked) {
    if (counter_.up()) {
      state_->set_active(ActiveState::up, "not checked yet (initial = up)");
    } else {
      state_->set_first_pending(true);
      state_->set_active(ActiveState::down, "waiting for the first check");
      waiting_first_ = true;
    }
  }
  // A server held down until its first answer is checked at once: jitter
  // spreads the load of checks, but here it would only delay the server.
  schedule(waiting_first_ ? Duration{0} : first_delay(config_.interval, config_.jitter, owner_.uniform()));
}

void Target::schedule(Duration delay) {
  uv_timer_start(&timer_->uv, &Target::on_timer, static_cast<std::uint64_t>(delay.count()), 0);
}

void Target::on_timer(uv_timer_t* t) { Timer::of(t)->owner->check(); }

void Target::check() {
  check_started_ = Clock::now();
  probe_->start([this](Probe::Verdict verdict, std::string reason) { on_result(verdict, std::move(reason)); });
}

void Target::on_result(Probe::Verdict verdict, std::string reason) {
  state_->record_check(check_type_name(config_.type),
                       verdict == Probe::Verdict::pass   ? CheckResult::pass
                       : verdict == Probe::Verdict::fail ? CheckResult::fail
                                                         : CheckResult::local_error,
                       std::chrono::duration<double>(Clock::now() - check_started_).count(), reason);
  if (verdict == Probe::Verdict::local_error) {
    // Not the server's doing: no pass, no failure, the streak as it was.
    g_local_warning.warn(fmt::format("local resource error in the active check of upstream \"{}\" server {}: {} "
                                     "(not counted for or against the server, which stays {})",
                                     state_->upstream, state_->address.text, reason,
                                     counter_.up() ? "up" : "down"));
    schedule(next_delay(config_.interval, config_.jitter, owner_.uniform()));
    return;
  }
  const bool took_sessions = state_->takes_sessions(Clock::now());
  const bool ok = verdict == Probe::Verdict::pass;
  const bool first = std::exchange(waiting_first_, false);
  const bool passed_before = std::exchange(last_passed_, ok);
  const auto took = [this] { return std::chrono::duration_cast<Duration>(Clock::now() - check_started_); };
  // The last answer's facts stay when a check does not answer: a timeout
  // is not a demotion (see says_primary).
  answered_ = probe_->facts().answered;
  if (answered_) {
    facts_ = probe_->facts();
    facts_.reading = owner_.next_reading();
  }
  state_->set_role(answered_ ? facts_.role : std::string(), answered_ ? facts_.lag_seconds : std::nullopt);
  // The server answered, with another role than the one wanted: standby,
  // not down. Lag and replication failures are not such an answer.
  const bool other_role = !ok && wrong_role(reason);
  // One writer: a server that says it is the primary is weighed against
  // the pool's other primary before anything lets it serve.
  const bool won = owner_.arbitrate(*this);
  if (ok != counter_.up() && counter_.streak() == 0) streak_started_ = check_started_;
  standby_failures_ = ok || other_role ? 0 : standby_failures_ + 1;
  if (ok && (first || won) && !counter_.up()) {
    // Down only because nothing was known yet: the first answer decides
    // (HAProxy's init-state "down"), so a primary serves as soon as it has
    // said so, not `rise` intervals later. A primary that took over from
    // the one serving (one writer) serves at once too: the other is fenced.
    counter_.reset(true);
    state_->set_active(ActiveState::up, reason, took());
  } else if (other_role && counter_.up()) {
    // A node that passed with the wanted role now reports another one: it
    // was demoted (or promoted). No hysteresis: the answer is the server's
    // own word, not a lost packet, and every session sent there meanwhile
    // would write to the wrong node.
    counter_.reset(false);
    state_->set_active(ActiveState::standby, (passed_before ? "role changed: " : "") + reason, took());
    owner_.reported_down(*this, passed_before);
  } else if (other_role && state_->active_state() != ActiveState::standby) {
    // Not up, and answering: a standby (at its first check, or back from
    // being down), whatever `fall` says about failures.
    state_->set_active(ActiveState::standby, reason, took());
  } else if (!ok && !counter_.up() && state_->active_state() == ActiveState::standby) {
    // A standby that stops answering is down after `fall` failures.
    if (standby_failures_ >= config_.fall) {
      state_->set_active(ActiveState::down, reason,
                         std::chrono::duration_cast<Duration>(Clock::now() - streak_started_));
    } else {
      if (standby_failures_ == 1) streak_started_ = check_started_;
      state_->note_check(fmt::format("{} ({} of {} failures to mark it down)", reason, standby_failures_,
                                     config_.fall),
                         true);
    }
  } else if (const auto changed = counter_.record(ok)) {
    const auto detect = std::chrono::duration_cast<Duration>(Clock::now() - streak_started_);
    state_->set_active(*changed ? ActiveState::up : ActiveState::down, reason, detect);
    if (!*changed) owner_.reported_down(*this, false);
  } else if (counter_.streak() == 0) {
    // Agrees with the state: the status shows this check's result (no log,
    // no transition), so a server that is up says why it is up now.
    state_->note_check(reason, !ok);
    // A server that started down says once why it stays down, at info.
    if (first && !ok) {
      spdlog::info("upstream \"{}\" server {} stays down (active check): {}", state_->upstream,
                   state_->address.text, reason);
    }
  } else {
    // On the way to a change: say how far.
    state_->note_check(fmt::format("{} ({} of {} {} to mark it {})", reason, counter_.streak(), counter_.needed(),
                                   ok ? "passes" : "failures", ok ? "up" : "down"),
                       !ok);
  }
  // Its first answer is in (and applied above): no longer a wait, and
  // only now downtime if it said down.
  if (first) state_->set_first_pending(false);
  if (!took_sessions && state_->takes_sessions(Clock::now())) owner_.serves_again(state_);
  // The interval runs from the end of this check to the start of the next.
  schedule(next_delay(config_.interval, config_.jitter, owner_.uniform()));
}

void Target::close(std::function<void()> closed) {
  closed_ = std::move(closed);
  parts_open_ = 2;
  probe_->close([this] { part_closed(); });
  HandleTracker::close(timer_);
  handles_.when_all_closed([this] { part_closed(); });
}

void Target::part_closed() {
  if (--parts_open_ > 0) return;
  auto closed = std::move(closed_);
  closed();  // may delete this
}

}  // namespace sluice::health
