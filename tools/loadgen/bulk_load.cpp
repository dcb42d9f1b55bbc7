// `loadgen bulk`: move N bytes through the proxy on C connections.
//   --mode source  read N bytes from a source backend (download)
//   --mode sink    write N bytes to a sink backend, half-close, wait for its close
//   --mode echo    write N bytes to an echo backend and read them back
#include <cerrno>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <sys/socket.h>
#include <unistd.h>

#include "client_util.hpp"
#include "commands.hpp"

namespace loadgen {
namespace {

enum class BulkMode { source, sink, echo };

struct BulkLoad {
  Poller poller;
  Target target;
  BulkMode mode = BulkMode::source;
  std::vector<char> buffer = std::vector<char>(256 * 1024, 'b');
  std::uint64_t moved = 0;  // bytes received (source, echo) or sent (sink)
  std::size_t finished = 0;
  ErrorTally errors;
};

class BulkSlot : public Handler {
 public:
  BulkSlot(BulkLoad& load, std::uint64_t share) : load_(load), share_(share) {}
  ~BulkSlot() override {
    if (fd_ >= 0) close(fd_);
  }
  BulkSlot(const BulkSlot&) = delete;
  BulkSlot& operator=(const BulkSlot&) = delete;

  void start() {
    fd_ = start_connect(load_.target);
    if (fd_ < 0) return fail(errno_text("connect", errno));
    load_.poller.add(fd_, EPOLLOUT, this);
  }

  void on_event(std::uint32_t events) override {
    if (connecting_) {
      int err = connect_result(fd_);
      if (err != 0) return fail(errno_text("connect", err));
      connecting_ = false;
      return interest();
    }
    if ((events & (EPOLLOUT | EPOLLERR)) && sent_ < send_goal()) {
      std::size_t chunk = static_cast<std::size_t>(
          std::min<std::uint64_t>(send_goal() - sent_, load_.buffer.size()));
      long w = send_some(fd_, load_.buffer.data(), chunk);
      if (w < 0) return fail(errno_text("send", errno));
      sent_ += static_cast<std::uint64_t>(w);
      if (load_.mode == BulkMode::sink) load_.moved += static_cast<std::uint64_t>(w);
      if (sent_ == send_goal() && load_.mode == BulkMode::sink) shutdown(fd_, SHUT_WR);
    }
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
      for (int i = 0; i < 4; ++i) {
        ssize_t n = read(fd_, load_.buffer.data(), load_.buffer.size());
        if (n < 0) {
          if (errno == EAGAIN) break;
          return fail(errno_text("read", errno));
        }
        if (n == 0) {
          if (load_.mode == BulkMode::sink && sent_ == share_) return done();
          return fail("connection closed after " + std::to_string(got_) + " of " +
                      std::to_string(share_) + " bytes");
        }
        got_ += static_cast<std::uint64_t>(n);
        if (load_.mode != BulkMode::sink) load_.moved += static_cast<std::uint64_t>(n);
        if (load_.mode != BulkMode::sink && got_ >= share_) return done();
      }
    }
    interest();
  }

 private:
  std::uint64_t send_goal() const { return load_.mode == BulkMode::source ? 0 : share_; }

  void interest() {
    std::uint32_t want = EPOLLIN;
    if (sent_ < send_goal()) want |= EPOLLOUT;
    if (want != events_) {
      events_ = want;
      load_.poller.modify(fd_, want, this);
    }
  }

  void done() {
    close(fd_);
    fd_ = -1;
    ++load_.finished;
  }

  void fail(const std::string& why) {
    load_.errors.add(why);
    done();
  }

  BulkLoad& load_;
  std::uint64_t share_;
  int fd_ = -1;
  bool connecting_ = true;
  std::uint32_t events_ = EPOLLOUT;
  std::uint64_t sent_ = 0;
  std::uint64_t got_ = 0;
};

}  // namespace

int run_bulk(const Options& opts) {
  auto load = std::make_unique<BulkLoad>();
  if (!target_option(opts, "bulk", load->target)) return 2;
  std::string mode = opts.str("mode", "source");
  if (mode == "source") {
    load->mode = BulkMode::source;
  } else if (mode == "sink") {
    load->mode = BulkMode::sink;
  } else if (mode == "echo") {
    load->mode = BulkMode::echo;
  } else {
    std::fprintf(stderr, "loadgen bulk: --mode must be source, sink or echo\n");
    return 2;
  }
  auto bytes = opts.count("bytes", 1ULL << 30);
  auto concurrency = opts.count("concurrency", 4);
  double timeout = opts.seconds("timeout", 300.0);
  if (concurrency < 1 || concurrency > 1000 || bytes < concurrency) {
    std::fprintf(stderr, "loadgen bulk: --concurrency 1..1000 and --bytes >= concurrency\n");
    return 2;
  }
  raise_fd_limit();
  StopSignal stop(load->poller, false);

  std::vector<std::unique_ptr<BulkSlot>> slots;
  for (std::uint64_t i = 0; i < concurrency; ++i) {
    std::uint64_t share = bytes / concurrency + (i == 0 ? bytes % concurrency : 0);
    slots.push_back(std::make_unique<BulkSlot>(*load, share));
  }
  auto start = Clock::now();
  auto deadline = after_seconds(start, timeout);
  for (auto& s : slots) s->start();
  run_until(load->poller, stop, deadline, [&] { return load->finished == slots.size(); }, [] {});
  double elapsed = seconds_between(start, Clock::now());
  if (load->finished < slots.size()) load->errors.add("timed out before all bytes moved");

  JsonLine line;
  line.add("load", std::string("bulk")).add("target", load->target.text).add("mode", mode);
  line.add("concurrency", concurrency).add("bytes", load->moved);
  line.add("bytes_per_s", static_cast<double>(load->moved) / elapsed);
  add_common(line, elapsed, load->errors);
  line.print();
  return load->errors.count() == 0 ? 0 : 1;
}

}  // namespace loadgen
