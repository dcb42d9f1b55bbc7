// Test helper: the bytes of a string, as the parsers take them.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace sluice::test {

inline std::vector<std::uint8_t> bytes(std::string_view s) { return {s.begin(), s.end()}; }

}  // namespace sluice::test
