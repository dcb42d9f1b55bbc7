// libuv's handles as the base type its close and ref calls take.
#pragma once

#include <uv.h>

namespace sluice {

inline uv_handle_t* as_handle(void* h) { return static_cast<uv_handle_t*>(h); }

}  // namespace sluice
