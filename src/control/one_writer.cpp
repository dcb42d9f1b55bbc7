// One writer on the control loop: what the sentinels' failover signs do to
// a master (fence it, or lift the fence), and serving the clients that
// waited meanwhile. The checks' own arbitration is in health/checker.cpp.
#include <spdlog/spdlog.h>

#include "control/control.hpp"
#include "sluice/address.hpp"

namespace sluice {

void Control::sentinel_fence(const std::string& upstream, const std::string& address, bool fence,
                             const std::string& by, const std::string& reason) {
  const Upstream* up = snapshot_ ? snapshot_->find_upstream(upstream) : nullptr;
  if (up == nullptr) return;
  for (std::size_t i = 0; i < up->size(); ++i) {
    const std::shared_ptr<ServerState>& state = up->member(i).state;
    if (format_sockaddr(reinterpret_cast<const sockaddr*>(&state->address.addr)) != address) continue;
    if (fence) {
      if (state->fenced()) return;
      state->fence(FenceKind::failover, by, reason);
      close_sessions(state, Cause::fenced);
    } else if (state->fence_kind() == FenceKind::failover) {
      state->unfence(reason);
      serve_queue(upstream);
    }
    return;
  }
}

void Control::expire_failover_fence(std::shared_ptr<ServerState> state) {
  struct Expiry {
    uv_timer_t timer{};
    Control* control = nullptr;
    std::shared_ptr<ServerState> state;
  };
  auto* e = new Expiry{{}, this, std::move(state)};
  uv_timer_init(loop_, &e->timer);
  e->timer.data = e;
  uv_timer_start(&e->timer, [](uv_timer_t* t) {
    auto* ex = static_cast<Expiry*>(t->data);
    if (ex->state->fence_kind() == FenceKind::failover) {
      ex->state->unfence("the failover the previous process saw begin did not complete in time");
      ex->control->serve_queue(ex->state->upstream);
    }
    uv_close(reinterpret_cast<uv_handle_t*>(t), [](uv_handle_t* h) { delete static_cast<Expiry*>(h->data); });
  }, static_cast<std::uint64_t>(discovery::kPromotionWait.count()), 0);
  uv_unref(reinterpret_cast<uv_handle_t*>(&e->timer));
}

void Control::serve_queue(const std::string& name) {
  if (!snapshot_) return;
  if (const Upstream* up = snapshot_->find_upstream(name)) {
    if (WaitQueue* q = up->queue()) q->serve(Clock::now());
  }
}

void Control::snapshot_is_current() {
  Snapshot::make_current(snapshot_);
  // A new master (or any server a change added) may be up already.
  for (const auto& [name, up] : snapshot_->upstreams) {
    if (WaitQueue* q = up->queue()) q->serve(Clock::now());
  }
}

}  // namespace sluice
