// `loadgen rr`: request/response on persistent connections (echo backend).
#include <cerrno>
#include <cstdio>
#include <memory>
#include <vector>

#include <unistd.h>

#include "client_util.hpp"
#include "commands.hpp"

namespace loadgen {
namespace {

struct RrLoad {
  Poller poller;
  Target target;
  std::vector<char> request;
  std::vector<char> scratch = std::vector<char>(64 * 1024);
  bool running = true;
  std::uint64_t requests = 0;
  std::uint64_t connects = 0;
  LatencyRecorder latency;
  ErrorTally errors;
};

// One persistent connection sending one request at a time.
class RrSlot : public Handler {
 public:
  explicit RrSlot(RrLoad& load) : load_(load) {}
  bool ready_to_start(Clock::time_point now) const { return fd_ < 0 && now >= retry_at_; }

  void start() {
    if (!load_.running) return;
    fd_ = start_connect(load_.target);
    if (fd_ < 0) {
      load_.errors.add(errno_text("connect", errno));
      retry_at_ = Clock::now() + kRetryDelay;
      return;
    }
    connecting_ = true;
    load_.poller.add(fd_, EPOLLOUT, this);
  }

  void on_event(std::uint32_t /*events*/) override {
    if (connecting_) {
      int err = connect_result(fd_);
      if (err != 0) return fail(errno_text("connect", err));
      connecting_ = false;
      ++load_.connects;
      return send_request();
    }
    if (sent_ < load_.request.size()) return send_more();
    ssize_t n = read(fd_, load_.scratch.data(), load_.scratch.size());
    if (n < 0) {
      if (errno == EAGAIN) return;
      return fail(errno_text("read", errno));
    }
    if (n == 0) return fail("connection closed mid-request");
    got_ += static_cast<std::size_t>(n);
    if (got_ < load_.request.size()) return;
    if (got_ > load_.request.size()) return fail("reply longer than the request");
    if (!load_.running) return;
    ++load_.requests;
    load_.latency.add(Clock::now() - sent_at_);
    send_request();
  }

  void abandon() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  void send_request() {
    sent_ = 0;
    got_ = 0;
    sent_at_ = Clock::now();
    send_more();
  }

  void send_more() {
    const std::size_t size = load_.request.size();
    long w = send_some(fd_, load_.request.data() + sent_, size - sent_);
    if (w < 0) return fail(errno_text("send", errno));
    sent_ += static_cast<std::size_t>(w);
    std::uint32_t want = sent_ == size ? EPOLLIN : EPOLLOUT;
    if (want != events_) {
      events_ = want;
      load_.poller.modify(fd_, want, this);
    }
  }

  void fail(const std::string& why) {
    close(fd_);
    fd_ = -1;
    events_ = EPOLLOUT;
    retry_at_ = Clock::now() + kRetryDelay;
    if (load_.running) load_.errors.add(why);
  }

  RrLoad& load_;
  int fd_ = -1;
  bool connecting_ = false;
  std::uint32_t events_ = EPOLLOUT;
  std::size_t sent_ = 0;
  std::size_t got_ = 0;
  Clock::time_point sent_at_;
  Clock::time_point retry_at_;
};

}  // namespace

int run_rr(const Options& opts) {
  auto load = std::make_unique<RrLoad>();
  if (!target_option(opts, "rr", load->target)) return 2;
  double duration = opts.seconds("duration", 10.0);
  auto concurrency = opts.count("concurrency", 32);
  auto size = opts.count("size", 64);
  if (concurrency < 1 || concurrency > 10000 || size < 1 || size > 65536) {
    std::fprintf(stderr, "loadgen rr: --concurrency 1..10000, --size 1..65536\n");
    return 2;
  }
  raise_fd_limit();
  load->request.assign(size, 'r');
  StopSignal stop(load->poller, false);

  std::vector<std::unique_ptr<RrSlot>> slots;
  for (std::uint64_t i = 0; i < concurrency; ++i) slots.push_back(std::make_unique<RrSlot>(*load));
  auto start = Clock::now();
  auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(duration));
  for (auto& s : slots) s->start();
  run_until(load->poller, stop, deadline, [] { return false; }, [&] {
    auto now = Clock::now();
    for (auto& s : slots) {
      if (s->ready_to_start(now)) s->start();
    }
  });
  load->running = false;
  double elapsed = seconds_between(start, Clock::now());
  for (auto& s : slots) s->abandon();

  JsonLine line;
  line.add("load", std::string("rr")).add("target", load->target.text);
  line.add("concurrency", concurrency).add("size", size).add("connects", load->connects);
  line.add("requests", load->requests).add("rate", static_cast<double>(load->requests) / elapsed);
  line.add("p50_us", load->latency.percentile_us(50)).add("p99_us", load->latency.percentile_us(99));
  add_common(line, elapsed, load->errors);
  line.print();
  return load->requests > 0 ? 0 : 1;
}

}  // namespace loadgen
