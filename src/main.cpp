// sluice: the command line. Everything that runs is the control loop's
// (src/control/) and the workers' (src/net/).
#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "control/control.hpp"
#include "discovery/discovery.hpp"
#include "log/logging.hpp"
#include "sluice/config.hpp"
#include "sluice/version.hpp"
#include "upgrade/channel.hpp"

namespace {

constexpr const char* kUsage =
    "usage: sluice [-t] [-c FILE | FILE]\n"
    "  -c, --config FILE  configuration file (default /etc/sluice/sluice.toml)\n"
    "  -t, --test         check the configuration file and exit (0 valid, 1 invalid)\n"
    "  --version          print the version and exit\n"
    "  -h, --help         this help\n"
    "signals: SIGTERM/SIGINT stop gracefully (a second one closes every session at once),\n"
    "         SIGHUP reloads the configuration file, SIGUSR1 reopens log files,\n"
    "         SIGUSR2 upgrades: starts the binary at this path and hands every session to it\n";

// The path this binary was started from, absolute: a binary upgrade starts
// what is at that path then (the newly installed file), so neither the
// symbolic links on the way nor /proc/self/exe (the running, perhaps
// deleted, file) are followed.
std::string started_from(const char* argv0, const std::string& cwd) {
  std::string a = argv0 != nullptr ? argv0 : "";
  if (a.find('/') != std::string::npos) return a.front() == '/' ? a : cwd + "/" + a;
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    std::size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + a;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.front() == '/' ? candidate : cwd + "/" + candidate;
    start = end + 1;
  }
  return "/proc/self/exe";  // nothing better is known
}

// A process started by an upgrade inherits, besides its channel, whatever
// the old one had open without close-on-exec (log files opened by the
// logging library): closed first, or each upgrade would add to them.
void close_inherited(int keep) {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return;
  std::vector<int> fds;
  while (dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (fd > 2 && fd != keep && fd != ::dirfd(d)) fds.push_back(fd);
  }
  ::closedir(d);
  for (int fd : fds) ::close(fd);
}

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
      std::printf("sluice %s\n", sluice::version());
      return 0;
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "sluice: unknown argument \"%s\"\n%s", a.c_str(), kUsage);
      return 2;
    }
  }

  // Started by a binary upgrade: the channel to the process that serves.
  // Not passed on to a later upgrade's process.
  int upgrade_fd = -1;
  if (const char* v = std::getenv(sluice::upgrade::kFdEnv); v != nullptr) {
    upgrade_fd = std::atoi(v);
    ::unsetenv(sluice::upgrade::kFdEnv);
    close_inherited(upgrade_fd);
  }
#ifdef SLUICE_TEST_FAULTS
  // The test build only (sluice-next): die in the middle of a hand-over.
  if (const char* v = std::getenv("SLUICE_TEST_EXIT_AFTER_ADOPTING"); v != nullptr && upgrade_fd >= 0) {
    sluice::upgrade::exit_after_adopting(std::strtoull(v, nullptr, 10));
  }
  // And: stall in the middle of one, as a process not scheduled would.
  if (const char* v = std::getenv("SLUICE_TEST_STALL_RECEIVING_MS"); v != nullptr && upgrade_fd >= 0) {
    sluice::upgrade::stall_receiving(std::strtoull(v, nullptr, 10));
  }
#endif

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
    // Started by an upgrade: the serving process logs why this one stops.
    sluice::upgrade::tell_failure(upgrade_fd, "critical", e.what());
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
    const std::string why = "cannot open error_log \"" + config->global.error_log + "\": " + e.what();
    std::fprintf(stderr, "sluice: %s\n", why.c_str());
    sluice::upgrade::tell_failure(upgrade_fd, "critical", why);
    return 1;
  }
  std::string cwd;
  {
    std::vector<char> buf(4096);
    if (::getcwd(buf.data(), buf.size()) != nullptr) cwd = buf.data();
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  int status = 0;
  try {
    sluice::Control control(path, std::move(config));
    control.set_command(started_from(argv[0], cwd), std::move(args), cwd);
    if (upgrade_fd >= 0) control.set_upgrade_channel(upgrade_fd);
    status = control.run();
  } catch (const std::exception& e) {
    // Out of kernel resources before anything could run (an epoll set, a
    // thread): said plainly, not as an abort.
    spdlog::critical("sluice: cannot start: {}", e.what());
    sluice::upgrade::tell_failure(upgrade_fd, "critical", std::string("cannot start: ") + e.what());
    status = 1;
  }
  // A log destination that stopped draining must not hang the exit: what it
  // could not take in a few seconds is lost, and the exit status stays true.
  if (!sluice::shutdown_logging(std::chrono::seconds(3))) std::_Exit(status);
  return status;
}
