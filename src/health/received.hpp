// How many bytes the peer of a TCP socket has sent us so far (the kernel's
// count, read or not), for the checks whose client library reads the
// socket itself (hiredis, libpq): we cannot count their reads, but we can
// bound them.
#pragma once

#include <cstdint>
#include <optional>

namespace sluice::health {

// The bytes received on `fd` since it connected (TCP_INFO's
// tcpi_bytes_received), or nullopt when the kernel does not say.
std::optional<std::uint64_t> bytes_received(int fd);

}  // namespace sluice::health
