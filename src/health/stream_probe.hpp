// The common part of the checks that speak over one plain TCP connection
// (tcp, http, send_expect): connect to the target, write, read, close.
#pragma once

#include <string>
#include <string_view>

#include "health/probe.hpp"

namespace sluice::health {

class StreamProbe : public Probe {
 public:
  using Probe::Probe;

 protected:
  void begin() final;
  void abort() final;

  // The connection is up (reading has started).
  virtual void on_connected() = 0;
  // Everything given to send() has been written.
  virtual void on_sent() {}
  // Bytes from the peer.
  virtual void on_data(std::string_view bytes) = 0;
  // The peer closed its side (`error` empty) or the connection failed.
  virtual void on_end(std::string_view error) = 0;
  // Writes `bytes` (one write at a time per check).
  void send(std::string bytes);

 private:
  struct Conn : Handle<uv_tcp_t, StreamProbe> {
    using Handle::Handle;
    static Conn* from(uv_handle_t* h) { return static_cast<Conn*>(static_cast<HandleRecord*>(h->data)); }
    uv_connect_t connect{};
    uv_write_t write{};
    std::string out;
    char in[16384];
  };
  // The current check's connection, or null (and the probe is gone) when `c`
  // is closing or stale.
  static StreamProbe* live(Conn* c) { return c->closing || c->owner->conn_ != c ? nullptr : c->owner; }
  static void on_connect(uv_connect_t* req, int status);
  static void on_write(uv_write_t* req, int status);
  static void on_alloc(uv_handle_t* h, std::size_t suggested, uv_buf_t* buf);
  static void on_read(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf);

  // Sends the PROXY protocol header (send_proxy); on_connected() follows
  // once it is written.
  void send_proxy_header();

  Conn* conn_ = nullptr;
  bool header_pending_ = false;
};

}  // namespace sluice::health
