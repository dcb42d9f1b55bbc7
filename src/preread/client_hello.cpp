// TLS ClientHello parser. Structure per RFC 8446 section 4.1.2 (ClientHello),
// section 5.1 (record layer), RFC 6066 section 3 (server_name) and RFC 7301
// section 3.1 (application_layer_protocol_negotiation).
//
// The parser works in two stages. The record stage walks the raw input one TLS
// record header at a time, checks every header field as soon as its bytes are
// present (so a wrong first byte is answered with a single byte of input), and
// appends each complete record's payload to `handshake_`; the 4-byte handshake
// header is checked as soon as its bytes arrive, even from a partial record,
// so an impossible message is refused early. The message stage
// starts once `handshake_` holds the whole ClientHello and validates it in one
// pass. Because each check runs in input order and only on bytes that are
// present, the answer never depends on how the input was split into calls.
#include "preread/client_hello.hpp"

#include <algorithm>
#include <string_view>

namespace sluice::preread {

namespace {

constexpr std::uint8_t kHandshakeClientHello = 1;
constexpr std::size_t kRecordHeaderLen = 5;
constexpr std::size_t kHandshakeHeaderLen = 4;
constexpr std::size_t kMaxRecordPayload = 1U << 14;  // TLSPlaintext.length limit
// legacy_version(2) random(32) session_id len(1) cipher_suites len(2) + one
// suite(2) compression len(1) + one method(1).
constexpr std::size_t kMinClientHelloBody = 2 + 32 + 1 + 2 + 2 + 1 + 1;
constexpr std::size_t kMaxSessionId = 32;
constexpr std::size_t kMaxHostName = 255;

constexpr std::uint16_t kExtServerName = 0;
constexpr std::uint16_t kExtAlpn = 16;
constexpr std::uint8_t kNameTypeHostName = 0;

// Bounds-checked big-endian reader over one container (the message, a vector,
// an extension body). Every read fails instead of running past `end_`.
class Reader {
 public:
  Reader(const std::uint8_t* begin, std::size_t len) : pos_(begin), end_(begin + len) {}

  std::size_t remaining() const { return static_cast<std::size_t>(end_ - pos_); }
  bool empty() const { return pos_ == end_; }

  bool u8(std::size_t& out) {
    if (remaining() < 1) return false;
    out = pos_[0];
    pos_ += 1;
    return true;
  }
  bool u16(std::size_t& out) {
    if (remaining() < 2) return false;
    out = (std::size_t{pos_[0]} << 8) | pos_[1];
    pos_ += 2;
    return true;
  }
  // Takes the next `len` bytes as a sub-container.
  bool sub(std::size_t len, Reader& out) {
    if (remaining() < len) return false;
    out = Reader(pos_, len);
    pos_ += len;
    return true;
  }
  bool skip(std::size_t len) {
    if (remaining() < len) return false;
    pos_ += len;
    return true;
  }
  const std::uint8_t* data() const { return pos_; }

 private:
  const std::uint8_t* pos_;
  const std::uint8_t* end_;
};

bool host_char_ok(std::uint8_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '-' || c == '.' || c == '_';
}

// Parses the server_name extension body (RFC 6066 ServerNameList). Keeps the
// first host_name entry; entries of other name types are skipped.
const char* parse_server_name(Reader body, ClientHelloInfo& info) {
  std::size_t list_len = 0;
  Reader list(nullptr, 0);
  if (!body.u16(list_len) || list_len == 0 || list_len != body.remaining() ||
      !body.sub(list_len, list)) {
    return "server_name: bad list length";
  }
  while (!list.empty()) {
    std::size_t name_type = 0;
    std::size_t name_len = 0;
    Reader name(nullptr, 0);
    if (!list.u8(name_type) || !list.u16(name_len) || !list.sub(name_len, name)) {
      return "server_name: entry overruns list";
    }
    if (name_type != kNameTypeHostName || info.has_sni) continue;
    if (name_len == 0 || name_len > kMaxHostName) return "server_name: bad host name length";
    const std::uint8_t* p = name.data();
    if (!std::all_of(p, p + name_len, host_char_ok)) {
      return "server_name: invalid character in host name";
    }
    info.has_sni = true;
    info.sni.assign(reinterpret_cast<const char*>(p), name_len);
  }
  return nullptr;
}

// Parses the ALPN extension body (RFC 7301 ProtocolNameList). GREASE protocol
// names are kept like any other entry; the list is reported as sent.
const char* parse_alpn(Reader body, ClientHelloInfo& info) {
  std::size_t list_len = 0;
  Reader list(nullptr, 0);
  if (!body.u16(list_len) || list_len < 2 || list_len != body.remaining() ||
      !body.sub(list_len, list)) {
    return "alpn: bad list length";
  }
  while (!list.empty()) {
    std::size_t name_len = 0;
    Reader name(nullptr, 0);
    if (!list.u8(name_len) || name_len == 0 || !list.sub(name_len, name)) {
      return "alpn: bad protocol name length";
    }
    info.alpn.emplace_back(reinterpret_cast<const char*>(name.data()), name_len);
  }
  return nullptr;
}

// Validates a complete ClientHello body (after the 4-byte handshake header)
// and fills `info`. Returns an error text, or nullptr when the hello is valid.
const char* parse_client_hello(Reader msg, ClientHelloInfo& info) {
  std::size_t version = 0;
  if (!msg.u16(version)) return "truncated legacy_version";
  if ((version >> 8) != 3) return "client legacy_version is not 3.x";
  info.client_version = static_cast<std::uint16_t>(version);
  if (!msg.skip(32)) return "truncated random";

  std::size_t len = 0;
  if (!msg.u8(len) || len > kMaxSessionId || !msg.skip(len)) return "bad session_id length";
  if (!msg.u16(len) || len < 2 || len % 2 != 0 || !msg.skip(len)) {
    return "bad cipher_suites length";
  }
  if (!msg.u8(len) || len < 1 || !msg.skip(len)) return "bad compression_methods length";

  // Extensions are optional (pre-TLS 1.3 clients may omit the block), but if
  // the block is present it must fill the rest of the message exactly.
  if (msg.empty()) return nullptr;
  Reader exts(nullptr, 0);
  if (!msg.u16(len) || len != msg.remaining() || !msg.sub(len, exts)) {
    return "extensions length does not match the message";
  }

  std::vector<std::uint16_t> seen;
  seen.reserve(exts.remaining() / 4);  // an extension takes at least 4 bytes
  while (!exts.empty()) {
    std::size_t type = 0;
    std::size_t ext_len = 0;
    Reader body(nullptr, 0);
    if (!exts.u16(type) || !exts.u16(ext_len) || !exts.sub(ext_len, body)) {
      return "extension overruns the extensions block";
    }
    seen.push_back(static_cast<std::uint16_t>(type));
    const char* err = nullptr;
    if (type == kExtServerName) {
      err = parse_server_name(body, info);
    } else if (type == kExtAlpn) {
      err = parse_alpn(body, info);
    }
    // Everything else (GREASE, key_share, ECH 0xfe0d, ...) is skipped: an ECH
    // outer hello is routed on its outer server_name like any other hello.
    if (err != nullptr) return err;
  }
  std::sort(seen.begin(), seen.end());
  if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) {
    return "duplicate extension";
  }
  return nullptr;
}

// Checks the handshake header from as many of its 4 bytes as are present, so
// that a wrong message type or an impossible length is refused without
// waiting for the rest of the record. Returns an error text or nullptr.
const char* check_handshake_header(const std::uint8_t* p, std::size_t n,
                                   std::size_t max_bytes) {
  if (n >= 1 && p[0] != kHandshakeClientHello) {
    return "first handshake message is not a ClientHello";
  }
  if (n >= kHandshakeHeaderLen) {
    const std::size_t body_len = (std::size_t{p[1]} << 16) | (std::size_t{p[2]} << 8) | p[3];
    // The smallest framing this message could arrive in is one record header.
    if (body_len < kMinClientHelloBody ||
        body_len + kHandshakeHeaderLen + kRecordHeaderLen > max_bytes) {
      return "ClientHello length out of range";
    }
  }
  return nullptr;
}

}  // namespace

ClientHelloParser::ClientHelloParser(std::size_t max_bytes) : max_bytes_(max_bytes) {}

Status ClientHelloParser::feed(std::span<const std::uint8_t> data) {
  if (status_ != Status::need_more) return status_;
  // Never hold more than max_bytes: a hello that completes within the cap is
  // accepted even if this call carried bytes past it (e.g. early data).
  const std::size_t room = max_bytes_ - records_.size();
  const bool overflow = data.size() > room;
  const std::size_t take = overflow ? room : data.size();
  records_.insert(records_.end(), data.begin(), data.begin() + static_cast<std::ptrdiff_t>(take));
  status_ = step();
  if (status_ == Status::need_more && overflow) {
    status_ = Status::malformed;
    error_ = "no complete ClientHello within max_bytes";
  }
  return status_;
}

Status ClientHelloParser::step() {
  auto fail = [this](Status s, const char* why) {
    error_ = why;
    return s;
  };

  for (;;) {
    if (!handshake_.empty()) {
      const std::size_t n = std::min(handshake_.size(), kHandshakeHeaderLen);
      if (const char* err = check_handshake_header(handshake_.data(), n, max_bytes_)) {
        return fail(Status::malformed, err);
      }
    }
    if (handshake_.size() >= kHandshakeHeaderLen) {
      const std::size_t body_len = (std::size_t{handshake_[1]} << 16) |
                                   (std::size_t{handshake_[2]} << 8) | handshake_[3];
      if (handshake_.size() >= kHandshakeHeaderLen + body_len) {
        const char* err = parse_client_hello(
            Reader(handshake_.data() + kHandshakeHeaderLen, body_len), info_);
        if (err != nullptr) {
          info_ = ClientHelloInfo{};
          return fail(Status::malformed, err);
        }
        return Status::done;
      }
    }

    // Next record header, checked field by field as its bytes arrive.
    const std::size_t avail = records_.size() - record_pos_;
    const std::uint8_t* h = records_.data() + record_pos_;
    const bool first = record_pos_ == 0;
    if (avail < 1) return Status::need_more;
    if (h[0] != kTlsHandshake) {
      // Anything but a handshake record at the very start is some other
      // protocol; later on, an alert / change_cipher_spec / application data
      // record in the middle of the hello is a broken TLS client.
      return first ? fail(Status::not_tls, "first byte is not a TLS handshake record")
                   : fail(Status::malformed, "non-handshake record before the ClientHello ended");
    }
    if (avail < 2) return Status::need_more;
    if (h[1] != 3) {
      return first ? fail(Status::not_tls, "record major version is not 3")
                   : fail(Status::malformed, "record major version is not 3");
    }
    if (avail < 3) return Status::need_more;
    if (h[2] > 4) return fail(Status::malformed, "record minor version above 3.4");
    if (first) {
      info_.record_version = static_cast<std::uint16_t>((std::uint16_t{h[1]} << 8) | h[2]);
    }
    if (avail < kRecordHeaderLen) return Status::need_more;
    const std::size_t len = (std::size_t{h[3]} << 8) | h[4];
    if (len == 0) return fail(Status::malformed, "empty handshake record");
    if (len > kMaxRecordPayload) return fail(Status::malformed, "record longer than 2^14");

    if (avail < kRecordHeaderLen + len) {
      // Incomplete record: look at the part of the handshake header it may
      // already hold.
      if (handshake_.size() < kHandshakeHeaderLen) {
        std::uint8_t head[kHandshakeHeaderLen] = {};
        const std::size_t have = handshake_.size();
        const std::size_t more = std::min(kHandshakeHeaderLen - have, avail - kRecordHeaderLen);
        std::copy_n(handshake_.begin(), have, head);
        std::copy_n(h + kRecordHeaderLen, more, head + have);
        if (const char* err = check_handshake_header(head, have + more, max_bytes_)) {
          return fail(Status::malformed, err);
        }
      }
      return Status::need_more;
    }

    const std::uint8_t* payload = h + kRecordHeaderLen;
    if (handshake_.empty() && len >= kHandshakeHeaderLen) {
      if (const char* err = check_handshake_header(payload, kHandshakeHeaderLen, max_bytes_)) {
        return fail(Status::malformed, err);
      }
      const std::size_t body_len =
          (std::size_t{payload[1]} << 16) | (std::size_t{payload[2]} << 8) | payload[3];
      if (len >= kHandshakeHeaderLen + body_len) {
        // The whole hello in one record: parse it where it lies.
        const char* err = parse_client_hello(Reader(payload + kHandshakeHeaderLen, body_len), info_);
        if (err != nullptr) {
          info_ = ClientHelloInfo{};
          return fail(Status::malformed, err);
        }
        return Status::done;
      }
    }
    handshake_.insert(handshake_.end(), payload, payload + len);
    record_pos_ += kRecordHeaderLen + len;
  }
}

}  // namespace sluice::preread
