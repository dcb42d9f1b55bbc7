#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <unistd.h>

#include "control/config_watch.hpp"

using sluice::ConfigWatch;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/sluice-watch-XXXXXX";
    const char* p = ::mkdtemp(tmpl);
    REQUIRE(p != nullptr);
    path = p;
  }
  ~TempDir() {
    const std::string cmd = "rm -rf '" + path + "'";
    [[maybe_unused]] const int r = std::system(cmd.c_str());
  }
};

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// Runs `loop` until `done` says so or `ms` have passed (a bounded wait).
template <class F>
void run_until(uv_loop_t* loop, F done, std::uint64_t ms) {
  const std::uint64_t until = uv_now(loop) + ms;
  uv_timer_t tick;
  uv_timer_init(loop, &tick);
  uv_timer_start(&tick, [](uv_timer_t*) {}, 20, 20);
  while (!done() && uv_now(loop) < until) uv_run(loop, UV_RUN_ONCE);
  uv_close(reinterpret_cast<uv_handle_t*>(&tick), nullptr);
  uv_run(loop, UV_RUN_NOWAIT);
}

void close_watch(uv_loop_t* loop, ConfigWatch& w) {
  bool closed = false;
  w.close([&] { closed = true; });
  while (!closed) uv_run(loop, UV_RUN_ONCE);
}

}  // namespace

TEST_CASE("watch_config: an edit that lands while a load is recorded is loaded next") {
  TempDir dir;
  const std::string file = dir.path + "/sluice.toml";
  write(file, "generation = 1\n");
  uv_loop_t loop;
  uv_loop_init(&loop);
  int changes = 0;
  {
    ConfigWatch w(&loop, file, [&] { ++changes; });
    w.set_enabled(true, ConfigWatch::digest("generation = 1\n"));
    // A reload read "generation = 2"; the file changed again before the
    // reload was recorded. What counts as seen is what the load read.
    write(file, "generation = 3\n");
    w.remember(ConfigWatch::digest("generation = 2\n"));
    run_until(&loop, [&] { return changes > 0; }, 5000);
    CHECK(changes == 1);
    close_watch(&loop, w);
  }
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("watch_config: the same content written again is not a change, other content is") {
  TempDir dir;
  const std::string file = dir.path + "/sluice.toml";
  write(file, "a = 1\n");
  uv_loop_t loop;
  uv_loop_init(&loop);
  int changes = 0;
  {
    ConfigWatch w(&loop, file, [&] { ++changes; });
    w.set_enabled(true, ConfigWatch::digest("a = 1\n"));
    write(file, "a = 1\n");
    // Twice the debounce's quiet time and more: the check has run.
    run_until(&loop, [] { return false; }, 3 * ConfigWatch::kDebounce.count());
    CHECK(changes == 0);
    write(dir.path + "/sluice.toml.tmp", "a = 2\n");
    REQUIRE(::rename((dir.path + "/sluice.toml.tmp").c_str(), file.c_str()) == 0);
    run_until(&loop, [&] { return changes > 0; }, 5000);
    CHECK(changes == 1);
    // A load recorded with no digest (it read nothing) leaves what was seen.
    w.remember(0);
    write(file, "a = 2\n");
    run_until(&loop, [] { return false; }, 3 * ConfigWatch::kDebounce.count());
    CHECK(changes == 1);
    close_watch(&loop, w);
  }
  CHECK(uv_loop_close(&loop) == 0);
}
