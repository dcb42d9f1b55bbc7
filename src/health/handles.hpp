// Ownership of libuv handles for the health checks. Each handle lives in a
// small heap record that knows its tracker; the record is freed in the
// handle's close callback, never before, and the tracker tells its owner
// when the last of its handles has closed (so the owner may then be freed).
// Callbacks reach their owner through the record, never by guessing a
// handle's type.
#pragma once

#include <uv.h>

#include <cstddef>
#include <functional>
#include <utility>

namespace sluice::health {

class HandleTracker;

struct HandleRecord {
  HandleRecord() = default;
  HandleRecord(const HandleRecord&) = delete;
  HandleRecord& operator=(const HandleRecord&) = delete;
  virtual ~HandleRecord() = default;
  virtual uv_handle_t* handle() = 0;

  HandleTracker* tracker = nullptr;
  bool closing = false;
};

// One uv handle of type H and the object it works for.
template <class H, class Owner>
struct Handle : HandleRecord {
  explicit Handle(Owner* o) : owner(o) { uv.data = static_cast<HandleRecord*>(this); }  // uv_*_init keeps data
  uv_handle_t* handle() override { return reinterpret_cast<uv_handle_t*>(&uv); }
  // The record a callback's handle belongs to.
  static Handle* of(H* h) { return static_cast<Handle*>(static_cast<HandleRecord*>(h->data)); }

  H uv{};
  Owner* owner;
};

class HandleTracker {
 public:
  HandleTracker() = default;
  HandleTracker(const HandleTracker&) = delete;
  HandleTracker& operator=(const HandleTracker&) = delete;

  // Counts `rec`, whose handle the caller initialises next. A handle whose
  // init fails is given back with forget().
  template <class R>
  R* add(R* rec) {
    rec->tracker = this;
    ++open_;
    return rec;
  }
  void forget(HandleRecord* rec) {
    --open_;
    delete rec;
  }
  // Closes the record's handle (once; later calls do nothing). May be null.
  static void close(HandleRecord* rec) {
    if (rec == nullptr || rec->closing) return;
    rec->closing = true;
    uv_close(rec->handle(), &HandleTracker::on_closed);
  }
  // `done` runs once every counted handle has closed (at once if none is
  // open). It may destroy the tracker's owner.
  void when_all_closed(std::function<void()> done) {
    if (open_ == 0) {
      done();
      return;
    }
    all_closed_ = std::move(done);
  }
  std::size_t open() const { return open_; }

 private:
  static void on_closed(uv_handle_t* h) {
    auto* rec = static_cast<HandleRecord*>(h->data);
    HandleTracker* t = rec->tracker;
    delete rec;
    if (--t->open_ == 0 && t->all_closed_) {
      // Moved out first: the callback may free the tracker.
      auto done = std::move(t->all_closed_);
      t->all_closed_ = nullptr;
      done();
    }
  }

  std::size_t open_ = 0;
  std::function<void()> all_closed_;
};

}  // namespace sluice::health
