// sluice: the command line. Everything that runs is the control loop's
// (src/control/) and the workers' (src/net/).
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include <spdlog/spdlog.h>

#include "control/control.hpp"
#include "discovery/discovery.hpp"
#include "log/logging.hpp"
#include "sluice/config.hpp"
#include "sluice_version.hpp"

namespace {

constexpr const char* kUsage =
    "usage: sluice [-t] [-c FILE | FILE]\n"
    "  -c, --config FILE  configuration file (default /etc/sluice/sluice.toml)\n"
    "  -t, --test         check the configuration file and exit (0 valid, 1 invalid)\n"
    "  --version          print the version and exit\n"
    "  -h, --help         this help\n"
    "signals: SIGTERM/SIGINT stop gracefully (a second one closes every session at once),\n"
    "         SIGHUP reloads the configuration file, SIGUSR1 reopens log files\n";

}  // namespace

int main(int argc, char** argv) {
  std::string path = "/etc/sluice/sluice.toml";
  bool test_only = false;
  bool have_path = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "-c" || a == "--config") && i + 1 < argc && !have_path) {
      path = argv[++i];
      have_path = true;
    } else if (!a.empty() && a[0] != '-' && !have_path) {
      path = a;  // `sluice -t FILE`, as well as `-c FILE`
      have_path = true;
    } else if (a == "-t" || a == "--test") {
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

  // Not for -t: a check must stay easy to interrupt.
  if (!test_only) {
    sluice::Control::block_signals();
    std::signal(SIGPIPE, SIG_IGN);  // before the logging thread may write to a closed pipe
  }
  std::shared_ptr<const sluice::Config> config;
  try {
    config = std::make_shared<const sluice::Config>(sluice::load_config(path));
  } catch (const sluice::ConfigError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  if (test_only) {
    // A name that does not resolve now is no error: sluice starts without
    // its servers and keeps asking.
    for (const std::string& w : sluice::discovery::check_names(*config)) {
      std::fprintf(stderr, "sluice: warning: %s\n", w.c_str());
    }
    std::printf("sluice: configuration file %s is valid\n", path.c_str());
    return 0;
  }

  try {
    sluice::init_error_log(config->global.log_level, config->global.error_log);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sluice: cannot open error_log \"%s\": %s\n", config->global.error_log.c_str(), e.what());
    return 1;
  }
  int status = 0;
  try {
    sluice::Control control(path, std::move(config));
    status = control.run();
  } catch (const std::exception& e) {
    // Out of kernel resources before anything could run (an epoll set, a
    // thread): said plainly, not as an abort.
    spdlog::critical("sluice: cannot start: {}", e.what());
    status = 1;
  }
  // A log destination that stopped draining must not hang the exit: what it
  // could not take in a few seconds is lost, and the exit status stays true.
  if (!sluice::shutdown_logging(std::chrono::seconds(3))) std::_Exit(status);
  return status;
}
