#include "log/logging.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <spdlog/async.h>
#include <spdlog/details/file_helper.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

namespace sluice {

namespace {

// Queue depth of the logging thread. Each slot holds one formatted record
// (a few hundred bytes), so this bounds the memory a stalled destination
// can pin.
constexpr std::size_t kQueueRecords = 4096;

// A sink writing to one LogOutput. Writes happen on the logging thread; a
// reopen or a new destination is asked for from another thread and taken
// up on the logging thread at the next flush, which the asker queues behind
// every record already logged.
class OutputSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  // `flush_each`: flush after every record (the error log: a line is on disk
  // or on the terminal as soon as it is written).
  OutputSink(LogOutput output, bool flush_each)
      : is_file_(output.is_file()), output_(std::move(output)), flush_each_(flush_each) {}

  void request_reopen() { reopen_.store(true, std::memory_order_release); }
  void request_switch(LogOutput next) {
    is_file_.store(next.is_file(), std::memory_order_relaxed);
    std::lock_guard lock(pending_mu_);
    pending_ = std::make_unique<LogOutput>(std::move(next));
  }
  // Whether the output is a file, counting one waiting to take over. Never
  // waits for the logging thread, which may be stuck writing to a full pipe.
  bool is_file() const { return is_file_.load(std::memory_order_relaxed); }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    reopen_if_asked();
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    output_.write(formatted);
    if (flush_each_) output_.flush();
  }
  void flush_() override {
    output_.flush();
    std::unique_ptr<LogOutput> next;
    {
      std::lock_guard lock(pending_mu_);
      next = std::move(pending_);
    }
    if (next) {
      output_ = std::move(*next);
      reopen_.store(false, std::memory_order_release);  // just opened
    }
    reopen_if_asked();
  }

 private:
  void reopen_if_asked() {
    if (reopen_.exchange(false, std::memory_order_acq_rel)) output_.reopen();
  }

  std::atomic<bool> is_file_;
  LogOutput output_;  // under mutex_ (base_sink's)
  const bool flush_each_;
  std::atomic<bool> reopen_{false};
  std::mutex pending_mu_;
  std::unique_ptr<LogOutput> pending_;  // under pending_mu_
};

// Every sink and logger made here, so SIGUSR1 can reach them all (access
// loggers are not in spdlog's registry: each Snapshot owns its own).
std::mutex files_mu;
std::vector<std::weak_ptr<OutputSink>>& open_files() {
  static std::vector<std::weak_ptr<OutputSink>> files;
  return files;
}
// The error log's sink and logger (the default logger), for a reload.
std::shared_ptr<OutputSink> error_sink;    // under files_mu
std::shared_ptr<spdlog::logger> error_logger;  // under files_mu
std::vector<std::weak_ptr<spdlog::logger>>& made_loggers() {
  static std::vector<std::weak_ptr<spdlog::logger>> loggers;
  return loggers;
}

std::shared_ptr<spdlog::details::thread_pool> pool() {
  static std::once_flag once;
  std::call_once(once, [] { spdlog::init_thread_pool(kQueueRecords, 1); });
  return spdlog::thread_pool();
}

}  // namespace

LogOutput::LogOutput(const std::string& target) : target_(target) {
  if (target == "stderr") {
    stream_ = stderr;
  } else if (target == "stdout") {
    stream_ = stdout;
  } else {
    file_ = std::make_unique<spdlog::details::file_helper>();
    try {
      file_->open(target, false);
    } catch (const spdlog::spdlog_ex& e) {
      throw std::runtime_error(e.what());
    }
  }
}

LogOutput::~LogOutput() = default;
LogOutput::LogOutput(LogOutput&& other) noexcept = default;
LogOutput& LogOutput::operator=(LogOutput&& other) noexcept = default;

void LogOutput::write(const spdlog::memory_buf_t& record) {
  if (file_) {
    file_->write(record);
  } else {
    std::fwrite(record.data(), 1, record.size(), stream_);
  }
}

void LogOutput::flush() {
  if (file_) {
    file_->flush();
  } else {
    std::fflush(stream_);
  }
}

void LogOutput::reopen() {
  if (!file_) return;
  try {
    file_->reopen(false);
  } catch (const spdlog::spdlog_ex&) {
    // Keep writing to the old file rather than losing records; the next
    // SIGUSR1 tries again.
  }
}

namespace {

std::shared_ptr<spdlog::logger> logger_on(const std::string& name, std::shared_ptr<OutputSink> sink,
                                          const std::string& pattern) {
  auto logger = std::make_shared<spdlog::async_logger>(name, sink, pool(),
                                                       spdlog::async_overflow_policy::overrun_oldest);
  logger->set_pattern(pattern);
  std::lock_guard lock(files_mu);
  auto& files = open_files();
  std::erase_if(files, [](const auto& w) { return w.expired(); });
  files.push_back(sink);
  auto& loggers = made_loggers();
  std::erase_if(loggers, [](const auto& w) { return w.expired(); });
  loggers.push_back(logger);
  return logger;
}

}  // namespace

std::shared_ptr<spdlog::logger> make_logger(const std::string& name, const std::string& target,
                                            const std::string& pattern) {
  return logger_on(name, std::make_shared<OutputSink>(LogOutput(target), false), pattern);
}

void init_error_log(const std::string& level, const std::string& target) {
  // Flushed by the sink after each record rather than with flush_on(): a
  // flush in the logging queue then means only a reopen or a switch.
  auto sink = std::make_shared<OutputSink>(LogOutput(target), true);
  auto logger = logger_on("sluice", sink, "%Y-%m-%dT%H:%M:%S.%e [%l] %v");
  logger->set_level(spdlog::level::from_str(level));
  {
    std::lock_guard lock(files_mu);
    error_sink = sink;
    error_logger = logger;
  }
  spdlog::set_default_logger(std::move(logger));
}

void set_error_log_level(const std::string& level) {
  std::lock_guard lock(files_mu);
  if (error_logger) error_logger->set_level(spdlog::level::from_str(level));
}

void set_error_log_output(LogOutput output) {
  std::lock_guard lock(files_mu);
  if (!error_sink) return;
  error_sink->request_switch(std::move(output));
  // Queued behind every record logged so far: the switch happens after them.
  error_logger->flush();
}

std::size_t reopen_log_files() {
  std::lock_guard lock(files_mu);
  std::size_t n = 0;
  for (const auto& w : open_files()) {
    if (auto f = w.lock(); f && f->is_file()) {
      f->request_reopen();
      ++n;
    }
  }
  // A flush goes through the queue after every record already in it, so the
  // files reopen now even if nothing else is logged for a while.
  for (const auto& w : made_loggers()) {
    if (auto l = w.lock()) l->flush();
  }
  return n;
}

std::uint64_t dropped_log_records() {
  return spdlog::thread_pool() ? spdlog::thread_pool()->overrun_counter() : 0;
}

void DropReporter::tick() {
  const std::uint64_t now = dropped_log_records();
  if (now != seen_) {  // still dropping: wait until the destination drains
    seen_ = now;
    return;
  }
  if (now == reported_) return;
  spdlog::warn("{} log record(s) were dropped because a log destination could not keep up", now - reported_);
  reported_ = now;
}

bool shutdown_logging(std::chrono::milliseconds timeout) {
  auto tp = spdlog::thread_pool();
  if (!tp) return true;
  spdlog::default_logger_raw()->flush();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (tp->queue_size() > 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  tp.reset();
  {
    std::lock_guard lock(files_mu);
    error_sink.reset();
    error_logger.reset();
  }
  spdlog::shutdown();
  return true;
}

}  // namespace sluice
