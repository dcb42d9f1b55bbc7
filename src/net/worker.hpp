// A worker: one thread, one uv loop, its own listening socket per listener
// (SO_REUSEPORT, so the kernel spreads accepts), its own buffer pool and the
// list of its live sessions. Sessions never cross workers.
#pragma once

#include <cstddef>
#include <memory>
#include <thread>
#include <vector>

#include <uv.h>

#include "proxy/buffer_pool.hpp"

namespace sluice {

struct Runtime;
class Session;
class Worker;

struct ListenerHandle {
  uv_tcp_t tcp{};
  Worker* worker = nullptr;
  std::size_t index = 0;  // into Runtime::listeners
};

class Worker {
 public:
  // `fds[i]` is this worker's bound, listening socket for listener i.
  Worker(unsigned id, std::shared_ptr<Runtime> runtime, std::vector<int> fds);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void start();         // spawns the thread
  void request_stop();  // thread-safe: graceful stop
  void join();

  unsigned id() const { return id_; }
  uv_loop_t* loop() { return &loop_; }
  BufferPool& pool() { return pool_; }
  const std::shared_ptr<Runtime>& runtime() const { return runtime_; }

  void link(Session* s);
  void unlink(Session* s);  // called from the session's last close callback

 private:
  void run();
  void begin_stop();
  void maybe_finish_stop();
  void close_all();

  static void on_connection(uv_stream_t* server, int status);
  static void on_async(uv_async_t* a);
  static void on_shutdown_timer(uv_timer_t* t);

  unsigned id_;
  std::shared_ptr<Runtime> runtime_;
  std::vector<int> fds_;
  uv_loop_t loop_{};
  uv_async_t stop_async_{};
  uv_timer_t shutdown_timer_{};
  std::vector<std::unique_ptr<ListenerHandle>> listeners_;
  BufferPool pool_;
  std::thread thread_;
  Session* sessions_ = nullptr;
  std::size_t session_count_ = 0;
  bool stopping_ = false;
  bool closed_ = false;
};

}  // namespace sluice
