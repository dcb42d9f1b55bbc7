// `loadgen conn`: short connections — connect, send N bytes, read N back, close.
#include <cerrno>
#include <cstdio>
#include <memory>
#include <vector>

#include <unistd.h>

#include "client_util.hpp"
#include "commands.hpp"

namespace loadgen {
namespace {

struct ConnLoad {
  Poller poller;
  Target target;
  std::vector<char> payload;
  std::vector<char> scratch = std::vector<char>(64 * 1024);
  bool running = true;
  std::uint64_t ops = 0;
  LatencyRecorder latency;
  ErrorTally errors;
};

// One concurrent client: loops over fresh connections while the load runs.
class ConnSlot : public Handler {
 public:
  explicit ConnSlot(ConnLoad& load) : load_(load) {}
  bool ready_to_start(Clock::time_point now) const { return fd_ < 0 && now >= retry_at_; }

  void start() {
    if (!load_.running) return;
    started_ = Clock::now();
    sent_ = 0;
    got_ = 0;
    fd_ = start_connect(load_.target);
    if (fd_ < 0) {
      load_.errors.add(errno_text("connect", errno));
      retry_at_ = Clock::now() + kRetryDelay;
      return;  // parked; the main loop retries
    }
    connecting_ = true;
    load_.poller.add(fd_, EPOLLOUT, this);
  }

  void on_event(std::uint32_t /*events*/) override {
    if (connecting_) {
      int err = connect_result(fd_);
      if (err != 0) return fail(errno_text("connect", err));
      connecting_ = false;
    }
    const std::size_t size = load_.payload.size();
    if (sent_ < size) {
      long w = send_some(fd_, load_.payload.data() + sent_, size - sent_);
      if (w < 0) return fail(errno_text("send", errno));
      sent_ += static_cast<std::size_t>(w);
      if (sent_ == size) load_.poller.modify(fd_, EPOLLIN, this);
      return;
    }
    ssize_t n = read(fd_, load_.scratch.data(), load_.scratch.size());
    if (n < 0) {
      if (errno == EAGAIN) return;
      return fail(errno_text("read", errno));
    }
    if (n == 0) return fail("connection closed before the full reply");
    got_ += static_cast<std::size_t>(n);
    if (got_ < size) return;
    auto now = Clock::now();
    close(fd_);
    fd_ = -1;
    if (!load_.running) return;
    ++load_.ops;
    load_.latency.add(now - started_);
    start();
  }

  void abandon() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  void fail(const std::string& why) {
    close(fd_);
    fd_ = -1;
    retry_at_ = Clock::now() + kRetryDelay;
    if (load_.running) load_.errors.add(why);
  }

  ConnLoad& load_;
  int fd_ = -1;
  bool connecting_ = false;
  std::size_t sent_ = 0;
  std::size_t got_ = 0;
  Clock::time_point started_;
  Clock::time_point retry_at_;
};

}  // namespace

int run_conn(const Options& opts) {
  auto load = std::make_unique<ConnLoad>();
  if (!target_option(opts, "conn", load->target)) return 2;
  double duration = opts.seconds("duration", 10.0);
  auto concurrency = opts.count("concurrency", 32);
  auto payload = opts.count("payload", 64);
  if (concurrency < 1 || concurrency > 10000 || payload < 1 || payload > (1u << 20)) {
    std::fprintf(stderr, "loadgen conn: --concurrency 1..10000, --payload 1..1m\n");
    return 2;
  }
  raise_fd_limit();
  load->payload.assign(payload, 'c');
  StopSignal stop(load->poller, false);

  std::vector<std::unique_ptr<ConnSlot>> slots;
  for (std::uint64_t i = 0; i < concurrency; ++i) slots.push_back(std::make_unique<ConnSlot>(*load));
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
  line.add("load", std::string("conn")).add("target", load->target.text);
  line.add("concurrency", concurrency).add("payload", payload);
  line.add("ops", load->ops).add("rate", static_cast<double>(load->ops) / elapsed);
  line.add("p50_us", load->latency.percentile_us(50)).add("p99_us", load->latency.percentile_us(99));
  add_common(line, elapsed, load->errors);
  line.print();
  return load->ops > 0 ? 0 : 1;
}

}  // namespace loadgen
