#include "log/access_log.hpp"

#include <atomic>

#include <spdlog/spdlog.h>

#include "log/escape.hpp"
#include "log/logging.hpp"

namespace sluice {

namespace {

// A value a peer may control, or "-" when empty.
void append_field(std::string& out, std::string_view key, std::string_view value) {
  out += key;
  out += '=';
  if (value.empty()) {
    out += '-';
  } else {
    append_text_escaped(out, value);
  }
}

std::string_view cause_text(const AccessRecord& r) { return r.interim ? "interim" : to_string(r.cause); }

constexpr std::string_view kPhaseNames[kPhases] = {"pick", "connect", "connected", "first_in", "first_out", "close"};

// ` turn_us=.. turn_events=.. pick_us=..` (text) or `,"turn_us":..` (JSON).
void append_phases(std::string& out, const PhaseTimes& p, bool json) {
  const auto field = [&](std::string_view name, std::string_view suffix, long long v) {
    if (json) {
      out += fmt::format(",\"{}{}\":{}", name, suffix, v);
    } else {
      out += fmt::format(" {}{}={}", name, suffix, v);
    }
  };
  field("turn", "_us", p.turn_us);
  field("turn", "_events", p.turn_events);
  for (std::size_t i = 0; i < kPhases; ++i) field(kPhaseNames[i], "_us", p.at_us[i]);
}

}  // namespace

AccessLog::AccessLog(const std::string& target, const std::string& format) : json_(format == "json") {
  if (target == "off") return;
  // Each AccessLog gets its own logger name so a re-created one never clashes.
  static std::atomic<unsigned> serial{0};
  // JSON records are one object per line: the time field comes from the
  // pattern, the rest from format_json().
  logger_ = make_logger("access" + std::to_string(serial++), target,
                        json_ ? "{\"time\":\"%Y-%m-%dT%H:%M:%S.%e\",%v}" : "%Y-%m-%dT%H:%M:%S.%e %v");
  logger_->set_level(spdlog::level::info);
  logger_->flush_on(spdlog::level::info);
}

AccessLog::~AccessLog() = default;

std::string AccessLog::format_text(const AccessRecord& r) {
  std::string out;
  out.reserve(192);
  append_field(out, "listener", r.listener);
  append_field(out, " upstream", r.upstream);
  append_field(out, " client", r.client);
  append_field(out, " server", r.server);
  append_field(out, " sni", r.sni);
  append_field(out, " alpn", r.alpn);
  out += fmt::format(" tries={} fallback={} bytes_in={} bytes_out={} connect_ms={} duration_ms={} cause={}", r.tries,
                     r.fallback ? 1 : 0, r.bytes_in, r.bytes_out, r.connect_ms, r.duration_ms, cause_text(r));
  if (r.phases != nullptr) append_phases(out, *r.phases, false);
  return out;
}

std::string AccessLog::format_json(const AccessRecord& r) {
  std::string out = "\"listener\":";
  append_json_string(out, r.listener);
  out += ",\"upstream\":";
  append_json_string(out, r.upstream);
  out += ",\"client\":";
  append_json_string(out, r.client);
  out += ",\"server\":";
  append_json_string(out, r.server);
  out += ",\"sni\":";
  append_json_string(out, r.sni);
  out += ",\"alpn\":";
  append_json_string(out, r.alpn);
  out += fmt::format(
      ",\"tries\":{},\"fallback\":{},\"bytes_in\":{},\"bytes_out\":{},\"connect_ms\":{},\"duration_ms\":{},"
      "\"cause\":\"{}\"",
      r.tries, r.fallback, r.bytes_in, r.bytes_out, r.connect_ms, r.duration_ms, cause_text(r));
  if (r.phases != nullptr) append_phases(out, *r.phases, true);
  return out;
}

void AccessLog::write(const AccessRecord& r) const {
  if (!logger_) return;
  logger_->info(json_ ? format_json(r) : format_text(r));
}

}  // namespace sluice
