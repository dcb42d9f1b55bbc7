#include "config/table_reader.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <limits>
#include <memory>
#include <system_error>

#include "config/quote.hpp"
#include "config/values.hpp"

namespace sluice::config_detail {

bool before(const toml::source_position& a, const toml::source_position& b) {
  return a.line < b.line || (a.line == b.line && a.column < b.column);
}

namespace {

std::string format_float(double value) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  if (ec != std::errc{}) return "?";
  std::string out(buf, end);
  if (out.find_first_of(".eEni") == std::string::npos) out += ".0";  // keep it looking like a float
  return out;
}

}  // namespace

void fail_at(const std::string& path, const toml::source_region& at, std::string_view context,
             std::string_view message) {
  std::string text = path;
  text += ':';
  text += std::to_string(at.begin.line);
  text += ':';
  text += std::to_string(at.begin.column);
  text += ": ";
  if (!context.empty()) {
    text += context;
    text += ": ";
  }
  text += message;
  throw ConfigError(text);
}

std::string describe(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "string " + quote(node.as_string()->get());
    case toml::node_type::integer:
      return "integer " + std::to_string(node.as_integer()->get());
    case toml::node_type::floating_point:
      return "float " + format_float(node.as_floating_point()->get());
    case toml::node_type::boolean:
      return node.as_boolean()->get() ? "boolean true" : "boolean false";
    case toml::node_type::table:
      return "table";
    case toml::node_type::array:
      return "array";
    case toml::node_type::date:
      return "date";
    case toml::node_type::time:
      return "time";
    case toml::node_type::date_time:
      return "date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

namespace {

std::string unknown_key_message(const toml::key& key, std::string_view note,
                                const std::vector<std::string_view>& allowed) {
  std::string message = "unknown key " + quote(key.str());
  if (!note.empty()) {
    message += " (";
    message += note;
    message += ')';
  }
  message += "; allowed: ";
  bool comma = false;
  for (const auto& name : allowed) {
    if (comma) message += ", ";
    message += name;
    comma = true;
  }
  return message;
}

}  // namespace

const toml::key* TableReader::first_key_not_in(const std::vector<std::string_view>& allowed) const {
  const toml::key* first = nullptr;
  for (const auto& [key, value] : table_) {
    if (std::find(allowed.begin(), allowed.end(), key.str()) != allowed.end()) continue;
    if (first == nullptr || before(key.source().begin, first->source().begin)) first = &key;
  }
  return first;
}

void TableReader::reject_unknown_keys(std::initializer_list<std::string_view> allowed,
                                      std::initializer_list<PlannedKey> planned) const {
  const std::vector<std::string_view> names(allowed);
  const toml::key* first = first_key_not_in(names);
  if (first == nullptr) return;
  std::string_view note;
  for (const auto& p : planned) {
    if (p.key == first->str()) note = p.note;
  }
  fail_at(path_, first->source(), context_, unknown_key_message(*first, note, names));
}

void TableReader::reject_unknown_keys(const std::vector<std::string_view>& allowed) const {
  const toml::key* first = first_key_not_in(allowed);
  if (first != nullptr) fail_at(path_, first->source(), context_, unknown_key_message(*first, {}, allowed));
}

const toml::node* TableReader::get(std::string_view key) const { return table_.get(key); }

void TableReader::fail(const toml::node& at, std::string_view message) const {
  fail_at(path_, at.source(), context_, message);
}

void TableReader::fail_key(std::string_view key, std::string_view message) const {
  const auto it = table_.find(key);
  if (it == table_.end()) fail_table(message);
  fail_at(path_, it->first.source(), context_, message);
}

void TableReader::fail_table(std::string_view message) const { fail_at(path_, table_.source(), context_, message); }

void TableReader::fail_type(std::string_view key, const toml::node& node, std::string_view expected) const {
  fail(node, std::string(key) + " must be " + std::string(expected) + ", got " + describe(node));
}

const toml::node& TableReader::require(std::string_view key) const {
  const toml::node* node = get(key);
  if (node == nullptr) fail_table("missing required key " + quote(key));
  return *node;
}

std::optional<std::int64_t> TableReader::integer(std::string_view key, std::int64_t min, std::int64_t max) const {
  const toml::node* node = get(key);
  if (node == nullptr) return std::nullopt;
  const auto* value = node->as_integer();
  if (value == nullptr) fail_type(key, *node, "an integer");
  const std::int64_t v = value->get();
  if (v < min || v > max) {
    const std::string range = max == std::numeric_limits<std::int64_t>::max()
                                  ? "at least " + std::to_string(min)
                                  : std::to_string(min) + ".." + std::to_string(max);
    fail(*node, std::string(key) + " must be " + range + ", got " + std::to_string(v));
  }
  return v;
}

std::optional<double> TableReader::number(std::string_view key) const {
  const toml::node* node = get(key);
  if (node == nullptr) return std::nullopt;
  if (const auto* f = node->as_floating_point()) return f->get();
  if (const auto* i = node->as_integer()) return static_cast<double>(i->get());
  fail_type(key, *node, "a number");
}

std::optional<bool> TableReader::boolean(std::string_view key) const {
  const toml::node* node = get(key);
  if (node == nullptr) return std::nullopt;
  const auto* value = node->as_boolean();
  if (value == nullptr) fail_type(key, *node, "a boolean (true or false)");
  return value->get();
}

std::optional<std::string> TableReader::string(std::string_view key) const {
  const toml::node* node = get(key);
  if (node == nullptr) return std::nullopt;
  const auto* value = node->as_string();
  if (value == nullptr) fail_type(key, *node, "a string");
  return value->get();
}

std::optional<Duration> TableReader::duration(std::string_view key, bool allow_zero) const {
  const toml::node* node = get(key);
  if (node == nullptr) return std::nullopt;
  const auto* value = node->as_string();
  if (value == nullptr) fail_type(key, *node, "a duration string like \"3s\"");
  std::string error;
  const auto parsed = parse_duration(value->get(), error);
  if (!parsed) fail(*node, std::string(key) + " " + error);
  if (!allow_zero && parsed->count() == 0) {
    fail(*node, std::string(key) + " must be greater than 0, got " + quote(value->get()));
  }
  return parsed;
}

std::optional<Endpoint> TableReader::address(std::string_view key, bool allow_port_zero) const {
  const toml::node* node = get(key);
  if (node == nullptr) return std::nullopt;
  const auto* value = node->as_string();
  if (value == nullptr) fail_type(key, *node, "an address string like \"127.0.0.1:5432\"");
  std::string error;
  auto parsed = parse_address(value->get(), allow_port_zero, error);
  if (!parsed) fail(*node, std::string(key) + " " + error);
  return parsed;
}

const toml::array* TableReader::array(std::string_view key, std::string_view expected) const {
  const toml::node* node = get(key);
  if (node == nullptr) return nullptr;
  const auto* value = node->as_array();
  if (value == nullptr) fail_type(key, *node, expected);
  return value;
}

std::optional<std::vector<Cidr>> TableReader::cidrs(std::string_view key) const {
  const toml::array* list = array(key, "an array of networks like [\"10.0.0.0/8\", \"::1\"]");
  if (list == nullptr) return std::nullopt;
  std::vector<Cidr> out;
  for (std::size_t i = 0; i < list->size(); ++i) {
    const toml::node& node = (*list)[i];
    const std::string entry = std::string(key) + " entry " + std::to_string(i + 1);
    const auto* text = node.as_string();
    if (text == nullptr) fail_type(entry, node, "a network string like \"10.0.0.0/8\"");
    std::string error;
    auto cidr = parse_cidr(text->get(), error);
    if (!cidr) fail(node, entry + " " + error);
    for (std::size_t j = 0; j < out.size(); ++j) {
      if (out[j].family == cidr->family && out[j].prefix == cidr->prefix && out[j].addr == cidr->addr) {
        fail(node, entry + " " + quote(cidr->text) + " is the same network as entry " + std::to_string(j + 1));
      }
    }
    out.push_back(std::move(*cidr));
  }
  return out;
}

std::optional<std::string> TableReader::readable_file(std::string_view key) const {
  auto path = string(key);
  if (!path) return std::nullopt;
  const toml::node& node = *get(key);
  if (path->empty()) fail(node, std::string(key) + " must be a file path, got \"\"");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path->c_str(), "rb"), &std::fclose);
  if (!file) {
    fail(node, std::string(key) + " " + quote(*path) + " cannot be read: " + std::generic_category().message(errno));
  }
  struct stat st {};
  if (::fstat(::fileno(file.get()), &st) != 0 || !S_ISREG(st.st_mode)) {
    fail(node, std::string(key) + " " + quote(*path) + " is not a regular file");
  }
  return path;
}

std::string TableReader::describe_string(const std::string& text) { return quote(text); }

}  // namespace sluice::config_detail
