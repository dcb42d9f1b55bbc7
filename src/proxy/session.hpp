// One client connection, from accept to the last close callback.
//
//   accepted -> prereading (preread listeners) -> connecting -> proxying -> closing
//                                        (binary upgrade) proxying -> moving -> closing
//                                                                       \--> proxying (not taken)
//
// Every state change goes through set_state(); every ending through finish(),
// which records the one termination cause, closes both sockets, writes the
// access record and hands the object to its host, which deletes it once the
// current round of events is over (never inside one of its own callbacks).
// The connect/retry loop is the Connector's; the preread is a PrereadStage's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <netinet/in.h>

#include "log/access_log.hpp"
#include "proxy/connector.hpp"
#include "proxy/leg.hpp"
#include "proxy/preread_stage.hpp"
#include "proxy/pump.hpp"
#include "proxy/session_host.hpp"
#include "proxy/timer_queue.hpp"
#include "sluice/cause.hpp"
#include "upgrade/session_record.hpp"

namespace sluice {

class BufferPool;
class ServerState;
class Snapshot;
class Splicer;
struct RouteStats;
struct ListenerView;

class Session {
 public:
  enum class State {
    accepted,    // client accepted, nothing read yet
    prereading,  // reading the first bytes (TLS ClientHello, ...) to choose an upstream
    connecting,  // a connect attempt to a server is in flight (or being retried)
    proxying,    // both pumps running
    refusing,    // refused before any server answered: telling the client why in its protocol
                 // (the listener's `protocol`), within preread_timeout, then closing
    moving,      // handed to an upgrade's new process, its word not heard yet: neither socket touched
    closing,     // finish() called: sockets closed, the host deletes it after this round
  };

  // Runs the connection `fd` (just accepted, non-blocking, from `peer`) with
  // the listener's view `lv` in `snapshot`.
  static void accept(SessionHost& host, std::shared_ptr<const Snapshot> snapshot, const ListenerView& lv, int fd,
                     const sockaddr* peer);
  // For the host, once a retired session may go.
  static void dispose(Session* s) { delete s; }

  // Ends the session now (graceful-stop deadline, server down, ...); no-op
  // when already closing. A moving session ends so only if it stays here.
  void terminate(Cause cause) { finish(cause); }
  // Ends the session with `cause` at loop time `at_ms` (a spread-out drain).
  void close_at(std::uint64_t at_ms, Cause cause);
  // The server this session is on (or connecting to); null if none, also
  // right after a failed attempt: a session moving on from a server is no
  // longer that server's to close.
  const ServerState* server() const { return connector_.current(); }
  // Loop time (ms) of the accept; for an adopted session, as the old
  // process's age for it says.
  std::uint64_t start_ms() const { return start_ms_; }
  State state() const { return state_; }
  // The host's periodic look (every few seconds): a proxying session
  // without interim records of its own (log_interval off) adds the bytes it
  // moved since the last look to the counters, so that /status and
  // /metrics show a live session's bytes before it ends.
  void count_live_bytes() {
    if (state_ == State::proxying && interim_at_ms_ == 0) count_bytes(true);
  }
  // The worker's TimerQueue callback: a deadline of the session is due.
  static void fire_timer(void* owner);

  // ---- binary upgrade ----
  // A moment when the session may move to a new process: proxying, no
  // splice pipe holding bytes, no FIN seen, no end scheduled, not refused
  // by a new process before. Bytes read and not yet written (copy mode) go
  // along with it, so a stream whose reader is slower than its writer need
  // not wait for a queue to empty.
  bool movable() const;
  // Its record (with its id: this worker's `worker` and `seq`) and sockets
  // for the new process (the sockets stay ours), and the bytes waiting in
  // its queues in a memory file (a third descriptor, the caller's to
  // close). False when that file cannot be had now (out of descriptors or
  // memory): the move waits for a later turn.
  bool hand_over_message(upgrade::Message& out, std::uint64_t worker, std::uint64_t seq) const;
  // The message has gone: until the new process answers, the session
  // touches neither socket (out of the Reactor, pumps and timers stopped);
  // its queued bytes and its counts stay here, in case it stays.
  void begin_move();
  // The new process has it: leaves without a FIN, a reset or an access
  // record (the new process carries on and writes the record at the end).
  void moved();
  // The new process did not take it (it declined, died, or is stopping):
  // carries on here from where it was. One it `declined` is not offered
  // to it again. An end asked for while it was moving (terminate) happens
  // now.
  void stay(bool declined);
  // A later upgrade may offer it again, whatever the last one said.
  void may_move_again() { unmovable_ = false; }
  // A session the old process handed over: counted and registered here,
  // its pending bytes (r.pending_in then r.pending_out in `pending_fd`, or
  // -1) queued first, but neither socket touched yet, so that the old
  // process may still carry on with it until it hears that this one has
  // it. Null when it cannot be taken here (the Reactor refuses a socket,
  // the pending bytes cannot be read): nothing is counted, and every
  // descriptor is still the caller's. The caller closes `pending_fd`.
  static Session* adopt(SessionHost& host, std::shared_ptr<const Snapshot> snapshot, const ListenerView& lv,
                        int client_fd, int server_fd, int pending_fd, const upgrade::SessionRecord& r);
  // Then: proxying, the pending bytes first.
  void run_adopted();

  // A Leg's events (see Leg::on_io).
  void on_leg_io(Leg& leg, std::uint32_t events);

  // Called by the pumps and the splicer.
  BufferPool& pool();
  Reactor& reactor() { return host_.reactor(); }
  void touch();
  void on_pump_eof(Pump& p);
  void on_pump_fin_sent(Pump& p);
  // The other direction has finished (its FIN was sent), or the listener
  // has half_close = false and nothing of ours waits in the kernel for
  // p's destination: `p`'s FIN is the session's last act, and the close
  // that follows at once sends it.
  bool fin_ends_session(const Pump& p);
  void on_pump_error(Pump& p, int err, bool at_dst);
  // splice = "auto": a pump is moving a stream (full buffers, well into the
  // session). Cheap when there is nothing to do.
  void on_pump_stream() {
    if (!splice_wanted_ && !splicer_ && lv_splice_auto()) want_splice();
  }
  // A pump's write queue has emptied: a switch that waited for it may go.
  void on_pump_settled() {
    if (splice_wanted_) arm_timer();
  }
  bool closing() const { return state_ == State::closing; }

  // [global] log_phases: the first time the session reaches `p`, for its
  // access record. One test of a flag when off.
  void mark(Phase p) {
    if (timed_) mark_phase(p);
  }
  // Bytes were read from the client (first_in) or from the server (first_out).
  void mark_read(bool from_client) {
    if (timed_) mark_phase(from_client ? Phase::first_in : Phase::first_out);
  }

  // Intrusive list owned by the host.
  Session* prev = nullptr;
  Session* next = nullptr;

 private:
  friend class Connector;

  Session(SessionHost& host, std::shared_ptr<const Snapshot> snapshot, const ListenerView& lv);
  ~Session();

  void set_state(State s);
  void begin();
  bool admit();
  void refuse(Cause cause);
  // A refusal the client is told about (see preread/refusal.hpp): true
  // when the session went on to `refusing` instead of closing.
  bool begin_refusal(Cause cause);
  void read_refusal();
  // Sends what the refusal says; ends the session when it is done (or the
  // client is gone). False when the session ended.
  bool act_on_refusal(const std::string& send, bool done);
  std::string refused_upstream() const;
  void after_admission();
  void append_proxy_header(std::vector<std::uint8_t>& out, ProxyProtocol version);
  void begin_pg_handshake(std::vector<std::uint8_t> head);
  void on_pg_answer();
  void begin_preread();
  // Adds the client's socket to the worker's Reactor; false (the session
  // ended with local_resource) when the kernel refuses it.
  bool register_client();
  void read_preread();
  std::unique_ptr<PrereadStage> next_stage();
  void on_stage_done();
  void on_preread_data(const char* data, std::size_t len);
  void route_and_connect(Upstream* up);
  void start_proxying();
  void finish(Cause cause);
  void uncount();
  void arm_timer();
  void on_timer();
  std::uint64_t server_keepalive_at() const;  // loop time to set the server leg's keepalive
  void write_access_record(bool interim = false);
  // Adds what moved since the last call to the byte counters; `again`:
  // the session goes on (an interim record), so what was counted is kept.
  void count_bytes(bool again);
  enum class Drain { moving, stalled, unknown };
  Drain peers_draining();
  std::string hash_key(const Upstream& up) const;
  std::string client_address() const;  // "ip:port", empty when unknown
  std::string client_ip() const;        // empty when unknown
  bool lv_splice_auto() const;
  bool half_close() const;
  void want_splice();
  bool splice_ready() const;
  void switch_to_splice();

  // For the Connector.
  uv_loop_t* loop() { return host_.loop(); }
  Leg& open_server(int fd);
  Leg& server_leg() { return server_; }
  void close_server_for_retry();
  void on_connected(bool at_once);
  const ListenerConfig& listener_config() const;

  SessionHost& host_;
  std::shared_ptr<const Snapshot> snapshot_;  // keeps the configuration alive for our lifetime
  const ListenerView& lv_;
  State state_ = State::accepted;
  Cause cause_ = Cause::none;

  Leg client_;
  Leg server_;
  TimerNode timer_;  // in the worker's TimerQueue while a deadline is set

  // Flags, side by side so that they share words.
  bool counted_ = false;           // counted in the connection totals
  bool connected_ = false;
  bool client_counted_ = false;    // holds a slot in the listener's ClientTable
  bool quiet_ = false;             // refused by policy: counted, no access record
  bool half_closed_ = false;       // a FIN has been seen: fin_timeout applies
  bool client_fin_first_ = false;
  bool cut_on_fin_ = false;        // half_close = false: the first FIN ends the session
  bool splice_wanted_ = false;     // switch to splice(2) once both sockets are quiet
  bool spliced_ = false;           // the splicer has the sockets
  bool server_keepalive_ = false;  // the server leg's TCP keepalive is set (see arm_timer)
  bool unmovable_ = false;         // a binary upgrade's new process declined it: not offered again
  bool timed_ = false;             // log_phases: the phases are in extra_->phases
  Cause moving_end_ = Cause::none;  // an end asked for while moving; happens if it stays

  Pump c2s_;
  Pump s2c_;
  Connector connector_;
  std::unique_ptr<Splicer> splicer_;  // once a switch was tried (kept if it failed: never tried twice)

  // Times in loop milliseconds (uv_now: the worker's loop clock, brought up
  // to date after every wait).
  std::uint64_t start_ms_ = 0;
  std::uint64_t connected_ms_ = 0;
  std::uint64_t interim_at_ms_ = 0;     // next interim access record (log_interval); 0 = off
  std::uint64_t last_activity_ms_ = 0;
  std::uint64_t close_at_ms_ = 0;   // scheduled end (drain); 0 = none
  static constexpr std::uint32_t kUnsampled = 0xffffffff;
  std::uint32_t outq_client_ = kUnsampled;  // kernel send queues seen by the last idle check
  std::uint32_t outq_server_ = kUnsampled;
  std::uint64_t recheck_ms_ = 0;            // a second look at the send queues; 0 = none
  Cause close_at_cause_ = Cause::none;

  // An IPv4 or IPv6 address in 28 bytes (a sockaddr_storage is 128).
  union SockAddr {
    sockaddr sa;
    sockaddr_in in4;
    sockaddr_in6 in6;
  };
  // The client's address as accepted; formatted only when a log line or a
  // hash key asks for it. AF_UNSPEC when it was not read (see begin()).
  SockAddr peer_{};
  // Preread, PROXY protocol and PostgreSQL state; null for a plain session.
  struct Extra;
  std::unique_ptr<Extra> extra_;
  Extra& extra();
  void start_timing();
  void mark_phase(Phase p);
  const std::string& sni() const;   // empty without a preread
  const std::string& alpn() const;
};

}  // namespace sluice
