// A preread stage reads the first bytes of a client connection, before any
// server is chosen: the PROXY protocol header (who the client is), then a
// TLS ClientHello (SNI, ALPN) or PostgreSQL's SSLRequest (where it goes).
// Stages are chained per listener: a stage that is done without deciding
// (`next`) hands the bytes it did not use to the following one, and the last
// stage routes. A stage never does I/O itself: the session feeds it what it
// reads and owns the timeout, which covers the whole chain.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sluice/cause.hpp"

namespace sluice {

class Upstream;

struct PrereadResult {
  // next: this stage is done; take_forward() goes to the next stage (or, at
  // the end of the chain, to the listener's upstream).
  enum class Kind { need_more, route, close, next };
  Kind kind = Kind::need_more;
  Cause cause = Cause::none;     // with close
  Upstream* upstream = nullptr;  // with route
  long route = -1;               // with route: the SNI route taken (its index in the file), -1 the default
  std::string reply;             // bytes to send the client now (PostgreSQL's 'S'), with any kind
};

class PrereadStage {
 public:
  virtual ~PrereadStage() = default;
  // `data` was just read from the client.
  virtual PrereadResult feed(std::span<const std::uint8_t> data) = 0;
  // After `route` or `next`: the bytes read so far that go on, unchanged (to
  // the server first, or to the next stage). Called once.
  virtual std::vector<std::uint8_t> take_forward() = 0;
  // Why the input was refused (for a debug line); empty when it was not.
  virtual const char* error() const { return ""; }
  // After `route`: the server must first be asked for TLS in-band
  // (PostgreSQL's SSLRequest) and answer 'S' before the forward bytes go.
  virtual bool server_needs_ssl_request() const { return false; }
  // The stage says who the client is (a PROXY header): the access checks
  // wait for it to finish, whatever it found.
  virtual bool names_client() const { return false; }

  // What the stage learnt, for logs and hashing.
  std::string sni;   // normalised (lower case, no trailing dot)
  std::string alpn;  // the offered protocols, comma-separated, as sent
  // The client's address and the one it connected to, when the stage learnt
  // them (a PROXY header from a trusted peer); ss_family 0 otherwise.
  sockaddr_storage client{};
  sockaddr_storage destination{};
};

}  // namespace sluice
