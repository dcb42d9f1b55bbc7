// One TCP socket of a session: the client's or the server's. It sits in the
// worker's Reactor, edge-triggered (Reactor::kStream), from the moment the
// session needs its events until close(2) takes it out.
//
// The flags remember what the edges said until a system call says
// otherwise: `readable` until a read meets EAGAIN or returns less than it
// asked (new bytes bring a new edge), `writable` until a write meets EAGAIN
// or is cut short (the kernel then reports room with a new edge).
#pragma once

#include <cstdint>

#include "proxy/reactor.hpp"

namespace sluice {

class Session;

struct Leg final : IoWatcher {
  Session* session = nullptr;
  int fd = -1;             // -1 once closed
  bool registered = false; // in the Reactor's set
  // Another process may hold the same socket (adopted in a binary upgrade,
  // until the old process lets its copy go): close(2) would then leave it
  // in the Reactor's set, so close() takes it out first.
  bool shared = false;
  bool readable = false;
  bool writable = true;
  bool rdhup = false;      // the peer's FIN was reported: a short read is not the end, read on to EOF
  bool is_client = false;

  void on_io(std::uint32_t events) override;
  bool open() const { return fd >= 0; }
  // close(2); with `reset`, an RST instead of a FIN (SO_LINGER 0).
  void close(bool reset);
};

}  // namespace sluice
