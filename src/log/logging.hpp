// Where log records go. Every logger is asynchronous: the data path only
// queues a record; one background thread writes it. A destination that stops
// draining (a full pipe, a stuck disk) never stalls a session: once the
// queue is full the oldest records are dropped and counted, and the count is
// reported when the destination drains again (see DropReporter).
//
// Log files are reopened on request (SIGUSR1): logrotate renames the file,
// signals, and the next record goes to a new file at the old path. The
// reopen runs on the logging thread, in queue order, so no record is lost or
// written out of order.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include <spdlog/common.h>

namespace spdlog {
class logger;
namespace details {
class file_helper;
}
}  // namespace spdlog

namespace sluice {

// A log destination: "stderr", "stdout" or a file path (appended to, created
// if missing). Opened by the constructor, so that a reload can open a new
// error_log before it commits and fail when the path cannot be opened.
class LogOutput {
 public:
  // Throws std::runtime_error when the file cannot be opened.
  explicit LogOutput(const std::string& target);
  ~LogOutput();
  LogOutput(LogOutput&& other) noexcept;
  LogOutput& operator=(LogOutput&& other) noexcept;

  const std::string& target() const { return target_; }
  bool is_file() const { return file_ != nullptr; }
  void write(const spdlog::memory_buf_t& record);
  void flush();
  // A file only: open the path again (after logrotate renamed it). Keeps
  // the old file when the path cannot be opened.
  void reopen();

 private:
  std::string target_;
  std::FILE* stream_ = nullptr;                         // stderr or stdout
  std::unique_ptr<spdlog::details::file_helper> file_;  // or a file
};

// A logger for `target`: "stderr", "stdout" or a file path (appended to,
// created if missing). `pattern` is spdlog's. Throws std::runtime_error when
// the file cannot be opened.
std::shared_ptr<spdlog::logger> make_logger(const std::string& name, const std::string& target,
                                            const std::string& pattern);

// Installs the error log (spdlog's default logger) at `level` ("info", ...)
// writing to `target`. Throws std::runtime_error as make_logger does.
void init_error_log(const std::string& level, const std::string& target);

// A reload's log_level for the error log; takes effect at once.
void set_error_log_level(const std::string& level);

// A reload's error_log: records logged before this call go to the old
// destination, the rest to `output` (the switch runs on the logging thread,
// in queue order, like a reopen).
void set_error_log_output(LogOutput output);

// Asks every open log file to reopen its path before its next write.
// Returns how many files will be reopened.
std::size_t reopen_log_files();

// Records dropped so far because a destination could not keep up.
std::uint64_t dropped_log_records();

// Reports dropped records once, after the fact: call tick() periodically
// (the control loop does, once a second); it logs a warning with the number
// dropped when drops have stopped growing since the last tick.
class DropReporter {
 public:
  void tick();

 private:
  std::uint64_t reported_ = 0;
  std::uint64_t seen_ = 0;
};

// Writes out what is queued and stops the logging thread. Returns false,
// leaving the thread alone, when the queue did not drain within `timeout`
// (a stalled destination must not hang the exit).
bool shutdown_logging(std::chrono::milliseconds timeout);

}  // namespace sluice
