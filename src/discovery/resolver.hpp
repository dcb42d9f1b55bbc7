// A c-ares channel on a libuv loop (the control loop): c-ares's sockets are
// watched with uv_poll (ares_sock_state_cb tells which and for what), its
// timeouts run on a uv_timer. Queries never block; a truncated UDP answer
// is asked again over TCP by c-ares itself.
#pragma once

#include <ares.h>
#include <uv.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "discovery/answer.hpp"
#include "sluice/config.hpp"

namespace sluice::discovery {

// How a query ended.
enum class QueryStatus {
  answer,     // a message with records, or NODATA (no records of the type)
  nxdomain,   // the name does not exist
  timeout,
  servfail,
  refused,
  network,    // connection refused or reset, unreachable name server
  other,      // malformed answer, FORMERR, ...
  cancelled,  // the channel was closed: nothing to count
};
std::string_view to_string(QueryStatus s);

class Resolver {
 public:
  // `answer` is set for QueryStatus::answer and nxdomain (its TTL is the
  // negative TTL) only.
  using Callback = std::function<void(QueryStatus, const Answer* answer)>;

  // Throws std::runtime_error when c-ares cannot start.
  Resolver(uv_loop_t* loop, const ResolverConfig& config);
  ~Resolver();  // closing must be finished (close())
  Resolver(const Resolver&) = delete;
  Resolver& operator=(const Resolver&) = delete;

  void query(const std::string& name, RecordType type, Callback cb);

  // Ends every query (their callbacks get `cancelled`) and closes every
  // handle; `done` runs from the loop once all are closed.
  void close(std::function<void()> done);

 private:
  struct Poll;
  static void on_sock_state(void* data, ares_socket_t fd, int readable, int writable);
  static void on_poll(uv_poll_t* h, int status, int events);
  static void on_timer(uv_timer_t* t);
  static void on_answer(void* arg, int status, int timeouts, unsigned char* abuf, int alen);
  static void close_poll(Poll* p);
  void arm_timer();
  void maybe_closed();

  uv_loop_t* loop_;
  ares_channel channel_ = nullptr;
  uv_timer_t timer_{};
  std::map<int, Poll*> polls_;
  int open_handles_ = 0;
  bool closing_ = false;
  std::function<void()> closed_;
};

}  // namespace sluice::discovery
