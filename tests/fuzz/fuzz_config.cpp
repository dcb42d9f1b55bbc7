// libFuzzer target: the TOML loader and the whole validator. Any input must
// either give a Config or a ConfigError with a position; nothing else may
// escape (no other exception, no crash, no sanitizer report, no hang).
//
// Host names in addresses are resolved only when numeric here: the
// validator calls getaddrinfo(), and a fuzzer must not wait on DNS.
#include <dlfcn.h>
#include <netdb.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "sluice/config.hpp"

extern "C" int getaddrinfo(const char* node, const char* service, const addrinfo* hints, addrinfo** res) {
  using Fn = int (*)(const char*, const char*, const addrinfo*, addrinfo**);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "getaddrinfo"));
  addrinfo numeric{};
  if (hints != nullptr) numeric = *hints;
  numeric.ai_flags |= AI_NUMERICHOST;
  return real(node, service, &numeric, res);
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const sluice::Config config = sluice::parse_config(text, "fuzz.toml");
    (void)config;
  } catch (const sluice::ConfigError& e) {
    // Every error names the file first, as the docs promise.
    if (std::string_view(e.what()).substr(0, 10) != "fuzz.toml:") std::abort();
  }
  return 0;
}
