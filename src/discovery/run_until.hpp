// Start-up waits of discovery: the control loop runs until the first answers
// are in, or a deadline, before anything else uses it.
#pragma once

#include <uv.h>

#include "sluice/time.hpp"

namespace sluice::discovery {

// Runs `loop` until done() or `max` has passed. Call only while nothing else
// runs the loop.
template <typename Done>
void run_until(uv_loop_t* loop, Done done, Duration max) {
  struct Deadline {
    uv_timer_t timer{};
    bool expired = false;
  };
  auto* d = new Deadline;
  uv_timer_init(loop, &d->timer);
  d->timer.data = d;
  uv_timer_start(&d->timer, [](uv_timer_t* t) { static_cast<Deadline*>(t->data)->expired = true; },
                 max.count() <= 0 ? 0 : static_cast<std::uint64_t>(max.count()), 0);
  while (!done() && !d->expired) uv_run(loop, UV_RUN_ONCE);
  uv_close(reinterpret_cast<uv_handle_t*>(&d->timer), [](uv_handle_t* h) { delete static_cast<Deadline*>(h->data); });
}

}  // namespace sluice::discovery
