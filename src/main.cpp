// sluice: command line, signals and the control loop. The control loop never
// touches a data socket; workers own those.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>
#include <uv.h>

#include "log/logging.hpp"
#include "net/listener.hpp"
#include "net/runtime.hpp"
#include "net/worker.hpp"
#include "sluice/config.hpp"
#include "sluice_version.hpp"

namespace {

constexpr const char* kUsage =
    "usage: sluice [-t] [-c FILE]\n"
    "  -c FILE      configuration file (default /etc/sluice/sluice.toml)\n"
    "  -t           check the configuration file and exit (0 valid, 1 invalid)\n"
    "  --version    print the version and exit\n"
    "  -h, --help   this help\n"
    "signals: SIGTERM/SIGINT stop gracefully (a second one stops at once)\n";

struct Control {
  std::vector<std::unique_ptr<sluice::Worker>> workers;
  uv_signal_t sigterm{};
  uv_signal_t sigint{};
  uv_signal_t sighup{};
  bool stopping = false;
};

void on_stop_signal(uv_signal_t* h, int signum) {
  auto* c = static_cast<Control*>(h->data);
  if (c->stopping) return;
  c->stopping = true;
  spdlog::info("received {}: graceful stop", signum == SIGINT ? "SIGINT" : "SIGTERM");
  for (auto& w : c->workers) w->request_stop();
  // Closing the watchers lets the control loop end; the default disposition
  // comes back, so a second signal ends the process at once.
  uv_close(reinterpret_cast<uv_handle_t*>(&c->sigterm), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&c->sigint), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&c->sighup), nullptr);
}

void on_hup(uv_signal_t* /*h*/, int /*signum*/) {
  spdlog::warn("received SIGHUP: reload is not supported yet; the running configuration is unchanged");
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = "/etc/sluice/sluice.toml";
  bool test_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-c" && i + 1 < argc) {
      path = argv[++i];
    } else if (a == "-t") {
      test_only = true;
    } else if (a == "--version" || a == "-v") {
      std::printf("sluice %s\n", SLUICE_VERSION);
      return 0;
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "sluice: unknown argument \"%s\"\n%s", a.c_str(), kUsage);
      return 2;
    }
  }

  std::shared_ptr<const sluice::Config> config;
  try {
    config = std::make_shared<const sluice::Config>(sluice::load_config(path));
  } catch (const sluice::ConfigError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  if (test_only) {
    std::printf("sluice: configuration file %s is valid\n", path.c_str());
    return 0;
  }

  sluice::init_error_log(config->global.log_level);
  std::signal(SIGPIPE, SIG_IGN);

  std::shared_ptr<sluice::Runtime> runtime;
  unsigned nworkers = config->global.workers;
  if (nworkers == 0) nworkers = uv_available_parallelism();
  std::vector<std::vector<int>> fds(nworkers);
  try {
    runtime = std::make_shared<sluice::Runtime>(config);
    for (const sluice::ListenerConfig& l : config->listeners) {
      sluice::ListeningSockets ls = sluice::open_listening_sockets(l, nworkers);
      for (unsigned w = 0; w < nworkers; ++w) fds[w].push_back(ls.fds[w]);
      spdlog::info("listener \"{}\" listening on {}", l.name, ls.bound);
    }
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }

  Control control;
  uv_loop_t* loop = uv_default_loop();
  for (unsigned w = 0; w < nworkers; ++w) {
    control.workers.push_back(std::make_unique<sluice::Worker>(w, runtime, std::move(fds[w])));
  }
  for (auto* sig : {&control.sigterm, &control.sigint, &control.sighup}) {
    uv_signal_init(loop, sig);
    sig->data = &control;
  }
  uv_signal_start(&control.sigterm, on_stop_signal, SIGTERM);
  uv_signal_start(&control.sigint, on_stop_signal, SIGINT);
  uv_signal_start(&control.sighup, on_hup, SIGHUP);

  for (auto& w : control.workers) w->start();
  spdlog::info("sluice {} started: {} worker(s), {} listener(s)", SLUICE_VERSION, nworkers, config->listeners.size());

  uv_run(loop, UV_RUN_DEFAULT);
  for (auto& w : control.workers) w->join();
  control.workers.clear();
  uv_loop_close(loop);
  spdlog::info("stopped");
  return 0;
}
