// One direction of a session: read from `src`, write to `dst`. The same code
// serves client->server and server->client (nginx's proxy_process with
// src/dst swapped); `src_is_client` tells which one an instance is.
//
// Backpressure: when `dst` has more than kHighWater bytes queued (not yet
// accepted by the kernel), reading from `src` stops; it resumes once the queue
// drains below kLowWater. So a session never buffers more than about
// kHighWater + one Buffer per direction, whatever its peers do.
//
// Half-close: EOF from `src` becomes uv_shutdown(dst) (a FIN once every queued
// write has flushed); the other direction keeps flowing.
//
// `bytes` counts what `dst`'s kernel accepted, not what was read: bytes still
// queued when a session is reset were never delivered and are not counted.
#pragma once

#include <cstddef>
#include <cstdint>

#include <uv.h>

#include "proxy/session_host.hpp"

namespace sluice {

struct Pump : HandleOwner {
  static constexpr std::size_t kHighWater = 128 * 1024;
  static constexpr std::size_t kLowWater = 32 * 1024;

  uv_stream_t* src = nullptr;
  uv_stream_t* dst = nullptr;

  std::uint64_t bytes = 0;     // bytes delivered to dst (accepted by its kernel)
  std::uint32_t pauses = 0;    // times reading stopped on the high watermark
  std::uint32_t initial_len = 0;  // bytes of write_initial() in flight
  bool src_is_client = false;  // client->server (else server->client)
  bool reading = false;
  bool paused = false;
  bool eof = false;            // src sent FIN
  bool fin_sent = false;       // shutdown(dst) completed
  std::uint16_t writes_in_flight = 0;  // uv_write requests not yet called back

  // Begins reading from src. Returns a libuv error code (0 on success).
  int start();
  // Takes over a src that is already being read by a callback which hands
  // everything to on_read() (a preread that ran straight into PROXYING), so
  // that reading need not stop and start again.
  void adopt_reading() { reading = true; }
  // Stops reading (session closing); idempotent.
  void stop();
  // Queues bytes that were read before the pump started (e.g. a preread
  // ClientHello). `data` must stay valid until the write completes.
  int write_initial(char* data, std::size_t len);

  static void on_alloc(uv_handle_t* h, std::size_t suggested, uv_buf_t* buf);
  static void on_read(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf);
  static void on_write(uv_write_t* req, int status);
  static void on_shutdown(uv_shutdown_t* req, int status);

 private:
  void handle_data(char* base, std::size_t len);
  void after_write_progress();
  void send_fin_now();
};

}  // namespace sluice
