// One client connection, from accept to the last close callback.
//
//   accepted -> prereading (TLS listeners) -> connecting -> proxying -> closing
//
// Every state change goes through set_state(); every ending through finish(),
// which records the one termination cause. The object deletes itself in the
// last close callback of its handles, never inside a read or write callback.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <netinet/in.h>
#include <uv.h>

#include "preread/client_hello.hpp"
#include "proxy/pump.hpp"
#include "sluice/cause.hpp"
#include "upstream/server_state.hpp"

namespace sluice {

class BufferPool;
class Upstream;
class Worker;
struct ListenerRuntime;
struct Runtime;

class Session {
 public:
  enum class State {
    accepted,    // client accepted, nothing read yet
    prereading,  // reading the TLS ClientHello to choose an upstream
    connecting,  // a connect attempt to a server is in flight (or being retried)
    proxying,    // both pumps running
    closing,     // finish() called; waiting for close callbacks
  };

  // Accepts one pending connection from `listener` and runs it. Returns false
  // when accept itself failed (nothing to clean up then).
  static bool accept(Worker& worker, const ListenerRuntime& lr, uv_stream_t* listener);

  // Ends the session now (graceful-stop deadline); no-op when already closing.
  void terminate(Cause cause) { finish(cause); }

  // Called by the pumps.
  BufferPool& pool();
  void touch();
  void on_pump_eof(Pump& p);
  void on_pump_fin_sent(Pump& p);
  void on_pump_error(Pump& p, int err, bool at_dst);
  bool closing() const { return state_ == State::closing; }

  // Intrusive list owned by the worker (for graceful stop).
  Session* prev = nullptr;
  Session* next = nullptr;

 private:
  Session(Worker& worker, const ListenerRuntime& lr);
  ~Session();

  void set_state(State s);
  void begin();
  void begin_preread();
  void on_preread_data(const char* data, std::size_t len);
  void route_and_connect(Upstream* up);
  void connect_next();
  void on_connected();
  void attempt_failed(ConnectResult result, int err);
  void start_proxying();
  void finish(Cause cause);
  void arm_timer();
  void on_timer();
  void on_handle_closed(uv_handle_t* h);
  void release_server();
  std::string hash_key() const;
  std::string client_address() const;  // "ip:port", empty when unknown
  std::string client_ip() const;        // empty when unknown

  void stop_client_reading();

  static void on_client_alloc(uv_handle_t* h, std::size_t suggested, uv_buf_t* buf);
  static void on_client_read(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf);
  static void on_connect_cb(uv_connect_t* req, int status);
  static void on_timer_cb(uv_timer_t* t);
  static void on_close_cb(uv_handle_t* h);

  Worker& worker_;
  const ListenerRuntime& lr_;
  std::shared_ptr<Runtime> runtime_;  // keeps the snapshot alive for our lifetime
  State state_ = State::accepted;
  Cause cause_ = Cause::none;

  uv_tcp_t client_{};
  uv_tcp_t server_{};
  uv_timer_t timer_{};
  uv_connect_t connect_req_{};
  uv_write_t preread_write_{};
  bool server_open_ = false;     // server_ initialised and not yet closed
  bool server_closing_ = false;  // uv_close(server_) issued, callback pending
  int open_handles_ = 0;

  Pump c2s_;
  Pump s2c_;

  // Choice of server.
  Upstream* upstream_ = nullptr;
  long server_index_ = -1;
  bool holding_server_ = false;  // counted in the server's `active`
  std::vector<bool> tried_;
  unsigned attempts_ = 0;

  // Times in loop milliseconds (uv_now).
  std::uint64_t start_ms_ = 0;
  std::uint64_t first_attempt_ms_ = 0;
  std::uint64_t attempt_deadline_ms_ = 0;
  std::uint64_t connected_ms_ = 0;
  bool connected_ = false;
  std::uint64_t last_activity_ms_ = 0;
  std::uint64_t fin_deadline_ms_ = 0;
  std::uint64_t timer_due_ms_ = 0;  // when the timer fires; 0 = not armed
  bool client_fin_first_ = false;

  // TLS preread.
  std::unique_ptr<preread::ClientHelloParser> parser_;
  std::vector<std::uint8_t> preread_bytes_;  // the hello and anything after it, for the server
  bool client_reading_ = false;  // the session reads the client (before c2s_ takes over)
  ssize_t client_end_ = 0;       // EOF or error read while connecting
  std::string sni_;
  std::string alpn_;

  // The client's address as accepted; formatted only when a log line or a
  // hash key asks for it. AF_UNSPEC when it was not read (see begin()).
  union {
    sockaddr sa;
    sockaddr_in in4;
    sockaddr_in6 in6;
  } peer_{};
};

}  // namespace sluice
