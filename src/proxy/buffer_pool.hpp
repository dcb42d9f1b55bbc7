// Per-worker pool of fixed-size I/O buffers. Idle sessions hold no buffer:
// one is taken just before a read and returned as soon as its bytes are
// written. A buffer the destination could not take at once waits in its
// pump's write queue, linked through `next`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sluice {

struct Buffer {
  static constexpr std::size_t kSize = 32 * 1024;
  Buffer* next = nullptr;    // in a pump's write queue
  std::uint32_t begin = 0;   // unwritten bytes are data[begin, end)
  std::uint32_t end = 0;
  char data[kSize];

  std::uint32_t size() const { return end - begin; }
};

class BufferPool {
 public:
  explicit BufferPool(std::size_t max_cached = 1024) : max_cached_(max_cached) {}
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  Buffer* get();
  void put(Buffer* b);

  std::size_t in_use() const { return in_use_; }
  std::size_t cached() const { return free_.size(); }

 private:
  std::size_t max_cached_;
  std::size_t in_use_ = 0;
  std::vector<Buffer*> free_;
};

}  // namespace sluice
