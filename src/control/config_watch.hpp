// [global] watch_config: tells the control loop when the configuration
// file's content has changed, so that it reloads as on SIGHUP.
//
// inotify (a uv_fs_event_t) watches the file's directory, not the file: an
// editor's atomic save and a Kubernetes ConfigMap update replace the file
// rather than write into it. A ConfigMap volume holds `sluice.toml ->
// ..data/sluice.toml` and `..data -> ..2024_06_01_12_00_00.123`; an update
// writes a new timestamped directory, points a new link at it and renames
// that link over `..data`: one rename in the directory, and the file's own
// inode never changes. The directory the file finally resolves to is
// watched too (a link to a file elsewhere), and the set is worked out
// again after every change, so the watch follows the links as they move.
//
// Events come in bursts (a swap is several): a check runs once the
// directory has been quiet for kDebounce (at most kDebounceMax after the
// burst's first event), reads the file and compares its digest with that of
// the content last seen. Unchanged content does nothing (logged at debug);
// changed content calls `changed`. What the control loop loaded by any way
// (the watch itself, SIGHUP, POST /reload, PUT /config) is recorded with
// remember() as the digest of the bytes that load read, never by reading
// the file again afterwards: an edit that lands between a load and its
// record would otherwise count as seen and never be loaded. So the watch
// never reloads a second time what was just loaded, nor retries a bad file
// whose content has not changed since it failed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <uv.h>

namespace sluice {

class ConfigWatch {
 public:
  static constexpr std::chrono::milliseconds kDebounce{200};
  static constexpr std::chrono::milliseconds kDebounceMax{1000};

  // `changed` runs on `loop` when the content differs from the last seen.
  ConfigWatch(uv_loop_t* loop, std::string path, std::function<void()> changed);
  ~ConfigWatch();
  ConfigWatch(const ConfigWatch&) = delete;
  ConfigWatch& operator=(const ConfigWatch&) = delete;

  // Starts or stops watching. `loaded` is the digest (digest()) of the
  // content the running configuration was read from (0: unknown, the
  // content as it is now counts as seen). Safe from within `changed`.
  void set_enabled(bool on, std::uint64_t loaded = 0);
  bool enabled() const { return enabled_; }
  // A load read content with this digest: it counts as seen. 0 (the load
  // read nothing) changes nothing.
  void remember(std::uint64_t loaded);
  // The digest the watch compares: XXH3-64 of the bytes.
  static std::uint64_t digest(std::string_view bytes);
  // Closes every handle; `done` runs once they are closed. The object may
  // be destroyed after that only.
  void close(std::function<void()> done);

  // The directories to watch for `path`: its own, and the one it resolves
  // to through every link (when that differs). Absolute, without repeats.
  static std::vector<std::string> directories(const std::string& path);

 private:
  struct Dir;  // one watched directory: its handle's owner record

  void rewatch();
  void unwatch(Dir* d);
  void on_event(const char* name);
  void check();
  std::optional<std::uint64_t> read() const;  // the file's digest now
  void maybe_closed();
  static void on_fs_event(uv_fs_event_t* h, const char* name, int events, int status);
  static void on_timer(uv_timer_t* t);

  uv_loop_t* loop_;
  std::string path_;
  std::function<void()> changed_;
  bool enabled_ = false;
  bool closing_ = false;
  std::vector<std::unique_ptr<Dir>> dirs_;
  int open_handles_ = 0;  // the timer and the directories' handles, until their close callbacks
  uv_timer_t timer_{};
  std::uint64_t burst_start_ms_ = 0;
  std::optional<std::uint64_t> seen_;  // the digest of the content last seen (nullopt: unreadable then)
  std::function<void()> done_;
};

}  // namespace sluice
