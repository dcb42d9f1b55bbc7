#include <doctest/doctest.h>

#include <string>

#include "log/escape.hpp"

using sluice::append_json_string;
using sluice::append_text_escaped;
using sluice::utf8_sequence_length;

namespace {
std::string text(std::string_view v) {
  std::string out;
  append_text_escaped(out, v);
  return out;
}
std::string json(std::string_view v) {
  std::string out;
  append_json_string(out, v);
  return out;
}
}  // namespace

TEST_CASE("text escaping keeps ordinary values as they are") {
  CHECK(text("db.example.com") == "db.example.com");
  CHECK(text("h2,http/1.1") == "h2,http/1.1");
  CHECK(text("caf\xc3\xa9") == "caf\xc3\xa9");          // é
  CHECK(text("\xe2\x82\xac") == "\xe2\x82\xac");        // €
  CHECK(text("\xf0\x9f\x98\x80") == "\xf0\x9f\x98\x80");  // emoji
}

TEST_CASE("text escaping cannot end a record or add a field") {
  CHECK(text("h2\ncause=ok") == "h2\\x0acause=ok");
  CHECK(text("a b") == "a\\x20b");
  CHECK(text("a\rb") == "a\\x0db");
  CHECK(text("a\tb") == "a\\x09b");
  CHECK(text(std::string_view("a\0b", 3)) == "a\\x00b");
  CHECK(text("\x7f") == "\\x7f");
  CHECK(text("back\\slash") == "back\\\\slash");
  // A forged "\x0a" written by the peer is told apart from a real newline.
  CHECK(text("\\x0a") == "\\\\x0a");
}

TEST_CASE("text escaping hex-escapes every byte of invalid UTF-8") {
  CHECK(text("\x80") == "\\x80");                 // stray continuation
  CHECK(text("\xc3") == "\\xc3");                 // truncated
  CHECK(text("\xc0\xaf") == "\\xc0\\xaf");        // overlong '/'
  CHECK(text("\xed\xa0\x80") == "\\xed\\xa0\\x80");  // surrogate
  CHECK(text("\xf4\x90\x80\x80") == "\\xf4\\x90\\x80\\x80");  // > U+10FFFF
  CHECK(text("\xff") == "\\xff");
  CHECK(text("ok\xe2\x82") == "ok\\xe2\\x82");
}

TEST_CASE("Unicode line and space separators are escaped too") {
  CHECK(text("a\xc2\x85" "b") == "a\\xc2\\x85" "b");        // NEL
  CHECK(text("a\xe2\x80\xa8" "b") == "a\\xe2\\x80\\xa8" "b");  // LINE SEPARATOR
  CHECK(text("a\xc2\xa0" "b") == "a\\xc2\\xa0" "b");        // NO-BREAK SPACE
  CHECK(json("a\xe2\x80\xa8" "b") == "\"a\\u2028b\"");
  CHECK(json("a\xc2\x85" "b") == "\"a\\u0085b\"");
}

TEST_CASE("JSON strings are valid JSON and valid UTF-8 whatever the input") {
  CHECK(json("plain") == "\"plain\"");
  CHECK(json("q\"b\\") == "\"q\\\"b\\\\\"");
  CHECK(json("a\nb") == "\"a\\nb\"");
  CHECK(json(std::string_view("\0\x01\x1f\x7f", 4)) == "\"\\u0000\\u0001\\u001f\\u007f\"");
  CHECK(json("caf\xc3\xa9") == "\"caf\xc3\xa9\"");
  CHECK(json("\xff\xc3") == "\"\\\\xff\\\\xc3\"");
}

TEST_CASE("utf8_sequence_length") {
  CHECK(utf8_sequence_length("a") == 1);
  CHECK(utf8_sequence_length("\xc3\xa9") == 2);
  CHECK(utf8_sequence_length("\xe2\x82\xac") == 3);
  CHECK(utf8_sequence_length("\xf0\x9f\x98\x80") == 4);
  CHECK(utf8_sequence_length("\xe0\x80\x80") == 0);  // overlong
  CHECK(utf8_sequence_length("") == 0);
}
