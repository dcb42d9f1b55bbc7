// `loadgen rr`: request/response on persistent connections (echo backend).
#include <cerrno>
#include <memory>
#include <vector>

#include "commands.hpp"
#include "slot_driver.hpp"
#include "tcp_slot.hpp"

namespace loadgen {
namespace {

// An operation is one request and its reply; "requests" in the report.
struct RrLoad : SlotLoad {
  std::vector<char> request;
  std::vector<char> scratch = std::vector<char>(64 * 1024);
  std::uint64_t connects = 0;
};

// One persistent connection sending one request at a time.
class RrSlot : public TcpSlot<RrLoad> {
 public:
  using TcpSlot::TcpSlot;

  void start() {
    if (!load_.running) return;
    events_ = EPOLLOUT;  // what connect() registers for
    connect();
  }

  void on_event(std::uint32_t /*events*/) override {
    if (connecting_) {
      if (!finish_connect()) return;
      ++load_.connects;
      return send_request();
    }
    if (sent_ < load_.request.size()) return send_more();
    std::size_t n = read_reply("connection closed mid-request");
    if (n == 0) return;
    got_ += n;
    if (got_ < load_.request.size()) return;
    if (got_ > load_.request.size()) return fail("reply longer than the request");
    if (!load_.running) return;
    ++load_.ops;
    load_.latency.add(Clock::now() - sent_at_);
    send_request();
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

  std::uint32_t events_ = EPOLLOUT;
  std::size_t sent_ = 0;
  std::size_t got_ = 0;
  Clock::time_point sent_at_;
};

}  // namespace

int run_rr(const Options& opts) {
  auto load = std::make_unique<RrLoad>();
  if (!target_option(opts, "rr", load->target)) return 2;
  auto o = slot_options(opts, "rr", 32, {"size", 64, 65536, "65536"});
  if (!o) return 2;
  raise_fd_limit();
  load->request.assign(o->size, 'r');
  StopSignal stop(load->poller, false);

  double elapsed = drive_slots<RrSlot>(*load, stop, o->concurrency, o->duration);
  return report_slot_load("rr", *load, o->concurrency, elapsed, "requests",
                          [&](JsonLine& line) { line.add("size", o->size).add("connects", load->connects); });
}

}  // namespace loadgen
