#include "proxy/buffer_pool.hpp"

#include <cstddef>

namespace sluice {

Buffer* Buffer::from_data(char* p) {
  return reinterpret_cast<Buffer*>(p - offsetof(Buffer, data));
}

BufferPool::~BufferPool() {
  for (Buffer* b : free_) delete b;
  while (free_requests_ != nullptr) {
    Request* r = free_requests_;
    free_requests_ = r->next_free;
    delete r;
  }
}

Request* BufferPool::get_request() {
  if (free_requests_ == nullptr) return new Request{};
  Request* r = free_requests_;
  free_requests_ = r->next_free;
  --cached_requests_;
  return r;
}

void BufferPool::put_request(Request* r) {
  if (cached_requests_ >= max_cached_) {
    delete r;
    return;
  }
  r->next_free = free_requests_;
  free_requests_ = r;
  ++cached_requests_;
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
