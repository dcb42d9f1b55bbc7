// `loadgen conn`: short connections — connect, send N bytes, read N back, close.
#include <cerrno>
#include <memory>
#include <vector>

#include <unistd.h>

#include "commands.hpp"
#include "slot_driver.hpp"
#include "tcp_slot.hpp"

namespace loadgen {
namespace {

struct ConnLoad : SlotLoad {
  std::vector<char> payload;
  std::vector<char> scratch = std::vector<char>(64 * 1024);
};

// One concurrent client: loops over fresh connections while the load runs.
class ConnSlot : public TcpSlot<ConnLoad> {
 public:
  using TcpSlot::TcpSlot;

  void start() {
    if (!load_.running) return;
    started_ = Clock::now();
    sent_ = 0;
    got_ = 0;
    connect();
  }

  void on_event(std::uint32_t /*events*/) override {
    if (connecting_ && !finish_connect()) return;
    const std::size_t size = load_.payload.size();
    if (sent_ < size) {
      long w = send_some(fd_, load_.payload.data() + sent_, size - sent_);
      if (w < 0) return fail(errno_text("send", errno));
      sent_ += static_cast<std::size_t>(w);
      if (sent_ == size) load_.poller.modify(fd_, EPOLLIN, this);
      return;
    }
    std::size_t n = read_reply("connection closed before the full reply");
    if (n == 0) return;
    got_ += n;
    if (got_ < size) return;
    auto now = Clock::now();
    close(fd_);
    fd_ = -1;
    if (!load_.running) return;
    ++load_.ops;
    load_.latency.add(now - started_);
    start();
  }

 private:
  std::size_t sent_ = 0;
  std::size_t got_ = 0;
  Clock::time_point started_;
};

}  // namespace

int run_conn(const Options& opts) {
  auto load = std::make_unique<ConnLoad>();
  if (!target_option(opts, "conn", load->target)) return 2;
  auto o = slot_options(opts, "conn", 32, {"payload", 64, 1u << 20, "1m"});
  if (!o) return 2;
  raise_fd_limit();
  load->payload.assign(o->size, 'c');
  StopSignal stop(load->poller, false);

  double elapsed = drive_slots<ConnSlot>(*load, stop, o->concurrency, o->duration);
  return report_slot_load("conn", *load, o->concurrency, elapsed, "ops",
                          [&](JsonLine& line) { line.add("payload", o->size); });
}

}  // namespace loadgen
