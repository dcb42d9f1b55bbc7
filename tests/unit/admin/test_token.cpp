// The admin token's comparison: right for every pair, and the same work
// whatever either token's length.
#include <doctest/doctest.h>

#include <string>

#include "admin/token.hpp"

using namespace sluice;
using namespace sluice::admin;

TEST_CASE("a token matches itself and nothing else") {
  const std::string secret = "s3cret-Tok3n";
  const Token t(secret);
  CHECK_FALSE(t.empty());
  CHECK(t.matches(secret));
  const std::string nul_after = secret + std::string(1, '\0');
  for (const std::string& other :
       {std::string(), std::string("s3cret-Tok3"), secret + "x", std::string("S3cret-Tok3n"), nul_after,
        std::string(secret.size(), '\0'), std::string("x") + secret.substr(1), std::string(kMaxAdminTokenBytes, 's'),
        secret + std::string(kMaxAdminTokenBytes, 'x')}) {
    CAPTURE(other.size());
    CHECK_FALSE(t.matches(other));
  }
  // No token configured: nothing matches, not even an empty one.
  CHECK_FALSE(Token().matches(""));
  CHECK(Token().empty());
  // A token at the cap.
  const std::string longest(kMaxAdminTokenBytes, 'z');
  CHECK(Token(longest).matches(longest));
  CHECK_FALSE(Token(longest).matches(longest.substr(1)));
  CHECK_FALSE(Token(longest).matches(longest + "z"));
}

TEST_CASE("every comparison compares the same number of bytes, whatever the lengths") {
  // Work that grew with either token's length would tell a client the
  // token's length; work that stopped at a difference, its prefix.
  for (const std::string& secret : {std::string("a"), std::string(32, 'k'), std::string(kMaxAdminTokenBytes, 'q')}) {
    const Token t(secret);
    for (const std::string& presented : {std::string(), std::string("b"), secret, std::string(1000, 'k'),
                                         std::string(kMaxAdminTokenBytes * 2, 'q')}) {
      std::size_t compared = 0;
      t.matches(presented, &compared);
      CAPTURE(secret.size());
      CAPTURE(presented.size());
      CHECK(compared == kMaxAdminTokenBytes);
    }
  }
}
