// One direction of a session: read from `src`, write to `dst`. The same code
// serves client->server and server->client (nginx's proxy_process with
// src/dst swapped); `src_is_client` tells which one an instance is.
//
// Reads and writes are plain recv(2)/send(2) (sendmsg(2) for several buffers),
// driven by the Legs' edge-triggered readiness (see reactor.hpp): pull()
// when `src` may have bytes, flush() when `dst` may take some.
//
// Backpressure: when more than kHighWater bytes wait in the write queue (not
// yet accepted by dst's kernel), reading from `src` stops; it resumes once
// the queue drains below kLowWater. So a session never buffers more than
// about kHighWater + one Buffer per direction, whatever its peers do.
//
// Half-close: EOF from `src` becomes shutdown(dst) (a FIN) once every queued
// byte is written; the other direction keeps flowing.
//
// `bytes` counts what dst's kernel accepted, not what was read: bytes still
// queued when a session is reset were never delivered and are not counted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "proxy/leg.hpp"
#include "proxy/reactor.hpp"

namespace sluice {

struct Buffer;
class Session;

struct Pump final : Deferred {
  static constexpr std::size_t kHighWater = 128 * 1024;
  static constexpr std::size_t kLowWater = 32 * 1024;
  // Reads per turn at most (32 KiB each): then the rest of the loop's
  // sessions get their turn, and this pump goes on after them.
  static constexpr int kReadsPerTurn = 16;

  Session* session = nullptr;
  Leg* src = nullptr;
  Leg* dst = nullptr;

  std::uint64_t bytes = 0;     // bytes delivered to dst (accepted by its kernel)
  std::uint32_t pauses = 0;    // times reading stopped on the high watermark
  std::uint32_t queued = 0;    // bytes in the write queue
  bool src_is_client = false;  // client->server (else server->client)
  bool running = false;        // started and not stopped
  bool paused = false;         // the write queue is over kHighWater
  bool eof = false;            // src sent FIN
  bool fin_sent = false;       // dst has its FIN (or will with the close)

  // Begins moving bytes; reads at once if src is already known readable.
  void start();
  // Stops for good (the session is closing, or a splicer takes over after
  // the queue emptied); gives queued buffers back.
  void stop();
  // Stops for now, keeping what is queued (a session on its way to an
  // upgrade's new process); start() goes on from there.
  void hold();
  // Reading and writing, for the Legs' events.
  void pull();
  void flush();
  // Queues `len` bytes that must reach dst before anything read from src
  // (a preread's ClientHello, a PROXY header). Call before start().
  void queue_initial(const std::uint8_t* data, std::size_t len);
  // Nothing waits to be written.
  bool drained() const { return head_ == nullptr; }
  // Appends the bytes waiting to be written, oldest first (a binary
  // upgrade sends them along with the session).
  void append_queued(std::string& out) const;

  void run_deferred() override { pull(); }

 private:
  // Writes what it can of `b` (already queued or not); false on an error
  // (reported to the session).
  bool deliver(Buffer* b);
  void enqueue(Buffer* b);
  void on_eof();
  void send_fin_now();
  void after_write_progress();

  Buffer* head_ = nullptr;  // the write queue, oldest first
  Buffer* tail_ = nullptr;
};

}  // namespace sluice
