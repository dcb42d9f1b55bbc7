#include "admin/token.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace sluice::admin {

Token::Token(std::string_view token) : size_(std::min(token.size(), kMaxAdminTokenBytes)) {
  std::memcpy(bytes_.data(), token.data(), size_);
}

bool Token::matches(std::string_view presented, std::size_t* compared) const {
  // Copying the presented bytes takes time in their length only, which the
  // client chose and knows.
  std::array<unsigned char, kMaxAdminTokenBytes> in{};
  std::memcpy(in.data(), presented.data(), std::min(presented.size(), kMaxAdminTokenBytes));
  // Every byte pair, whatever differs where: no early exit, no branch on a byte.
  unsigned diff = 0;
  std::size_t i = 0;
  for (; i < in.size(); ++i) diff |= static_cast<unsigned>(in[i] ^ bytes_[i]);
  // A longer or shorter token differs even when the padded bytes agree
  // ("abc" and "abc\0"; anything past the cap).
  std::uint64_t lengths = static_cast<std::uint64_t>(presented.size()) ^ static_cast<std::uint64_t>(size_);
  for (int b = 0; b < 8; ++b, lengths >>= 8) diff |= static_cast<unsigned>(lengths & 0xFFU);
  if (compared != nullptr) *compared = i;
  // An empty token (none configured) matches nothing.
  return diff == 0 && size_ != 0;
}

}  // namespace sluice::admin
