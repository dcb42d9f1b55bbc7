// `loadgen integrity`: sessions of the integrity protocol (integrity.hpp)
// through the proxy, C at a time, until --bytes of payload (both ways
// together) have crossed it or are planned in running sessions. Every byte
// that comes back is checked.
//
// Output, one line each, flushed:
//   progress MOVED COMPLETED FAILED   every 20 ms (MOVED: payload bytes sent
//                                     plus received so far, all sessions)
//   ok SESSION                        a complete session
//   failed {json}                     a session that did not complete: id,
//                                     local port, kind, sizes, progress
//   {json}                            the summary, last
// A session is complete only with exactly the announced download, verified,
// a valid trailer confirming the whole upload, and then EOF. Kinds of
// failure: reset (ECONNRESET or EPIPE), short_eof (EOF before the end the
// header announced), corrupt (a byte, the trailer or the length is wrong),
// stalled (nothing moved for --stall seconds), unfinished (still running at
// --timeout), error (anything else, with its text).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client_util.hpp"
#include "commands.hpp"
#include "integrity.hpp"

namespace loadgen {
namespace {

using namespace integrity;

constexpr std::size_t kChunk = 64 * 1024;

struct Tally {
  std::uint64_t started = 0;
  std::uint64_t completed = 0;
  std::uint64_t reset = 0;
  std::uint64_t short_eof = 0;
  std::uint64_t corrupt = 0;
  std::uint64_t stalled = 0;
  std::uint64_t unfinished = 0;
  std::uint64_t error = 0;
  std::uint64_t failed() const { return reset + short_eof + corrupt + stalled + unfinished + error; }
};

struct IntegrityLoad {
  Poller poller;
  Target target;
  std::uint64_t budget = 0;   // payload bytes to plan, both ways together
  std::uint64_t planned = 0;
  std::uint64_t max_session = 0;
  std::uint64_t seed = 0;
  double stall_s = 60;
  std::mt19937_64 rng;
  std::uint64_t next_session = 1;
  std::uint64_t moved = 0;              // payload bytes sent and received
  std::uint64_t down_verified = 0;      // download bytes checked, every session
  std::uint64_t completed_bytes = 0;    // up + down of complete sessions
  std::uint64_t completed_up = 0;       // upload bytes the backends confirmed
  Tally tally;
  std::vector<char> scratch = std::vector<char>(256 * 1024);
};

// Sizes of one session: a total drawn log-uniformly between 4 KiB and
// max_session, split as upload-heavy, download-heavy, or both ways.
void pick_sizes(IntegrityLoad& load, Header& h) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const double lo = std::log(4096.0);
  const double hi = std::log(static_cast<double>(std::max<std::uint64_t>(load.max_session, 8192)));
  const auto total = static_cast<std::uint64_t>(std::exp(lo + (hi - lo) * unit(load.rng)));
  const auto small = static_cast<std::uint64_t>(unit(load.rng) * 4096);
  switch (load.rng() % 3) {
    case 0: h.up = total; h.down = small; break;
    case 1: h.up = small; h.down = total; break;
    default:
      h.up = static_cast<std::uint64_t>(static_cast<double>(total) * unit(load.rng));
      h.down = total - h.up;
      break;
  }
}

class IntegritySlot : public Handler {
 public:
  explicit IntegritySlot(IntegrityLoad& load) : load_(load) {}
  ~IntegritySlot() override {
    if (fd_ >= 0) close(fd_);
  }
  IntegritySlot(const IntegritySlot&) = delete;
  IntegritySlot& operator=(const IntegritySlot&) = delete;

  bool busy() const { return fd_ >= 0; }

  // Starts the next session; false when the budget is spent.
  bool start() {
    if (load_.planned >= load_.budget) return false;
    header_ = Header{};
    header_.session = load_.next_session++;
    header_.seed = mix64(load_.seed ^ mix64(header_.session));
    pick_sizes(load_, header_);
    load_.planned += header_.up + header_.down;
    ++load_.tally.started;
    up_sent_ = down_got_ = trailer_got_ = 0;
    out_pos_ = out_len_ = 0;
    header_sent_ = fin_sent_ = false;
    connecting_ = true;
    port_ = 0;
    started_ = last_progress_ = Clock::now();
    fd_ = start_connect(load_.target);
    if (fd_ < 0) {
      fail("error", errno_text("connect", errno));
      return true;
    }
    events_ = EPOLLOUT;
    load_.poller.add(fd_, EPOLLOUT, this);
    return true;
  }

  void on_event(std::uint32_t events) override {
    if (connecting_) {
      int err = connect_result(fd_);
      // A reset before the connect is seen complete: sluice accepted, its
      // server reset at once, and sluice passed the reset on.
      if (err == ECONNRESET) return fail("reset", errno_text("connect", err));
      if (err != 0) return fail("error", errno_text("connect", err));
      connecting_ = false;
      sockaddr_storage local{};
      socklen_t len = sizeof local;
      if (getsockname(fd_, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
        port_ = ntohs(local.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&local)->sin6_port
                                                  : reinterpret_cast<sockaddr_in*>(&local)->sin_port);
      }
      encode_header(header_, out_);
      out_len_ = kHeaderSize;
    }
    // Reads first: a FIN or reset that has arrived says more than a send error.
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
      if (!on_readable()) return;
    }
    if ((events & (EPOLLOUT | EPOLLERR)) || out_pos_ < out_len_ || !fin_sent_) {
      if (!send_some()) return;
    }
    interest();
  }

  // Called every wakeup: a session that moved nothing for --stall seconds.
  void check_stall(Clock::time_point now) {
    if (busy() && seconds_between(last_progress_, now) > load_.stall_s) {
      fail("stalled", "nothing moved for " + std::to_string(load_.stall_s) + " s");
    }
  }

  void abandon() {
    if (busy()) fail("unfinished", "still running at the deadline");
  }

 private:
  // False when the session ended.
  bool on_readable() {
    char* buf = load_.scratch.data();
    for (int i = 0; i < 4; ++i) {
      ssize_t n = read(fd_, buf, load_.scratch.size());
      if (n < 0) {
        if (errno == EAGAIN) return true;
        if (errno == ECONNRESET || errno == EPIPE) return fail("reset", errno_text("read", errno)), false;
        return fail("error", errno_text("read", errno)), false;
      }
      if (n == 0) return on_eof(), false;
      last_progress_ = Clock::now();
      load_.moved += static_cast<std::uint64_t>(n);
      std::size_t pos = 0;
      const auto len = static_cast<std::size_t>(n);
      if (down_got_ < header_.down) {
        const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(len, header_.down - down_got_));
        const std::size_t bad = stream_mismatch(header_.seed ^ kDownSalt, down_got_, buf, take);
        load_.down_verified += bad;
        if (bad != take) {
          return fail("corrupt", "download byte " + std::to_string(down_got_ + bad) + " differs"), false;
        }
        down_got_ += take;
        pos = take;
      }
      if (pos < len) {
        if (len - pos > kTrailerSize - trailer_got_) {
          return fail("corrupt", "more bytes than the download and the trailer"), false;
        }
        std::memcpy(trailer_ + trailer_got_, buf + pos, len - pos);
        trailer_got_ += len - pos;
      }
    }
    return true;
  }

  void on_eof() {
    if (down_got_ < header_.down || trailer_got_ < kTrailerSize) {
      return fail("short_eof", "EOF after " + std::to_string(down_got_) + " of " + std::to_string(header_.down) +
                                   " download bytes and " + std::to_string(trailer_got_) + " trailer bytes");
    }
    Trailer t;
    if (!decode_trailer(trailer_, t) || t.session != header_.session) return fail("corrupt", "bad trailer");
    if (t.up_verified != header_.up || up_sent_ != header_.up) {
      return fail("corrupt", "trailer confirms " + std::to_string(t.up_verified) + " of " +
                                 std::to_string(header_.up) + " upload bytes");
    }
    ++load_.tally.completed;
    load_.completed_bytes += header_.up + header_.down;
    load_.completed_up += header_.up;
    std::printf("ok %llu\n", static_cast<unsigned long long>(header_.session));
    end();
  }

  // False when the session ended.
  bool send_some() {
    for (int i = 0; i < 8; ++i) {
      if (out_pos_ == out_len_) {
        if (up_sent_ == header_.up) {
          if (!fin_sent_) {
            shutdown(fd_, SHUT_WR);
            fin_sent_ = true;
          }
          return true;
        }
        out_len_ = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, header_.up - up_sent_));
        stream_fill(header_.seed, up_sent_, out_, out_len_);
        out_pos_ = 0;
      }
      ssize_t w = send(fd_, out_ + out_pos_, out_len_ - out_pos_, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EAGAIN) return true;
        if (errno == ECONNRESET || errno == EPIPE) return fail("reset", errno_text("send", errno)), false;
        return fail("error", errno_text("send", errno)), false;
      }
      out_pos_ += static_cast<std::size_t>(w);
      last_progress_ = Clock::now();
      if (header_sent_) {
        up_sent_ += static_cast<std::uint64_t>(w);
        load_.moved += static_cast<std::uint64_t>(w);
      }
      // The header is done: what follows is upload.
      if (!header_sent_ && out_pos_ == out_len_) header_sent_ = true, out_len_ = out_pos_ = 0;
    }
    return true;
  }

  void interest() {
    std::uint32_t want = EPOLLIN;
    if (out_pos_ < out_len_ || !fin_sent_) want |= EPOLLOUT;
    if (want != events_) {
      events_ = want;
      load_.poller.modify(fd_, want, this);
    }
  }

  void fail(const char* kind, const std::string& why) {
    Tally& t = load_.tally;
    std::string k = kind;
    if (k == "reset") ++t.reset;
    else if (k == "short_eof") ++t.short_eof;
    else if (k == "corrupt") ++t.corrupt;
    else if (k == "stalled") ++t.stalled;
    else if (k == "unfinished") ++t.unfinished;
    else ++t.error;
    JsonLine line;
    line.add("session", header_.session).add("port", std::uint64_t{port_}).add("kind", k).add("why", why);
    line.add("up", header_.up).add("down", header_.down).add("up_sent", up_sent_).add("down_got", down_got_);
    line.add("trailer_got", std::uint64_t{trailer_got_});
    line.add("seconds", seconds_between(started_, Clock::now()));
    std::printf("failed %s\n", line.str().c_str());
    // What a failed session did not move goes back to the budget, so that
    // --bytes is what crosses the proxy; one that moved nothing keeps its
    // share, so a proxy refusing everything ends the run instead of it
    // spinning until the deadline.
    if (up_sent_ + down_got_ > 0) load_.planned -= header_.up + header_.down - up_sent_ - down_got_;
    end();
  }

  void end() {
    std::fflush(stdout);
    close(fd_);
    fd_ = -1;
  }

  IntegrityLoad& load_;
  int fd_ = -1;
  bool connecting_ = false;
  std::uint32_t events_ = 0;
  Header header_;
  std::uint16_t port_ = 0;
  char out_[kChunk];
  std::size_t out_pos_ = 0;
  std::size_t out_len_ = 0;
  bool header_sent_ = false;
  bool fin_sent_ = false;
  std::uint64_t up_sent_ = 0;
  std::uint64_t down_got_ = 0;
  char trailer_[kTrailerSize] = {};
  std::size_t trailer_got_ = 0;
  Clock::time_point started_;
  Clock::time_point last_progress_;
};

}  // namespace

int run_integrity(const Options& opts) {
  auto load = std::make_unique<IntegrityLoad>();
  if (!target_option(opts, "integrity", load->target)) return 2;
  load->budget = opts.count("bytes", 1ULL << 30);
  load->max_session = opts.count("max-session", 32ULL << 20);
  load->seed = opts.count("seed", 1);
  load->stall_s = opts.seconds("stall", 60.0);
  const auto concurrency = opts.count("concurrency", 32);
  const double timeout = opts.seconds("timeout", 1800.0);
  if (concurrency < 1 || concurrency > 1000 || load->max_session < 1) {
    std::fprintf(stderr, "loadgen integrity: --concurrency 1..1000, --max-session >= 1\n");
    return 2;
  }
  load->rng.seed(load->seed);
  raise_fd_limit();
  StopSignal stop(load->poller, false);

  std::vector<std::unique_ptr<IntegritySlot>> slots;
  for (std::uint64_t i = 0; i < concurrency; ++i) slots.push_back(std::make_unique<IntegritySlot>(*load));
  const auto start = Clock::now();
  const auto deadline = after_seconds(start, timeout);
  auto next_progress = start;
  bool more = true;
  auto top_up = [&] {
    for (auto& s : slots) {
      while (more && !s->busy()) more = s->start();
    }
  };
  auto all_idle = [&] {
    return std::none_of(slots.begin(), slots.end(), [](const auto& s) { return s->busy(); });
  };
  top_up();
  run_until(load->poller, stop, deadline, [&] { return !more && all_idle(); }, [&] {
    const auto now = Clock::now();
    for (auto& s : slots) s->check_stall(now);
    top_up();
    if (now >= next_progress) {
      std::printf("progress %llu %llu %llu\n", static_cast<unsigned long long>(load->moved),
                  static_cast<unsigned long long>(load->tally.completed),
                  static_cast<unsigned long long>(load->tally.failed()));
      std::fflush(stdout);
      next_progress = after_seconds(now, 0.02);
    }
  });
  const double elapsed = seconds_between(start, Clock::now());
  for (auto& s : slots) s->abandon();

  const Tally& t = load->tally;
  JsonLine line;
  line.add("load", std::string("integrity")).add("target", load->target.text);
  line.add("concurrency", concurrency).add("sessions", t.started).add("completed", t.completed);
  line.add("failed", t.failed()).add("reset", t.reset).add("short_eof", t.short_eof);
  line.add("corrupt", t.corrupt).add("stalled", t.stalled).add("unfinished", t.unfinished);
  line.add("error", t.error).add("moved", load->moved).add("completed_bytes", load->completed_bytes);
  line.add("completed_up", load->completed_up).add("down_verified", load->down_verified);
  line.add("elapsed", elapsed).add("cpu_s", cpu_seconds_self());
  line.print();
  return t.completed > 0 && t.corrupt == 0 && t.stalled == 0 && t.unfinished == 0 ? 0 : 1;
}

}  // namespace loadgen
