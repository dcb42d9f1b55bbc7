// `loadgen idle`: open N proxied connections, check each with one small echo
// round trip, print "ready N", then hold them until stdin closes or SIGTERM.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include <unistd.h>

#include "client_util.hpp"
#include "commands.hpp"

namespace loadgen {
namespace {

constexpr char kPing[] = "idle-ping";
constexpr std::size_t kPingSize = sizeof kPing - 1;
constexpr int kAttempts = 3;

struct IdleLoad {
  Poller poller;
  Target target;
  std::size_t in_flight = 0;
  std::size_t ready = 0;
  std::size_t dropped = 0;
  std::size_t gave_up = 0;
  bool holding = false;
  ErrorTally errors;
};

class IdleSlot : public Handler {
 public:
  enum class State { waiting, connecting, verifying, held, closed };

  explicit IdleSlot(IdleLoad& load) : load_(load) {}
  ~IdleSlot() override {
    if (fd_ >= 0) close(fd_);
  }
  IdleSlot(const IdleSlot&) = delete;
  IdleSlot& operator=(const IdleSlot&) = delete;

  State state() const { return state_; }

  void start() {
    ++attempts_;
    ++load_.in_flight;
    got_ = 0;
    fd_ = start_connect(load_.target);
    if (fd_ < 0) return fail(errno_text("connect", errno));
    state_ = State::connecting;
    load_.poller.add(fd_, EPOLLOUT, this);
  }

  void on_event(std::uint32_t /*events*/) override {
    if (state_ == State::connecting) {
      int err = connect_result(fd_);
      if (err != 0) return fail(errno_text("connect", err));
      // A few bytes on a fresh socket always fit in the send buffer.
      if (send_some(fd_, kPing, kPingSize) != static_cast<long>(kPingSize)) {
        return fail("short send of the ping");
      }
      state_ = State::verifying;
      load_.poller.modify(fd_, EPOLLIN, this);
      return;
    }
    char buf[64];
    ssize_t n = read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EAGAIN) return;
    if (state_ == State::held) {
      // Anything on a held connection means the proxy or backend dropped it.
      close(fd_);
      fd_ = -1;
      state_ = State::closed;
      ++load_.dropped;
      return;
    }
    if (n <= 0) return fail(n == 0 ? "closed before the echo" : errno_text("read", errno));
    if (got_ + static_cast<std::size_t>(n) > kPingSize ||
        std::memcmp(buf, kPing + got_, static_cast<std::size_t>(n)) != 0) {
      return fail("echo did not match");
    }
    got_ += static_cast<std::size_t>(n);
    if (got_ < kPingSize) return;
    state_ = State::held;
    --load_.in_flight;
    ++load_.ready;
  }

 private:
  void fail(const std::string& why) {
    load_.errors.add(why);
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    --load_.in_flight;
    if (attempts_ >= kAttempts) {
      state_ = State::closed;
      ++load_.gave_up;
    } else {
      state_ = State::waiting;
    }
  }

  IdleLoad& load_;
  int fd_ = -1;
  State state_ = State::waiting;
  int attempts_ = 0;
  std::size_t got_ = 0;
};

}  // namespace

int run_idle(const Options& opts) {
  auto load = std::make_unique<IdleLoad>();
  if (!target_option(opts, "idle", load->target)) return 2;
  auto count = opts.count("count", 1000);
  auto parallel = opts.count("connect-concurrency", 200);
  double timeout = opts.seconds("timeout", 60.0);
  double hold = opts.seconds("hold", 3600.0);
  if (count < 1 || count > 200000 || parallel < 1) {
    std::fprintf(stderr, "loadgen idle: --count 1..200000, --connect-concurrency >= 1\n");
    return 2;
  }
  raise_fd_limit();
  std::vector<std::unique_ptr<IdleSlot>> slots;
  for (std::uint64_t i = 0; i < count; ++i) slots.push_back(std::make_unique<IdleSlot>(*load));

  int exit_code = 0;
  double open_s = 0;
  auto start = Clock::now();
  {
    StopSignal stop(load->poller, false);
    auto deadline = after_seconds(start, timeout);
    std::size_t next = 0;
    auto feed = [&] {
      // Walk forward from the last start; failed slots are picked up on later passes.
      for (std::size_t scanned = 0; scanned < slots.size() && load->in_flight < parallel; ++scanned) {
        auto& s = slots[next];
        next = (next + 1) % slots.size();
        if (s->state() == IdleSlot::State::waiting) s->start();
      }
    };
    feed();
    run_until(load->poller, stop, deadline,
              [&] { return load->ready == slots.size() || load->ready + load->gave_up == slots.size(); },
              feed);
    open_s = seconds_between(start, Clock::now());
    if (stop.stopped()) exit_code = 1;
  }
  if (load->ready == slots.size()) {
    std::printf("ready %zu\n", load->ready);
    std::fflush(stdout);
    load->holding = true;
    StopSignal stop(load->poller, true);
    auto deadline = after_seconds(Clock::now(), hold);
    run_until(load->poller, stop, deadline, [] { return false; }, [] {});
  } else {
    load->errors.add("only " + std::to_string(load->ready) + " of " + std::to_string(count) +
                     " connections opened");
    exit_code = 1;
  }

  JsonLine line;
  line.add("load", std::string("idle")).add("target", load->target.text);
  line.add("count", count).add("opened", static_cast<std::uint64_t>(load->ready));
  line.add("dropped", static_cast<std::uint64_t>(load->dropped)).add("open_s", open_s);
  add_common(line, seconds_between(start, Clock::now()), load->errors);
  line.print();
  return load->dropped == 0 ? exit_code : 1;
}

}  // namespace loadgen
