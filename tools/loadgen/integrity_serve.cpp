// The backend side of the integrity protocol (see integrity.hpp): read the
// header, then at once verify the upload and send the download; after both,
// the trailer and a FIN.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <sys/socket.h>
#include <unistd.h>

#include "integrity.hpp"
#include "net.hpp"

namespace loadgen::integrity {
namespace {

constexpr std::size_t kReadBuffer = 256 * 1024;
constexpr std::size_t kSendChunk = 64 * 1024;

char* read_buffer() {
  static std::vector<char> buf(kReadBuffer);  // one process, one thread: shared
  return buf.data();
}

// One line to stdout, flushed: the runner reads it while this process may
// be killed at any moment.
void report(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

class IntegrityConn : public Handler {
 public:
  IntegrityConn(Poller& poller, int fd) : poller_(poller), fd_(fd) {
    set_linger(fd_, true);
    poller_.add(fd_, EPOLLIN, this);
  }

  void on_event(std::uint32_t events) override {
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
      if (!on_readable()) return;
    }
    if (have_header_ && !send_some()) return;
    if (trailer_sent_ && eof_seen_) return finish();
    interest();
  }

 private:
  // False when the connection is gone.
  bool on_readable() {
    char* buf = read_buffer();
    for (int i = 0; i < 4 && !eof_seen_; ++i) {
      ssize_t n = read(fd_, buf, kReadBuffer);
      if (n < 0) {
        if (errno == EAGAIN) return true;
        abort_conn();  // reset by the proxy: the client's side went away
        return false;
      }
      if (n == 0) {
        if (!have_header_ || up_got_ < header_.up) {
          report("short " + std::to_string(header_.session) + " " + std::to_string(up_got_) + " " +
                 std::to_string(header_.up));
          abort_conn();
          return false;
        }
        eof_seen_ = true;
        return true;
      }
      std::size_t used = 0;
      if (!have_header_) {
        used = std::min<std::size_t>(static_cast<std::size_t>(n), kHeaderSize - header_got_);
        std::memcpy(header_bytes_ + header_got_, buf, used);
        header_got_ += used;
        if (header_got_ < kHeaderSize) continue;
        if (!decode_header(header_bytes_, header_)) {
          report("bad_header");
          abort_conn();
          return false;
        }
        have_header_ = true;
      }
      const std::size_t len = static_cast<std::size_t>(n) - used;
      if (len > header_.up - up_got_) {
        report("extra " + std::to_string(header_.session));
        abort_conn();
        return false;
      }
      const std::size_t bad = stream_mismatch(header_.seed, up_got_, buf + used, len);
      if (bad != len) {
        report("corrupt " + std::to_string(header_.session) + " " + std::to_string(up_got_ + bad));
        abort_conn();
        return false;
      }
      up_got_ += len;
    }
    return true;
  }

  // Sends the download, then the trailer once the upload is verified too.
  // False when the connection is gone.
  bool send_some() {
    for (int i = 0; i < 8; ++i) {
      if (out_pos_ == out_len_) {
        if (down_sent_ < header_.down) {
          out_len_ = static_cast<std::size_t>(std::min<std::uint64_t>(kSendChunk, header_.down - down_sent_));
          stream_fill(header_.seed ^ kDownSalt, down_sent_, out_.data(), out_len_);
          down_sent_ += out_len_;
          out_pos_ = 0;
        } else if (!trailer_queued_ && up_got_ == header_.up) {
          report("done " + std::to_string(header_.session));
          encode_trailer(Trailer{header_.session, up_got_}, out_.data());
          out_len_ = kTrailerSize;
          out_pos_ = 0;
          trailer_queued_ = true;
        } else {
          return true;  // waiting for upload bytes
        }
      }
      ssize_t w = send(fd_, out_.data() + out_pos_, out_len_ - out_pos_, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EAGAIN) return true;
        abort_conn();
        return false;
      }
      out_pos_ += static_cast<std::size_t>(w);
      if (trailer_queued_ && out_pos_ == out_len_ && !trailer_sent_) {
        trailer_sent_ = true;
        set_linger(fd_, false);  // from here on a close is a clean one
        shutdown(fd_, SHUT_WR);
        return true;
      }
    }
    return true;
  }

  // Bytes queued or still to make: download, or a trailer that is due.
  bool more_to_send() const {
    return out_pos_ < out_len_ || down_sent_ < header_.down || (!trailer_queued_ && up_got_ == header_.up);
  }

  void interest() {
    std::uint32_t want = eof_seen_ ? 0U : std::uint32_t{EPOLLIN};
    if (have_header_ && more_to_send()) want |= EPOLLOUT;
    if (want != events_) {
      events_ = want;
      poller_.modify(fd_, want, this);
    }
  }

  void abort_conn() {
    set_linger(fd_, true);
    finish();
  }

  void finish() {
    close(fd_);
    delete this;
  }

  Poller& poller_;
  int fd_;
  std::uint32_t events_ = EPOLLIN;
  char header_bytes_[kHeaderSize] = {};
  std::size_t header_got_ = 0;
  bool have_header_ = false;
  Header header_;
  std::uint64_t up_got_ = 0;
  std::uint64_t down_sent_ = 0;
  std::vector<char> out_ = std::vector<char>(kSendChunk);
  std::size_t out_pos_ = 0;
  std::size_t out_len_ = 0;
  bool trailer_queued_ = false;
  bool trailer_sent_ = false;
  bool eof_seen_ = false;
};

}  // namespace

void set_linger(int fd, bool reset_on_close) {
  linger l{};
  l.l_onoff = reset_on_close ? 1 : 0;
  l.l_linger = 0;
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
}

void serve_connection(Poller& poller, int fd) { new IntegrityConn(poller, fd); }

}  // namespace loadgen::integrity
