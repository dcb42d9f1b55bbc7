// Typed, positioned access to one TOML table while it is being validated.
// Every failure throws ConfigError as "FILE:LINE:COLUMN: CONTEXT: message",
// with the position of the node that is wrong.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <toml++/toml.h>

#include "sluice/config.hpp"

namespace sluice::config_detail {

// "FILE:LINE:COLUMN: CONTEXT: message" (CONTEXT omitted when empty).
[[noreturn]] void fail_at(const std::string& path, const toml::source_region& at, std::string_view context,
                          std::string_view message);

// A node's type and, for scalars, its value: `integer 3`, `string "x"`, `table`.
std::string describe(const toml::node& node);

// A key that is recognised but not implemented yet, with the note added to
// its "unknown key" message.
struct PlannedKey {
  std::string_view key;
  std::string_view note;
};

class TableReader {
 public:
  TableReader(const toml::table& table, std::string context, const std::string& path)
      : table_(table), context_(std::move(context)), path_(path) {}

  const toml::table& table() const { return table_; }
  const std::string& context() const { return context_; }

  // Throws for the earliest key in the file that is not in `allowed`.
  void reject_unknown_keys(std::initializer_list<std::string_view> allowed,
                           std::initializer_list<PlannedKey> planned = {}) const;
  void reject_unknown_keys(const std::vector<std::string_view>& allowed) const;

  // The key written first in the file that is not in `allowed`, or null.
  const toml::key* first_key_not_in(const std::vector<std::string_view>& allowed) const;

  const toml::node* get(std::string_view key) const;
  bool has(std::string_view key) const { return get(key) != nullptr; }

  [[noreturn]] void fail(const toml::node& at, std::string_view message) const;
  // At the key's own position (for keys that must not be there).
  [[noreturn]] void fail_key(std::string_view key, std::string_view message) const;
  // At the table's position (for what is missing from it).
  [[noreturn]] void fail_table(std::string_view message) const;
  // "KEY must be EXPECTED, got ACTUAL".
  [[noreturn]] void fail_type(std::string_view key, const toml::node& node, std::string_view expected) const;

  // Each getter returns nullopt when the key is absent and throws when the
  // value has the wrong type or is out of range.
  std::optional<std::int64_t> integer(std::string_view key, std::int64_t min, std::int64_t max) const;
  std::optional<double> number(std::string_view key) const;
  std::optional<bool> boolean(std::string_view key) const;
  std::optional<std::string> string(std::string_view key) const;
  std::optional<Duration> duration(std::string_view key, bool allow_zero) const;
  std::optional<Endpoint> address(std::string_view key, bool allow_port_zero) const;
  const toml::array* array(std::string_view key, std::string_view expected) const;
  // An array of CIDR strings; each bad or repeated entry is reported at its own position.
  std::optional<std::vector<Cidr>> cidrs(std::string_view key) const;
  // A path to a regular file that can be opened for reading now (relative
  // paths are relative to the working directory). Returns the path as written.
  std::optional<std::string> readable_file(std::string_view key) const;

  // A string checked by one of the values.hpp parsers; the parser's error is
  // reported as "KEY " + error at the value's position.
  template <typename T>
  std::optional<T> parsed(std::string_view key, std::string_view expected,
                          std::optional<T> (*parse)(std::string_view, std::string&)) const {
    const toml::node* node = get(key);
    if (node == nullptr) return std::nullopt;
    const auto* value = node->as_string();
    if (value == nullptr) fail_type(key, *node, expected);
    std::string error;
    auto out = parse(value->get(), error);
    if (!out) fail(*node, std::string(key) + " " + error);
    return out;
  }

  // One of a fixed set of strings, mapped to a value.
  template <typename T>
  std::optional<T> choice(std::string_view key, std::initializer_list<std::pair<std::string_view, T>> options) const {
    const auto text = string(key);
    if (!text) return std::nullopt;
    for (const auto& [name, value] : options) {
      if (*text == name) return value;
    }
    std::string allowed;
    for (const auto& option : options) {
      if (!allowed.empty()) allowed += '|';
      allowed += option.first;
    }
    fail(*get(key), std::string(key) + " must be one of " + allowed + ", got " + describe_string(*text));
  }

  // Throws "missing required key" at the table's position when absent.
  const toml::node& require(std::string_view key) const;

 private:
  static std::string describe_string(const std::string& text);

  const toml::table& table_;
  std::string context_;
  const std::string& path_;
};

// Whether a is written before b in the file.
bool before(const toml::source_position& a, const toml::source_position& b);

}  // namespace sluice::config_detail
