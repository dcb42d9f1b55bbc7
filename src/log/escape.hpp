// Escaping for values a peer controls (SNI, ALPN, anything read off the
// wire): a log record is one line, and nothing a client sends may end it
// early, add a field, or make the file invalid UTF-8.
#pragma once

#include <string>
#include <string_view>

namespace sluice {

// Text format (key=value, space separated). Printable ASCII and valid UTF-8
// sequences are kept as they are; a space, a backslash, a control byte, DEL
// and every byte of an invalid UTF-8 sequence become "\xHH" (a backslash is
// "\\"), so a value never contains a space or a line break.
void append_text_escaped(std::string& out, std::string_view value);

// A JSON string literal, quotes included. Control characters are escaped as
// JSON requires; bytes that are not valid UTF-8 are written as the six
// characters "\\xHH" (an escaped backslash, then xHH), so the output is
// always valid UTF-8 and the original bytes can still be told apart.
void append_json_string(std::string& out, std::string_view value);

// Length of the valid UTF-8 sequence at the start of `s` (1 to 4), or 0 when
// it starts with an invalid one (stray continuation byte, overlong form,
// surrogate, beyond U+10FFFF, truncated).
std::size_t utf8_sequence_length(std::string_view s);

}  // namespace sluice
