// TCP options sluice sets on its sockets. Listening sockets get the client
// leg's options once (accepted sockets inherit them on Linux); each server
// socket gets them after it is created.
#pragma once

#include "sluice/config.hpp"

namespace sluice {

// SO_KEEPALIVE with the listener's idle/interval/count (or off). Returns 0 or
// a libuv-style negative errno.
int set_keepalive(int fd, const ListenerConfig& listener);
// TCP_NODELAY on. Returns 0 or a libuv-style negative errno.
int set_nodelay(int fd);

}  // namespace sluice
