// The integrity protocol spoken by `loadgen integrity` (client) and
// `loadgen serve --mode integrity` (backend), so that every byte crossing the
// proxy is checked and no early end can pass for a complete session:
//
//   client -> backend: a 48-byte header (magic, session id, seed, the number
//                      of bytes each way, a check word), then `up` bytes of
//                      the session's upload stream, then FIN;
//   backend -> client: `down` bytes of the session's download stream, then a
//                      32-byte trailer (magic, session id, upload bytes the
//                      backend verified, a check word), then FIN.
//
// Both streams are counter-mode pseudo-random bytes derived from the seed, so
// either side can check any byte at any offset without keeping a copy. A
// session is complete for the client only with exactly `down` verified bytes,
// a trailer confirming all `up` bytes, and then a clean EOF; a FIN anywhere
// earlier is a truncation the client sees, not a success.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loadgen {
class Poller;
}

namespace loadgen::integrity {

inline constexpr std::size_t kHeaderSize = 48;
inline constexpr std::size_t kTrailerSize = 32;
// The download stream's seed is the session seed xor this.
inline constexpr std::uint64_t kDownSalt = 0xd1b54a32d192ed03ULL;

struct Header {
  std::uint64_t session = 0;
  std::uint64_t seed = 0;
  std::uint64_t up = 0;    // bytes the client sends after the header
  std::uint64_t down = 0;  // bytes the backend sends before the trailer
};

struct Trailer {
  std::uint64_t session = 0;
  std::uint64_t up_verified = 0;
};

// splitmix64's output function: a bijection that spreads every input bit.
std::uint64_t mix64(std::uint64_t z);

// Writes bytes [offset, offset + n) of the stream of `seed` to `out`.
void stream_fill(std::uint64_t seed, std::uint64_t offset, char* out, std::size_t n);
// The index in [0, n) of the first byte of `data` that differs from bytes
// [offset, offset + n) of the stream of `seed`; n when all match.
std::size_t stream_mismatch(std::uint64_t seed, std::uint64_t offset, const char* data, std::size_t n);

void encode_header(const Header& h, char* out);
// False when the magic or the check word is wrong.
bool decode_header(const char* in, Header& out);
void encode_trailer(const Trailer& t, char* out);
bool decode_trailer(const char* in, Trailer& out);

// The backend side (`loadgen serve --mode integrity`, integrity_serve.cpp):
// takes over an accepted, non-blocking socket. It prints one line per
// session to stdout: "done SESSION" just before it sends the trailer, or
// "corrupt SESSION OFFSET", "short SESSION GOT WANT", "extra SESSION",
// "bad_header" when the upload is wrong, and then resets the connection. Its
// sockets have SO_LINGER 0 until the trailer is sent, so a backend killed
// mid-session resets its connections instead of ending them with FIN.
void serve_connection(Poller& poller, int fd);
// SO_LINGER 0 (a close resets) or off (a close sends a FIN).
void set_linger(int fd, bool reset_on_close);

}  // namespace loadgen::integrity
