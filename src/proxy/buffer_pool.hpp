// Per-worker pool of fixed-size I/O buffers. A buffer carries its own
// uv_write_t so a queued write needs no second allocation. Idle sessions hold
// no buffer: one is taken just before a read and returned as soon as its bytes
// are written. The same pool lends the other libuv requests (connect,
// shutdown, a preread's replay) for as long as they are in flight.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <uv.h>

namespace sluice {

struct Pump;

struct Buffer {
  static constexpr std::size_t kSize = 32 * 1024;
  uv_write_t req;      // used while the buffer's bytes sit in a write queue
  Pump* pump = nullptr;
  std::uint32_t queued = 0;  // bytes handed to uv_write (counted as delivered when it completes)
  char data[kSize];

  static Buffer* from_data(char* p);
};

// A libuv request, borrowed from the pool only while it is in flight, so
// that an idle session carries none of them.
union Request {
  uv_connect_t connect;
  uv_shutdown_t shutdown;
  uv_write_t write;
  Request* next_free;
};

class BufferPool {
 public:
  explicit BufferPool(std::size_t max_cached = 1024) : max_cached_(max_cached) {}
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  Buffer* get();
  void put(Buffer* b);

  Request* get_request();
  void put_request(Request* r);
  // The same, typed: `borrow<uv_write_t>()`, `give_back(req)`.
  template <class Req>
  Req* borrow() {
    return reinterpret_cast<Req*>(get_request());  // every member sits at the union's address
  }
  void give_back(void* req) { put_request(static_cast<Request*>(req)); }

  std::size_t in_use() const { return in_use_; }
  std::size_t cached() const { return free_.size(); }

 private:
  std::size_t max_cached_;
  std::size_t in_use_ = 0;
  std::vector<Buffer*> free_;
  Request* free_requests_ = nullptr;  // a free list through next_free
  std::size_t cached_requests_ = 0;
};

}  // namespace sluice
