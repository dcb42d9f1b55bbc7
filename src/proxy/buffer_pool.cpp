#include "proxy/buffer_pool.hpp"

#include <cstddef>

namespace sluice {

Buffer* Buffer::from_data(char* p) {
  return reinterpret_cast<Buffer*>(p - offsetof(Buffer, data));
}

BufferPool::~BufferPool() {
  for (Buffer* b : free_) delete b;
}

Buffer* BufferPool::get() {
  ++in_use_;
  if (free_.empty()) return new Buffer;
  Buffer* b = free_.back();
  free_.pop_back();
  return b;
}

void BufferPool::put(Buffer* b) {
  --in_use_;
  if (free_.size() < max_cached_) {
    free_.push_back(b);
  } else {
    delete b;
  }
}

}  // namespace sluice
