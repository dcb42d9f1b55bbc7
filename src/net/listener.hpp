// Listening sockets. Each worker gets its own socket per listener, bound with
// SO_REUSEPORT so the kernel spreads new connections across workers (made
// here; each worker watches its own in its Reactor and accepts for itself).
// Port 0 is resolved once: every worker binds the port the
// first socket got. The client leg's TCP options (TCP_NODELAY, keepalive) are
// set on the listening sockets; accepted sockets inherit them.
#pragma once

#include <string>
#include <vector>

#include "sluice/config.hpp"

namespace sluice {

struct ListeningSockets {
  std::vector<int> fds;  // one per worker
  std::string bound;     // the address actually bound, e.g. "127.0.0.1:40123"
};

// Throws std::runtime_error (with the address and the system's reason). An
// address some other process already listens on is refused, even when that
// process used SO_REUSEPORT too: two instances silently sharing a port would
// split its connections between two configurations.
ListeningSockets open_listening_sockets(const ListenerConfig& listener, unsigned count);

// A binary upgrade: the listening sockets `fds` of `listener` came from the
// process that served before. When they are fewer than `count`, more are
// bound beside them (SO_REUSEPORT, same address); `bound` is the address
// they listen on. Throws std::runtime_error like open_listening_sockets
// (after closing every socket it was given or opened).
ListeningSockets adopt_listening_sockets(const ListenerConfig& listener, std::vector<int> fds, unsigned count);

}  // namespace sluice
