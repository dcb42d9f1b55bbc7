#include "proxy/buffer_pool.hpp"

namespace sluice {

BufferPool::~BufferPool() {
  for (Buffer* b : free_) delete b;
}

Buffer* BufferPool::get() {
  ++in_use_;
  Buffer* b;
  if (free_.empty()) {
    b = new Buffer;
  } else {
    b = free_.back();
    free_.pop_back();
  }
  b->next = nullptr;
  b->begin = b->end = 0;
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
