#include "control/config_watch.hpp"
#include "sluice/uv_handle.hpp"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>
#include <xxhash.h>

namespace sluice {

namespace {

std::string dirname_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string absolute(const std::string& path) {
  if (!path.empty() && path.front() == '/') return path;
  char cwd[PATH_MAX];
  if (::getcwd(cwd, sizeof cwd) == nullptr) return path;
  return std::string(cwd) + "/" + path;
}

}  // namespace

struct ConfigWatch::Dir {
  uv_fs_event_t handle{};
  ConfigWatch* watch = nullptr;
  std::string path;
};

ConfigWatch::ConfigWatch(uv_loop_t* loop, std::string path, std::function<void()> changed)
    : loop_(loop), path_(std::move(path)), changed_(std::move(changed)) {
  uv_timer_init(loop_, &timer_);
  timer_.data = this;
  ++open_handles_;
}

ConfigWatch::~ConfigWatch() = default;

std::vector<std::string> ConfigWatch::directories(const std::string& path) {
  const std::string abs = absolute(path);
  std::vector<std::string> out{dirname_of(abs)};
  char real[PATH_MAX];
  if (::realpath(abs.c_str(), real) != nullptr) {
    const std::string d = dirname_of(real);
    if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  }
  return out;
}

std::uint64_t ConfigWatch::digest(std::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

void ConfigWatch::set_enabled(bool on, std::uint64_t loaded) {
  if (closing_ || on == enabled_) return;
  enabled_ = on;
  if (on) {
    seen_ = loaded != 0 ? std::optional<std::uint64_t>(loaded) : read();
    rewatch();
    std::string dirs;
    for (const auto& d : dirs_) dirs += (dirs.empty() ? "" : ", ") + d->path;
    spdlog::info("watch_config: reloading when {} changes (watching {})", path_, dirs.empty() ? "nothing" : dirs);
    return;
  }
  uv_timer_stop(&timer_);
  while (!dirs_.empty()) unwatch(dirs_.back().get());
  spdlog::info("watch_config: no longer watching {}", path_);
}

void ConfigWatch::remember(std::uint64_t loaded) {
  if (enabled_ && loaded != 0) seen_ = loaded;
}

std::optional<std::uint64_t> ConfigWatch::read() const {
  std::ifstream in(path_, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return digest(out.view());
}

// Watches what directories() says now, and nothing else.
void ConfigWatch::rewatch() {
  const std::vector<std::string> want = directories(path_);
  for (std::size_t i = dirs_.size(); i-- > 0;) {
    if (std::find(want.begin(), want.end(), dirs_[i]->path) == want.end()) unwatch(dirs_[i].get());
  }
  for (const std::string& path : want) {
    const bool have = std::any_of(dirs_.begin(), dirs_.end(), [&](const auto& d) { return d->path == path; });
    if (have) continue;
    auto d = std::make_unique<Dir>();
    d->watch = this;
    d->path = path;
    uv_fs_event_init(loop_, &d->handle);
    d->handle.data = d.get();
    ++open_handles_;
    if (int r = uv_fs_event_start(&d->handle, on_fs_event, path.c_str(), 0); r < 0) {
      spdlog::error("watch_config: cannot watch {} for changes to {}: {}; a reload needs SIGHUP or POST /reload",
                    path, path_, uv_strerror(r));
    }
    dirs_.push_back(std::move(d));
  }
}

void ConfigWatch::unwatch(Dir* d) {
  auto it = std::find_if(dirs_.begin(), dirs_.end(), [d](const auto& x) { return x.get() == d; });
  if (it == dirs_.end()) return;
  Dir* raw = it->release();
  dirs_.erase(it);
  uv_fs_event_stop(&raw->handle);
  uv_close(as_handle(&raw->handle), [](uv_handle_t* h) {
    auto* dir = static_cast<Dir*>(h->data);
    ConfigWatch* w = dir->watch;
    delete dir;
    --w->open_handles_;
    w->maybe_closed();
  });
}

void ConfigWatch::on_fs_event(uv_fs_event_t* h, const char* name, int /*events*/, int status) {
  auto* d = static_cast<Dir*>(h->data);
  if (status < 0) {
    spdlog::warn("watch_config: watching {}: {}", d->path, uv_strerror(status));
    return;
  }
  d->watch->on_event(name);
}

// Debounced: the check runs once the directory has been quiet for
// kDebounce, or kDebounceMax after the burst began, whichever is first.
void ConfigWatch::on_event(const char* /*name*/) {
  if (!enabled_ || closing_) return;
  const std::uint64_t now = uv_now(loop_);
  if (!uv_is_active(as_handle(&timer_))) burst_start_ms_ = now;
  const auto quiet = static_cast<std::uint64_t>(kDebounce.count());
  const std::uint64_t latest = burst_start_ms_ + static_cast<std::uint64_t>(kDebounceMax.count());
  const std::uint64_t at = std::min(now + quiet, std::max(latest, now));
  uv_timer_start(&timer_, on_timer, at - now, 0);
}

void ConfigWatch::on_timer(uv_timer_t* t) { static_cast<ConfigWatch*>(t->data)->check(); }

void ConfigWatch::check() {
  if (!enabled_ || closing_) return;
  // The links may point elsewhere now (a ConfigMap's new directory).
  rewatch();
  const std::optional<std::uint64_t> now = read();
  if (!now) {
    if (seen_) spdlog::warn("watch_config: cannot read {} ({}); the running configuration stays", path_, std::strerror(errno));
    seen_ = std::nullopt;
    return;
  }
  if (seen_ && *seen_ == *now) {
    spdlog::debug("watch_config: {} changed on disk but its content is the same; not reloaded", path_);
    return;
  }
  seen_ = now;
  changed_();
}

void ConfigWatch::close(std::function<void()> done) {
  if (closing_) return;
  closing_ = true;
  enabled_ = false;
  done_ = std::move(done);
  while (!dirs_.empty()) unwatch(dirs_.back().get());
  uv_close(as_handle(&timer_), [](uv_handle_t* h) {
    auto* w = static_cast<ConfigWatch*>(h->data);
    --w->open_handles_;
    w->maybe_closed();
  });
}

void ConfigWatch::maybe_closed() {
  if (!closing_ || open_handles_ > 0 || !done_) return;
  auto done = std::move(done_);
  done_ = nullptr;
  done();
}

}  // namespace sluice
