// Errors by origin. A connect that fails because sluice itself ran out of
// something (file descriptors, ephemeral ports, kernel buffers, memory) says
// nothing about the server: it must never count against the server's
// health, whether the data path or an active check saw it. The data path
// ends the session with its own cause (local_resource).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string_view>

#include <uv.h>

namespace sluice {

// The errno values of sluice's own lack of resources.
inline constexpr int kLocalResourceErrnos[] = {EMFILE, ENFILE, EADDRNOTAVAIL, ENOBUFS, ENOMEM};

// `uv_err`: a libuv error code.
inline bool is_local_resource_error(int uv_err) {
  for (int e : kLocalResourceErrnos) {
    if (uv_err == uv_translate_sys_error(e)) return true;
  }
  return false;
}

// For libraries that report a failed socket()/connect() only as text
// (libpq, hiredis): whether `message` is one of those errors' strerror()
// text, alone or after "could not create socket: " (libpq) or "Can't create
// socket: " (hiredis). ASCII case is ignored (callers may lower the first
// letter). A message from the server never matches: it is never just an
// errno text.
inline bool names_local_resource_error(std::string_view message) {
  const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  const auto same = [&](std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (lower(a[i]) != lower(b[i])) return false;
    }
    return true;
  };
  for (std::string_view prefix : {"could not create socket: ", "can't create socket: "}) {
    if (message.size() > prefix.size() && same(message.substr(0, prefix.size()), prefix)) {
      message.remove_prefix(prefix.size());
      break;
    }
  }
  for (int e : kLocalResourceErrnos) {
    if (same(message, std::strerror(e))) return true;
  }
  return false;
}

}  // namespace sluice
