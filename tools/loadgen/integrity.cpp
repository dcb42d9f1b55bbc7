#include "integrity.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

namespace loadgen::integrity {

namespace {

constexpr char kHeaderMagic[8] = {'S', 'L', 'U', 'I', 'C', 'E', 'I', 'T'};
constexpr char kTrailerMagic[8] = {'S', 'L', 'U', 'I', 'C', 'E', 'O', 'K'};
constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

std::uint64_t word_at(std::uint64_t seed, std::uint64_t k) { return mix64(seed + (k + 1) * kGolden); }

void put64(char* out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(v >> (8 * i));
}

std::uint64_t get64(const char* in) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}

// A check word over the fields, so a header or trailer that is shifted,
// spliced from two sessions or bit-flipped is refused.
std::uint64_t check_of(const std::uint64_t* fields, int count) {
  std::uint64_t h = 0x51c3;
  for (int i = 0; i < count; ++i) h = mix64(h ^ fields[i]);
  return h;
}

}  // namespace

std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void stream_fill(std::uint64_t seed, std::uint64_t offset, char* out, std::size_t n) {
  std::size_t i = 0;
  // Up to the next word boundary, byte by byte.
  while (i < n && (offset + i) % 8 != 0) {
    const std::uint64_t p = offset + i;
    out[i++] = static_cast<char>(word_at(seed, p / 8) >> (8 * (p % 8)));
  }
  std::uint64_t k = (offset + i) / 8;
  for (; i + 8 <= n; i += 8, ++k) {
    const std::uint64_t w = word_at(seed, k);
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(out + i, &w, 8);
    } else {
      put64(out + i, w);
    }
  }
  for (; i < n; ++i) {
    const std::uint64_t p = offset + i;
    out[i] = static_cast<char>(word_at(seed, p / 8) >> (8 * (p % 8)));
  }
}

std::size_t stream_mismatch(std::uint64_t seed, std::uint64_t offset, const char* data, std::size_t n) {
  char expected[16 * 1024];
  std::size_t done = 0;
  while (done < n) {
    const std::size_t chunk = std::min(n - done, sizeof expected);
    stream_fill(seed, offset + done, expected, chunk);
    if (std::memcmp(expected, data + done, chunk) != 0) {
      for (std::size_t j = 0; j < chunk; ++j) {
        if (expected[j] != data[done + j]) return done + j;
      }
    }
    done += chunk;
  }
  return n;
}

void encode_header(const Header& h, char* out) {
  const std::uint64_t fields[] = {h.session, h.seed, h.up, h.down};
  std::memcpy(out, kHeaderMagic, 8);
  for (int i = 0; i < 4; ++i) put64(out + 8 + 8 * i, fields[i]);
  put64(out + 40, check_of(fields, 4));
}

bool decode_header(const char* in, Header& out) {
  if (std::memcmp(in, kHeaderMagic, 8) != 0) return false;
  const std::uint64_t fields[] = {get64(in + 8), get64(in + 16), get64(in + 24), get64(in + 32)};
  if (get64(in + 40) != check_of(fields, 4)) return false;
  out = Header{fields[0], fields[1], fields[2], fields[3]};
  return true;
}

void encode_trailer(const Trailer& t, char* out) {
  const std::uint64_t fields[] = {t.session, t.up_verified};
  std::memcpy(out, kTrailerMagic, 8);
  put64(out + 8, fields[0]);
  put64(out + 16, fields[1]);
  put64(out + 24, check_of(fields, 2));
}

bool decode_trailer(const char* in, Trailer& out) {
  if (std::memcmp(in, kTrailerMagic, 8) != 0) return false;
  const std::uint64_t fields[] = {get64(in + 8), get64(in + 16)};
  if (get64(in + 24) != check_of(fields, 2)) return false;
  out = Trailer{fields[0], fields[1]};
  return true;
}

}  // namespace loadgen::integrity
