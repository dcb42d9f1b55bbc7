// The admin API's token, compared in time that tells nothing about it. A
// comparison that stops at the first differing byte tells a client, by how
// long the answer takes, how much of its guess was right; one that loops
// over either token's length tells the token's length. Here every
// comparison reads kMaxAdminTokenBytes bytes of each side, the presented
// token zero-padded (or cut) to that size and the lengths folded into the
// result, so its time depends on neither token's length nor content.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

#include "sluice/config.hpp"

namespace sluice::admin {

class Token {
 public:
  Token() = default;
  // `token` has at most kMaxAdminTokenBytes bytes (the configuration checks).
  explicit Token(std::string_view token);

  bool empty() const { return size_ == 0; }

  // Whether `presented` is the token. `compared`, when given, is set to the
  // number of byte pairs compared: kMaxAdminTokenBytes, always.
  bool matches(std::string_view presented, std::size_t* compared = nullptr) const;

 private:
  std::array<unsigned char, kMaxAdminTokenBytes> bytes_{};
  std::size_t size_ = 0;
};

}  // namespace sluice::admin
