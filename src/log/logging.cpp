#include "log/logging.hpp"

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include <spdlog/async.h>
#include <spdlog/details/file_helper.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace sluice {

namespace {

// Queue depth of the logging thread. Each slot holds one formatted record
// (a few hundred bytes), so this bounds the memory a stalled destination
// can pin.
constexpr std::size_t kQueueRecords = 4096;

// A file sink that reopens its path when asked. Writes happen on the logging
// thread; the request is a flag, so asking is safe from any thread.
class ReopenableFileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit ReopenableFileSink(const std::string& path) { file_.open(path, false); }

  void request_reopen() { reopen_.store(true, std::memory_order_release); }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    reopen_if_asked();
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    file_.write(formatted);
  }
  void flush_() override {
    reopen_if_asked();
    file_.flush();
  }

 private:
  void reopen_if_asked() {
    if (!reopen_.exchange(false, std::memory_order_acq_rel)) return;
    try {
      file_.reopen(false);
    } catch (const spdlog::spdlog_ex&) {
      // Keep writing to the old file rather than losing records; the next
      // SIGUSR1 tries again.
    }
  }

  spdlog::details::file_helper file_;
  std::atomic<bool> reopen_{false};
};

// Every file sink and logger made here, so SIGUSR1 can reach them all
// (access loggers are not in spdlog's registry: each Snapshot owns its own).
std::mutex files_mu;
std::vector<std::weak_ptr<ReopenableFileSink>>& open_files() {
  static std::vector<std::weak_ptr<ReopenableFileSink>> files;
  return files;
}
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

std::shared_ptr<spdlog::logger> make_logger(const std::string& name, const std::string& target,
                                            const std::string& pattern) {
  spdlog::sink_ptr sink;
  if (target == "stderr") {
    sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  } else if (target == "stdout") {
    sink = std::make_shared<spdlog::sinks::stdout_sink_mt>();
  } else {
    try {
      auto file = std::make_shared<ReopenableFileSink>(target);
      std::lock_guard lock(files_mu);
      auto& files = open_files();
      std::erase_if(files, [](const auto& w) { return w.expired(); });
      files.push_back(file);
      sink = std::move(file);
    } catch (const spdlog::spdlog_ex& e) {
      throw std::runtime_error(e.what());
    }
  }
  auto logger = std::make_shared<spdlog::async_logger>(name, std::move(sink), pool(),
                                                       spdlog::async_overflow_policy::overrun_oldest);
  logger->set_pattern(pattern);
  std::lock_guard lock(files_mu);
  auto& loggers = made_loggers();
  std::erase_if(loggers, [](const auto& w) { return w.expired(); });
  loggers.push_back(logger);
  return logger;
}

void init_error_log(const std::string& level, const std::string& target) {
  auto logger = make_logger("sluice", target, "%Y-%m-%dT%H:%M:%S.%e [%l] %v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(std::move(logger));
}

std::size_t reopen_log_files() {
  std::lock_guard lock(files_mu);
  std::size_t n = 0;
  for (const auto& w : open_files()) {
    if (auto f = w.lock()) {
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
  spdlog::shutdown();
  return true;
}

}  // namespace sluice
