// `loadgen open`: an open loop. Requests are scheduled at a fixed rate
// whatever the target does, and each one is timed from when it was scheduled
// to be sent, not from when it went out: a stall delays every request due
// during it, and all of them show the stall (no coordinated omission, which a
// closed loop such as `rr` or `conn` hides because it stops asking while it
// waits).
//
//   --mode rr    keep-alive: --connections persistent connections, one request
//                of --size bytes in flight on each; a request due while all are
//                busy waits in a queue (its wait counts).
//   --mode conn  short connections: one connection per request (connect, send
//                --size bytes, read them back, close), at most --max-inflight
//                at once; a request due beyond that waits in the queue.
//
// The first --warmup seconds are sent but not timed. At the end, requests
// still unanswered after --drain seconds are timed up to that moment and
// counted as "unfinished".
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <set>
#include <stdexcept>
#include <vector>

#include <sys/timerfd.h>
#include <unistd.h>

#include "client_util.hpp"
#include "commands.hpp"

namespace loadgen {
namespace {

struct OpenLoad {
  Poller poller;
  Target target;
  std::vector<char> request;
  std::vector<char> scratch = std::vector<char>(64 * 1024);
  Clock::time_point timed_from;  // requests scheduled earlier are warm-up
  bool scheduling = true;        // false once the last request is due
  std::deque<Clock::time_point> queue;  // due, not yet sent
  LatencyRecorder latency;
  ErrorTally errors;
  std::uint64_t done = 0;        // answered requests (timed or not)
  std::uint64_t cuts = 0;        // keep-alive connections the far side closed or reset
  std::uint64_t connects = 0;

  void finished(Clock::time_point scheduled, Clock::time_point now) {
    ++done;
    if (scheduled >= timed_from) latency.add(now - scheduled);
  }
  // A request that failed: counted, and timed up to now when it is past the
  // warm-up so the failure still weighs in the percentiles.
  void failed(Clock::time_point scheduled, Clock::time_point now, const std::string& why) {
    errors.add(why);
    if (scheduled >= timed_from) latency.add(now - scheduled);
  }
};

// A persistent connection of the rr mode; reconnects after a failure.
class KeepAliveConn : public Handler {
 public:
  explicit KeepAliveConn(OpenLoad& load) : load_(load) {}
  ~KeepAliveConn() override {
    if (fd_ >= 0) close(fd_);
  }

  bool ready() const { return fd_ >= 0 && !connecting_ && !busy_; }
  bool busy() const { return busy_; }
  Clock::time_point scheduled() const { return scheduled_; }
  bool down(Clock::time_point now) const { return fd_ < 0 && now >= retry_at_; }

  void connect() {
    fd_ = start_connect(load_.target);
    if (fd_ < 0) {
      load_.errors.add(errno_text("connect", errno));
      retry_at_ = Clock::now() + kRetryDelay;
      return;
    }
    connecting_ = true;
    events_ = EPOLLOUT;
    load_.poller.add(fd_, EPOLLOUT, this);
  }

  void send_request(Clock::time_point scheduled) {
    busy_ = true;
    scheduled_ = scheduled;
    sent_ = 0;
    got_ = 0;
    send_more();
  }

  void on_event(std::uint32_t /*events*/) override {
    if (connecting_) {
      int err = connect_result(fd_);
      if (err != 0) return fail(errno_text("connect", err), false);
      connecting_ = false;
      ++load_.connects;
      set_events(EPOLLIN);
      return;
    }
    if (busy_ && sent_ < load_.request.size()) return send_more();
    ssize_t n = read(fd_, load_.scratch.data(), load_.scratch.size());
    if (n < 0) {
      if (errno != EAGAIN) fail(errno_text("read", errno), true);
      return;
    }
    if (n == 0) return fail("connection closed by the far side", true);
    if (!busy_) return fail("bytes nobody asked for", true);
    got_ += static_cast<std::size_t>(n);
    if (got_ < load_.request.size()) return;
    if (got_ > load_.request.size()) return fail("reply longer than the request", true);
    busy_ = false;
    load_.finished(scheduled_, Clock::now());
  }

 private:
  void send_more() {
    const std::size_t size = load_.request.size();
    long w = send_some(fd_, load_.request.data() + sent_, size - sent_);
    if (w < 0) return fail(errno_text("send", errno), true);
    sent_ += static_cast<std::size_t>(w);
    set_events(sent_ == size ? EPOLLIN : EPOLLOUT);
  }

  void set_events(std::uint32_t want) {
    if (want == events_) return;
    events_ = want;
    load_.poller.modify(fd_, want, this);
  }

  // An established connection that ends is a cut session whether or not a
  // request was in flight; the request in flight, if any, is lost.
  void fail(const std::string& why, bool established) {
    close(fd_);
    fd_ = -1;
    connecting_ = false;
    retry_at_ = Clock::now() + kRetryDelay;
    if (established) ++load_.cuts;
    if (busy_) {
      busy_ = false;
      load_.failed(scheduled_, Clock::now(), why);
    } else {
      load_.errors.add(why);
    }
  }

  OpenLoad& load_;
  int fd_ = -1;
  bool connecting_ = false;
  bool busy_ = false;
  std::uint32_t events_ = 0;
  std::size_t sent_ = 0;
  std::size_t got_ = 0;
  Clock::time_point scheduled_;
  Clock::time_point retry_at_;
};

// One short connection of the conn mode; deletes itself when it ends.
class ShortConn : public Handler {
 public:
  ShortConn(OpenLoad& load, std::set<ShortConn*>& live, Clock::time_point scheduled)
      : load_(load), live_(live), scheduled_(scheduled) {
    live_.insert(this);
  }
  ~ShortConn() override {
    if (fd_ >= 0) close(fd_);
    live_.erase(this);
  }
  ShortConn(const ShortConn&) = delete;
  ShortConn& operator=(const ShortConn&) = delete;

  // Returns false (and the caller deletes it) when the connect failed at once.
  bool start() {
    fd_ = start_connect(load_.target);
    if (fd_ < 0) {
      load_.failed(scheduled_, Clock::now(), errno_text("connect", errno));
      return false;
    }
    load_.poller.add(fd_, EPOLLOUT, this);
    return true;
  }

  Clock::time_point scheduled() const { return scheduled_; }

  void on_event(std::uint32_t /*events*/) override {
    const std::size_t size = load_.request.size();
    if (connecting_) {
      int err = connect_result(fd_);
      if (err != 0) return end(errno_text("connect", err));
      connecting_ = false;
    }
    if (sent_ < size) {
      long w = send_some(fd_, load_.request.data() + sent_, size - sent_);
      if (w < 0) return end(errno_text("send", errno));
      sent_ += static_cast<std::size_t>(w);
      if (sent_ == size) load_.poller.modify(fd_, EPOLLIN, this);
      return;
    }
    ssize_t n = read(fd_, load_.scratch.data(), load_.scratch.size());
    if (n < 0) {
      if (errno != EAGAIN) end(errno_text("read", errno));
      return;
    }
    if (n == 0) return end("connection closed before the full reply");
    got_ += static_cast<std::size_t>(n);
    if (got_ >= size) end("");
  }

 private:
  void end(const std::string& why) {
    auto now = Clock::now();
    if (why.empty()) {
      load_.finished(scheduled_, now);
    } else {
      load_.failed(scheduled_, now, why);
    }
    delete this;
  }

  OpenLoad& load_;
  std::set<ShortConn*>& live_;
  Clock::time_point scheduled_;
  int fd_ = -1;
  bool connecting_ = true;
  std::size_t sent_ = 0;
  std::size_t got_ = 0;
};

// The schedule's clock: a timerfd armed for the next due request (absolute,
// CLOCK_MONOTONIC, which steady_clock reads on Linux).
class Ticker : public Handler {
 public:
  explicit Ticker(Poller& poller) : fd_(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) {
    if (fd_ < 0) throw std::runtime_error(errno_text("timerfd_create", errno));
    poller.add(fd_, EPOLLIN, this);
  }
  ~Ticker() override { close(fd_); }
  Ticker(const Ticker&) = delete;
  Ticker& operator=(const Ticker&) = delete;

  void arm(Clock::time_point at) {
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
    if (ns <= 0) ns = 1;
    itimerspec spec{};
    spec.it_value.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
    spec.it_value.tv_nsec = static_cast<long>(ns % 1'000'000'000);
    timerfd_settime(fd_, TFD_TIMER_ABSTIME, &spec, nullptr);
  }

  void on_event(std::uint32_t /*events*/) override {
    std::uint64_t expirations;
    (void)!read(fd_, &expirations, sizeof expirations);
  }

 private:
  int fd_;
};

}  // namespace

int run_open(const Options& opts) {
  auto load = std::make_unique<OpenLoad>();
  if (!target_option(opts, "open", load->target)) return 2;
  const std::string mode = opts.str("mode", "rr");
  const double rate = opts.seconds("rate", 0);
  const double duration = opts.seconds("duration", 10.0);
  // "--warmup 0" times every request (seconds() takes only positive values).
  const double warmup = opts.str("warmup") == "0" ? 0.0 : opts.seconds("warmup", 0.5);
  const double drain = opts.seconds("drain", 2.0);
  const std::uint64_t connections = opts.count("connections", 64);
  const std::uint64_t max_inflight = opts.count("max-inflight", 2000);
  const std::uint64_t size = opts.count("size", 64);
  if ((mode != "rr" && mode != "conn") || rate <= 0 || rate > 10'000'000 || duration <= 0 ||
      connections < 1 || connections > 10000 || max_inflight < 1 || size < 1 || size > 65536) {
    std::fprintf(stderr,
                 "loadgen open: --mode rr|conn, --rate > 0 (per second), --duration > 0, "
                 "--connections 1..10000, --size 1..65536\n");
    return 2;
  }
  raise_fd_limit();
  load->request.assign(size, 'o');
  StopSignal stop(load->poller, false);
  Ticker ticker(load->poller);

  // rr: open every connection before the schedule starts (5 s at most).
  std::vector<std::unique_ptr<KeepAliveConn>> conns;
  if (mode == "rr") {
    for (std::uint64_t i = 0; i < connections; ++i) {
      conns.push_back(std::make_unique<KeepAliveConn>(*load));
      conns.back()->connect();
    }
    run_until(load->poller, stop, after_seconds(Clock::now(), 5.0),
              [&] { return load->connects >= connections; }, [] {});
    if (load->connects < connections) {
      std::fprintf(stderr, "loadgen open: only %llu of %llu connections opened: %s\n",
                   static_cast<unsigned long long>(load->connects),
                   static_cast<unsigned long long>(connections), load->errors.first().c_str());
      return 1;
    }
  }
  std::set<ShortConn*> live;  // conn mode: connections open

  const auto interval = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / rate));
  const auto start = Clock::now();
  const auto end = after_seconds(start, duration);
  load->timed_from = after_seconds(start, warmup);
  std::uint64_t scheduled = 0;  // requests due so far
  // rate x duration requests in all (counted, so that rounding the interval
  // never adds one at the end).
  const auto total = static_cast<std::uint64_t>(std::llround(rate * duration));
  auto next_due = start;

  // Sends what is queued while there is room: a free connection (rr) or
  // fewer than max_inflight open (conn).
  auto dispatch = [&] {
    if (mode == "rr") {
      for (auto& c : conns) {
        if (load->queue.empty()) break;
        if (!c->ready()) continue;
        c->send_request(load->queue.front());
        load->queue.pop_front();
      }
      return;
    }
    while (!load->queue.empty() && live.size() < max_inflight) {
      auto* op = new ShortConn(*load, live, load->queue.front());
      load->queue.pop_front();
      if (!op->start()) delete op;
    }
  };

  auto unanswered = [&] {
    std::uint64_t busy = 0;
    for (auto& c : conns) busy += c->busy() ? 1 : 0;
    return load->queue.size() + busy + live.size();
  };

  ticker.arm(next_due);
  const auto drain_end = after_seconds(end, drain);
  while (!stop.stopped()) {
    auto now = Clock::now();
    if (load->scheduling) {
      while (next_due <= now && scheduled < total) {
        load->queue.push_back(next_due);
        ++scheduled;
        next_due = start + interval * static_cast<long long>(scheduled);
      }
      if (scheduled >= total) load->scheduling = false;
    }
    for (auto& c : conns) {
      if (c->down(now)) c->connect();
    }
    dispatch();
    if (!load->scheduling && (unanswered() == 0 || now >= drain_end)) break;
    if (load->scheduling) {
      ticker.arm(next_due);
    } else {
      ticker.arm(now + std::chrono::milliseconds(10));
    }
    load->poller.poll(100);
  }
  const auto stopped_at = Clock::now();
  const double elapsed = seconds_between(start, stopped_at);

  // What is still unanswered is timed up to now: a stall at the end counts.
  std::uint64_t unfinished = 0;
  for (auto t : load->queue) {
    ++unfinished;
    if (t >= load->timed_from) load->latency.add(stopped_at - t);
  }
  for (auto& c : conns) {
    if (!c->busy()) continue;
    ++unfinished;
    if (c->scheduled() >= load->timed_from) load->latency.add(stopped_at - c->scheduled());
  }
  for (auto* op : std::set<ShortConn*>(live)) {
    ++unfinished;
    if (op->scheduled() >= load->timed_from) load->latency.add(stopped_at - op->scheduled());
    delete op;
  }
  conns.clear();

  JsonLine line;
  line.add("load", std::string("open")).add("mode", mode).add("target", load->target.text);
  line.add("offered", rate).add("scheduled", scheduled).add("requests", load->done);
  line.add("rate", static_cast<double>(load->done) / std::max(duration, 1e-9));
  line.add("timed", load->latency.count());
  line.add("p50_us", load->latency.percentile_us(50)).add("p90_us", load->latency.percentile_us(90));
  line.add("p99_us", load->latency.percentile_us(99)).add("p999_us", load->latency.percentile_us(99.9));
  line.add("max_us", load->latency.percentile_us(100));
  line.add("unfinished", unfinished).add("cuts", load->cuts).add("connects", load->connects);
  add_common(line, elapsed, load->errors);
  line.print();
  return load->done > 0 ? 0 : 1;
}

}  // namespace loadgen
