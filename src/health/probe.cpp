#include "health/probe.hpp"

#include <netinet/in.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "health/http_probe.hpp"
#include "health/match.hpp"
#include "health/mysql_probe.hpp"
#include "health/postgres_probe.hpp"
#include "health/received.hpp"
#include "health/redis_probe.hpp"
#include "health/send_expect_probe.hpp"
#include "health/tcp_probe.hpp"
#include "sluice/address.hpp"
#include "sluice/local_error.hpp"
#include "sluice/time.hpp"

namespace sluice::health {

Probe::Probe(uv_loop_t* loop, const HealthConfig& config, const Endpoint& target)
    : loop_(loop), config_(config), target_(target) {
  timer_ = handles_.add(new Timer(this));
  uv_timer_init(loop_, &timer_->uv);
}

Probe::~Probe() = default;

void Probe::start(Result result) {
  if (closing_ || result_) return;
  result_ = std::move(result);
  decided_ = false;
  role_facts_ = RoleFacts{};
  uv_timer_start(&timer_->uv, &Probe::on_timeout, static_cast<std::uint64_t>(config_.timeout.count()), 0);
  begin();
}

void Probe::finish(Verdict verdict, std::string reason) {
  if (!in_flight()) return;
  abort();
  decided_ = true;
  verdict_ = verdict;
  reason_ = std::move(reason);
  uv_timer_start(&timer_->uv, &Probe::on_timeout, 0, 0);  // replaces the timeout
}

void Probe::on_timeout(uv_timer_t* t) {
  Probe* self = Timer::of(t)->owner;
  if (!self->decided_) {
    self->finish(false, "timeout after " + format_duration(self->config_.timeout));
    return;
  }
  self->decided_ = false;
  Result result = std::move(self->result_);
  self->result_ = nullptr;
  result(self->verdict_, std::move(self->reason_));
}

bool Probe::over_reply_cap(int fd) {
  const auto received = bytes_received(fd);
  if (!received || *received <= kMaxReplyBytes) return false;
  finish(false, reply_cap_reason());
  return true;
}

std::string Probe::reply_cap_reason() { return "reply over the " + std::to_string(kMaxReplyBytes / 1024) + " KiB cap"; }

Probe::Verdict Probe::failed_with(int uv_err) {
  return is_local_resource_error(uv_err) ? Verdict::local_error : Verdict::fail;
}

Probe::Verdict Probe::failed_with_message(std::string_view message) {
  return names_local_resource_error(message) ? Verdict::local_error : Verdict::fail;
}

std::string Probe::connect_reason(int uv_err) {
  if (uv_err == UV_ECONNREFUSED) return "connect refused";
  if (uv_err == UV_ETIMEDOUT) return "connect timed out";
  return std::string("connect failed: ") + uv_strerror(uv_err);
}

std::string Probe::connect_reason(std::string message) {
  // libpq says "... failed: Connection refused", hiredis "Connection refused".
  std::string lower = message;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "connection refused") return "connect refused";
  if (lower.find("connection refused") != std::string::npos) return "connect refused: " + message;
  return message;
}

bool Probe::read_password(std::string& out) {
  out.clear();
  if (config_.password_file.empty()) return true;
  std::string error;
  out = read_secret(config_.password_file, error);
  if (error.empty()) return true;
  finish(false, error);
  return false;
}

void Probe::close(std::function<void()> closed) {
  closing_ = true;
  result_ = nullptr;
  decided_ = false;
  abort();
  HandleTracker::close(timer_);
  handles_.when_all_closed(std::move(closed));
}

std::unique_ptr<Probe> make_probe(uv_loop_t* loop, const HealthConfig& config, const Endpoint& server) {
  const Endpoint target = with_port(server, config.port);
  switch (config.type) {
    case HealthType::tcp: return std::make_unique<TcpProbe>(loop, config, target);
    case HealthType::http: return std::make_unique<HttpProbe>(loop, config, target);
    case HealthType::send_expect: return std::make_unique<SendExpectProbe>(loop, config, target);
    case HealthType::redis: return std::make_unique<RedisProbe>(loop, config, target);
    case HealthType::postgres: return std::make_unique<PostgresProbe>(loop, config, target);
    case HealthType::mysql: return std::make_unique<MysqlProbe>(loop, config, target);
  }
  return std::make_unique<TcpProbe>(loop, config, target);
}

Endpoint with_port(const Endpoint& server, std::uint16_t port) {
  Endpoint out = server;
  if (port == 0) return out;
  out.port = port;
  set_port(out.addr, port);
  const bool v6 = out.host.find(':') != std::string::npos;
  out.text = (v6 ? "[" + out.host + "]" : out.host) + ":" + std::to_string(port);
  return out;
}

std::string read_secret(const std::string& path, std::string& error) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = "cannot read password_file " + path + ": " + std::strerror(errno != 0 ? errno : EIO);
    return {};
  }
  std::string line;
  if (!std::getline(in, line) || line.empty()) {
    error = "password_file " + path + " is empty";
    return {};
  }
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

}  // namespace sluice::health
