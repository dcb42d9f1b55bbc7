// Errors by origin. A connect that fails because sluice itself ran out of
// something (file descriptors, ephemeral ports, kernel buffers, memory) says
// nothing about the server: it must never count against the server's health,
// and it ends the session with its own cause (local_resource).
#pragma once

#include <uv.h>

#include "log/rate_limited_warning.hpp"

namespace sluice {

inline bool is_local_resource_error(int uv_err) {
  return uv_err == UV_EMFILE || uv_err == UV_ENFILE || uv_err == UV_EADDRNOTAVAIL || uv_err == UV_ENOBUFS ||
         uv_err == UV_ENOMEM;
}

}  // namespace sluice
