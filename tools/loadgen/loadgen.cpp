// loadgen: backend server and load generator for the sluice benchmarks.
// Single-threaded and epoll-driven so that, on a small machine, the proxy
// under test rather than this tool sets the pace.
#include <cstdio>
#include <cstring>
#include <exception>
#include <set>
#include <string>

#include "commands.hpp"

namespace {

void usage(FILE* out) {
  std::fputs(
      "usage: loadgen COMMAND [options]\n"
      "  serve --mode echo|echo_close|sink|source|banner|integrity [--port 0] [--host 127.0.0.1]\n"
      "        [--listeners K] [--tls CERT KEY]\n"
      "        prints 'listening PORT' per listener, serves until SIGTERM\n"
      "  conn  --target HOST:PORT [--duration S] [--concurrency C] [--payload N]\n"
      "  rr    --target HOST:PORT [--duration S] [--concurrency C] [--size N]\n"
      "  bulk  --target HOST:PORT [--bytes N] [--concurrency C] [--mode source|sink|echo]\n"
      "        [--timeout S]\n"
      "  idle  --target HOST:PORT --count N [--connect-concurrency K] [--timeout S]\n"
      "        [--hold S]   prints 'ready N', holds until stdin closes or SIGTERM\n"
      "  tls   --target HOST:PORT --sni NAME[,NAME...] [--duration S] [--concurrency C]\n"
      "        [--payload N] [--verify-name]\n"
      "  integrity --target HOST:PORT [--bytes N] [--concurrency C] [--max-session N]\n"
      "        [--seed S] [--stall S] [--timeout S]   checked sessions against serve --mode\n"
      "        integrity; prints progress, one line per session that did not complete, and\n"
      "        a JSON summary\n"
      "  open  --target HOST:PORT --rate R [--mode rr|conn] [--duration S] [--connections C]\n"
      "        [--size N] [--max-inflight K] [--warmup S] [--drain S]   open loop: R requests a\n"
      "        second whatever the target does, each timed from when it was due\n"
      "Client commands print one JSON line. Sizes accept k, m, g suffixes.\n",
      out);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace loadgen;
  if (argc < 2 || std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  struct Command {
    const char* name;
    int (*run)(const Options&);
    std::set<std::string> allowed;
  };
  const Command commands[] = {
      {"serve", run_serve, {"mode", "port", "host", "listeners", "tls"}},
      {"conn", run_conn, {"target", "duration", "concurrency", "payload"}},
      {"rr", run_rr, {"target", "duration", "concurrency", "size"}},
      {"bulk", run_bulk, {"target", "bytes", "concurrency", "mode", "timeout"}},
      {"idle", run_idle, {"target", "count", "connect-concurrency", "timeout", "hold"}},
      {"tls", run_tls, {"target", "sni", "duration", "concurrency", "payload", "verify-name"}},
      {"open", run_open, {"target", "rate", "mode", "duration", "connections", "size", "max-inflight", "warmup", "drain"}},
      {"integrity", run_integrity, {"target", "bytes", "concurrency", "max-session", "seed", "stall", "timeout"}},
  };
  for (const auto& c : commands) {
    if (cmd != c.name) continue;
    Options opts;
    std::string error;
    if (!opts.parse(argc, argv, 2, c.allowed, error)) {
      std::fprintf(stderr, "loadgen %s: %s\n", c.name, error.c_str());
      return 2;
    }
    try {
      return c.run(opts);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "loadgen %s: %s\n", c.name, e.what());
      return 2;
    }
  }
  std::fprintf(stderr, "loadgen: unknown command '%s'\n", cmd.c_str());
  usage(stderr);
  return 2;
}
