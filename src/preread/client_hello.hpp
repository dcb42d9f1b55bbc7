// Incremental TLS ClientHello parser: pure, no I/O, no logging, no timers.
// Fed bytes as they arrive; keeps its state between calls; answers
// NeedMore | Done | NotTls | Malformed. Handles a hello split across TCP
// segments and across several TLS handshake records. Caps its input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace sluice::preread {

// The first byte of a TLS handshake record (content type 22), which is how
// a ClientHello, and a client starting TLS where another protocol was
// expected, announces itself.
inline constexpr std::uint8_t kTlsHandshake = 0x16;

enum class Status { need_more, done, not_tls, malformed };

struct ClientHelloInfo {
  bool has_sni = false;
  std::string sni;                 // host_name as sent (not lower-cased)
  std::vector<std::string> alpn;   // protocol names in client order
  std::uint16_t record_version = 0;  // first record's legacy version (0x0301..0x0304)
  std::uint16_t client_version = 0;  // ClientHello.legacy_version
};

class ClientHelloParser {
 public:
  explicit ClientHelloParser(std::size_t max_bytes = 16384);

  // Appends `data` and advances. Once a final status (done / not_tls /
  // malformed) is returned, further calls return it again and ignore data.
  // More than max_bytes without a complete hello -> malformed.
  Status feed(std::span<const std::uint8_t> data);

  Status status() const { return status_; }
  const ClientHelloInfo& info() const { return info_; }
  // Human-readable reason for malformed / not_tls (for debug logs).
  const char* error() const { return error_; }

  // The raw input taken so far, as received (never more than max_bytes).
  std::size_t input_size() const { return records_.size(); }
  // Hands that input over (a proxy forwards it), so that the caller need not
  // keep a second copy. Only once a final status is reached: the parser is
  // spent afterwards.
  std::vector<std::uint8_t> take_input() { return std::move(records_); }

 private:
  Status step();

  std::size_t max_bytes_;
  Status status_ = Status::need_more;
  const char* error_ = "";
  ClientHelloInfo info_;
  std::vector<std::uint8_t> records_;   // raw bytes received so far
  // The handshake payload reassembled across records; stays empty when the
  // whole ClientHello sits in its first record (the common case), which is
  // then parsed in place so the input is held once.
  std::vector<std::uint8_t> handshake_;
  std::size_t record_pos_ = 0;          // next unparsed record header in records_
};

}  // namespace sluice::preread
