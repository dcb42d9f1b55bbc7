// Shared by the config loader's tests: the loader's message for a text, and
// table-driven checks of many (text, message) pairs.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "sluice/config.hpp"

namespace config_test {

inline std::string error_of(const std::string& text) {
  try {
    sluice::parse_config(text, "x.toml");
  } catch (const sluice::ConfigError& e) {
    return e.what();
  }
  return "no error";
}

// Valid remainders appended after a snippet, so that only the snippet is wrong
// and its line numbers are the ones in the file.
inline const std::string kUpstreamU = "\n[upstream.u]\nservers = [{ address = \"127.0.0.1:9001\" }]\n";
inline const std::string kListenerL = "\n[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:0\"\nupstream = \"u\"\n";
inline const std::string kTail = kListenerL + kUpstreamU;

// First lines of a valid listener "l" (lines 1-4) and of a TLS listener "t" (lines 1-4).
inline const std::string kL = "[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:0\"\nupstream = \"u\"\n";
inline const std::string kT = "[[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:0\"\npreread = \"tls\"\n";

struct Case {
  std::string toml;
  std::string error;
};

inline void check_cases(const std::vector<Case>& cases) {
  for (const auto& c : cases) {
    CAPTURE(c.toml);
    CHECK(error_of(c.toml) == c.error);
  }
}

// A file in a fresh temporary directory, removed with the object.
class TempFile {
 public:
  explicit TempFile(const std::string& content, const std::string& name = "file") {
    char dir[] = "/tmp/sluice-config-test-XXXXXX";
    REQUIRE(::mkdtemp(dir) != nullptr);
    dir_ = dir;
    path_ = dir_ + "/" + name;
    std::FILE* f = std::fopen(path_.c_str(), "wb");
    REQUIRE(f != nullptr);
    std::fwrite(content.data(), 1, content.size(), f);
    std::fclose(f);
  }
  ~TempFile() {
    std::remove(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
};

}  // namespace config_test
