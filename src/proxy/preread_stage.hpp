// A preread stage reads the first bytes of a client connection, before any
// server is chosen, and decides where it goes: TLS ClientHello (SNI, ALPN)
// and PostgreSQL's SSLRequest (the PROXY protocol header is read by the session itself). A stage never does
// I/O itself: the session feeds it what it reads and owns the timeout.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sluice/cause.hpp"

namespace sluice {

class Upstream;

struct PrereadResult {
  enum class Kind { need_more, route, close };
  Kind kind = Kind::need_more;
  Cause cause = Cause::none;     // with close
  Upstream* upstream = nullptr;  // with route
  std::string reply;             // bytes to send the client now (PostgreSQL's 'S'), with any kind
};

class PrereadStage {
 public:
  virtual ~PrereadStage() = default;
  // `data` was just read from the client.
  virtual PrereadResult feed(std::span<const std::uint8_t> data) = 0;
  // After `route`: every byte read so far, to be sent to the server first,
  // unchanged. Called once.
  virtual std::vector<std::uint8_t> take_forward() = 0;
  // Why the input was refused (for a debug line); empty when it was not.
  virtual const char* error() const { return ""; }
  // After `route`: the server must first be asked for TLS in-band
  // (PostgreSQL's SSLRequest) and answer 'S' before the forward bytes go.
  virtual bool server_needs_ssl_request() const { return false; }

  // What the stage learnt, for logs and hashing.
  std::string sni;   // normalised (lower case, no trailing dot)
  std::string alpn;  // the offered protocols, comma-separated, as sent
};

}  // namespace sluice
