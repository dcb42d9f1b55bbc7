// health_probe: runs one active health check (or --repeat N checks, one
// after another on the same probe) against one address and prints
// "ok REASON", "fail REASON" or "local REASON" (sluice's own resources ran
// out) per check. Exit status 0 when every check passed, 1 when one did not,
// 2 on bad usage, 3 when a handle was left open.
// --cancel-after D closes the probe D into the first check instead (prints
// "cancelled", exits 0): teardown with a check in flight.
// For the integration tests; not installed.
//
//   health_probe --type redis --role master 127.0.0.1:6379 --timeout 1s
#include <uv.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "config/values.hpp"
#include "health/probe.hpp"

using namespace sluice;

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "health_probe: %s\n"
               "usage: health_probe [options] HOST:PORT\n"
               "  --type tcp|http|send_expect|redis|postgres|mysql  --timeout D  --port N  --repeat N\n"
               "  --cancel-after D\n"
               "  http: --path P --method M --host H --expect-status 200-399,404 --expect-body TEXT\n"
               "  send_expect: --send TEXT | --send-hex HEX, --expect TEXT | --expect-hex HEX,\n"
               "               --expect-match prefix|substring\n"
               "  redis: --role master|replica|any --password-file F\n"
               "  postgres: --role primary|standby|any --user U --database D --sslmode M --password-file F\n"
               "            --max-lag D\n"
               "  mysql: --role primary|replica|any --user U --password-file F --max-lag D --galera\n",
               why.c_str());
  std::exit(2);
}

std::string unescape(std::string_view text) {
  // "\r\n" and "\n" in arguments, for line protocols.
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size()) {
      const char c = text[++i];
      out += c == 'r' ? '\r' : c == 'n' ? '\n' : c == 't' ? '\t' : c;
    } else {
      out += text[i];
    }
  }
  return out;
}

std::string from_hex(std::string_view hex) {
  if (hex.size() % 2 != 0) usage("odd number of hex digits");
  std::string out;
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    out += static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16));
  }
  return out;
}

std::vector<StatusRange> parse_ranges(const std::string& text) {
  std::vector<StatusRange> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    const std::string part = text.substr(start, end - start);
    const std::size_t dash = part.find('-');
    StatusRange r;
    r.low = std::atoi(part.substr(0, dash).c_str());
    r.high = dash == std::string::npos ? r.low : std::atoi(part.substr(dash + 1).c_str());
    if (r.low < 100 || r.high > 599 || r.low > r.high) usage("bad status range " + part);
    out.push_back(r);
    start = end + 1;
  }
  return out;
}

Duration duration_arg(const std::string& text) {
  std::string error;
  const auto d = parse_duration(text, error);
  if (!d) usage(error);
  return *d;
}

struct Run {
  health::Probe* probe = nullptr;
  int left = 1;
  bool all_ok = true;
  uv_timer_t cancel{};
};

void next_check(Run& run) {
  run.probe->start([&run](health::Probe::Verdict verdict, std::string reason) {
    const bool ok = verdict == health::Probe::Verdict::pass;
    const char* word = ok ? "ok" : verdict == health::Probe::Verdict::local_error ? "local" : "fail";
    std::printf("%s %s\n", word, reason.c_str());
    std::fflush(stdout);
    run.all_ok = run.all_ok && ok;
    if (--run.left > 0) {
      next_check(run);
    } else {
      uv_close(reinterpret_cast<uv_handle_t*>(&run.cancel), nullptr);
      run.probe->close([] {});
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  HealthConfig config;
  std::string address;
  std::string role;
  int repeat = 1;
  Duration cancel_after{0};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--galera") {
      config.galera = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      if (!address.empty()) usage("more than one address");
      address = arg;
      continue;
    }
    if (i + 1 >= argc) usage(arg + " needs a value");
    const std::string v = argv[++i];
    if (arg == "--type") {
      if (v == "tcp") config.type = HealthType::tcp;
      else if (v == "http") config.type = HealthType::http;
      else if (v == "send_expect") config.type = HealthType::send_expect;
      else if (v == "redis") config.type = HealthType::redis;
      else if (v == "postgres") config.type = HealthType::postgres;
      else if (v == "mysql") config.type = HealthType::mysql;
      else usage("unknown type " + v);
    } else if (arg == "--timeout") config.timeout = duration_arg(v);
    else if (arg == "--port") config.port = static_cast<std::uint16_t>(std::atoi(v.c_str()));
    else if (arg == "--cancel-after") cancel_after = duration_arg(v);
    else if (arg == "--repeat") repeat = std::max(1, std::atoi(v.c_str()));
    else if (arg == "--path") config.path = v;
    else if (arg == "--method") config.method = v;
    else if (arg == "--host") config.host = v;
    else if (arg == "--expect-status") config.expect_status = parse_ranges(v);
    else if (arg == "--expect-body") config.expect_body = v;
    else if (arg == "--send") config.send = unescape(v);
    else if (arg == "--send-hex") config.send = from_hex(v);
    else if (arg == "--expect") config.expect = unescape(v);
    else if (arg == "--expect-hex") config.expect = from_hex(v);
    else if (arg == "--expect-match") {
      if (v == "prefix") config.expect_match = ExpectMatch::prefix;
      else if (v == "substring") config.expect_match = ExpectMatch::substring;
      else usage("unknown expect-match " + v);
    } else if (arg == "--role") role = v;
    else if (arg == "--user") config.user = v;
    else if (arg == "--database") config.database = v;
    else if (arg == "--sslmode") config.sslmode = v;
    else if (arg == "--password-file") config.password_file = v;
    else if (arg == "--max-lag") config.max_lag = duration_arg(v);
    else usage("unknown option " + arg);
  }
  if (address.empty()) usage("no address");
  if (!role.empty()) {
    if (config.type == HealthType::redis) {
      if (role == "master") config.redis_role = RedisRole::master;
      else if (role == "replica") config.redis_role = RedisRole::replica;
      else if (role == "any") config.redis_role = RedisRole::any;
      else usage("unknown redis role " + role);
    } else if (config.type == HealthType::postgres) {
      if (role == "primary") config.postgres_role = PostgresRole::primary;
      else if (role == "standby") config.postgres_role = PostgresRole::standby;
      else if (role == "any") config.postgres_role = PostgresRole::any;
      else usage("unknown postgres role " + role);
    } else if (config.type == HealthType::mysql) {
      if (role == "primary") config.mysql_role = MysqlRole::primary;
      else if (role == "replica") config.mysql_role = MysqlRole::replica;
      else if (role == "any") config.mysql_role = MysqlRole::any;
      else usage("unknown mysql role " + role);
    } else {
      usage("--role is for redis, postgres and mysql");
    }
  }
  std::string error;
  const auto server = parse_address(address, false, error);
  if (!server) usage(error);

  uv_loop_t loop;
  uv_loop_init(&loop);
  {
    auto probe = health::make_probe(&loop, config, *server);
    Run run{probe.get(), repeat, true, {}};
    uv_timer_init(&loop, &run.cancel);
    run.cancel.data = &run;
    if (cancel_after.count() > 0) {
      uv_timer_start(&run.cancel, [](uv_timer_t* t) {
        auto* r = static_cast<Run*>(t->data);
        std::printf("cancelled\n");
        uv_close(reinterpret_cast<uv_handle_t*>(&r->cancel), nullptr);
        r->probe->close([] {});
      }, static_cast<std::uint64_t>(cancel_after.count()), 0);
    }
    next_check(run);
    uv_run(&loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&loop) != 0) {
      std::fprintf(stderr, "health_probe: a handle was left open\n");
      return 3;
    }
    return run.all_ok ? 0 : 1;
  }
}
