#include "log/access_log.hpp"

#include <atomic>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace sluice {

namespace {

std::string_view or_dash(std::string_view s) { return s.empty() ? std::string_view("-") : s; }

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += fmt::format("\\u{:04x}", u);
    } else {
      out += c;
    }
  }
  out += '"';
}

}  // namespace

AccessLog::AccessLog(const std::string& target, const std::string& format) : json_(format == "json") {
  if (target == "off") return;
  // Each AccessLog gets its own logger name so a re-created one never clashes
  // with the registry.
  static std::atomic<unsigned> serial{0};
  std::string name = "access" + std::to_string(serial++);
  if (target == "stderr") {
    logger_ = spdlog::stderr_logger_mt(name);
  } else if (target == "stdout") {
    logger_ = spdlog::stdout_logger_mt(name);
  } else {
    logger_ = spdlog::basic_logger_mt(name, target);
  }
  spdlog::drop(name);  // keep it out of the global registry; we own it
  // JSON records are one object per line: the time field comes from the
  // pattern, the rest from format_json().
  logger_->set_pattern(json_ ? "{\"time\":\"%Y-%m-%dT%H:%M:%S.%e\",%v}" : "%Y-%m-%dT%H:%M:%S.%e %v");
  logger_->set_level(spdlog::level::info);
  logger_->flush_on(spdlog::level::info);
}

AccessLog::~AccessLog() = default;

std::string AccessLog::format_text(const AccessRecord& r) {
  return fmt::format(
      "listener={} client={} server={} sni={} alpn={} tries={} bytes_in={} bytes_out={} "
      "connect_ms={} duration_ms={} cause={}",
      r.listener, or_dash(r.client), or_dash(r.server), or_dash(r.sni), or_dash(r.alpn), r.tries,
      r.bytes_in, r.bytes_out, r.connect_ms, r.duration_ms, to_string(r.cause));
}

std::string AccessLog::format_json(const AccessRecord& r) {
  std::string out = "\"listener\":";
  append_json_string(out, r.listener);
  out += ",\"client\":";
  append_json_string(out, r.client);
  out += ",\"server\":";
  append_json_string(out, r.server);
  out += ",\"sni\":";
  append_json_string(out, r.sni);
  out += ",\"alpn\":";
  append_json_string(out, r.alpn);
  out += fmt::format(
      ",\"tries\":{},\"bytes_in\":{},\"bytes_out\":{},\"connect_ms\":{},\"duration_ms\":{},\"cause\":\"{}\"",
      r.tries, r.bytes_in, r.bytes_out, r.connect_ms, r.duration_ms, to_string(r.cause));
  return out;
}

void AccessLog::write(const AccessRecord& r) const {
  if (!logger_) return;
  logger_->info(json_ ? format_json(r) : format_text(r));
}

}  // namespace sluice
