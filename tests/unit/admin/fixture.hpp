// A Snapshot built from a small configuration, and AdminHooks around it,
// for the admin API's unit tests (no sockets).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "admin/admin_api.hpp"
#include "runtime/registry.hpp"
#include "runtime/snapshot.hpp"

namespace sluice::admin::testing {

struct Fixture {
  Registry registry;
  std::shared_ptr<const Snapshot> snapshot;
  ProcessInfo info;
  std::vector<std::pair<std::string, Cause>> closed;  // close_sessions calls: server address, cause
  int reloads = 0;
  bool refuse_ready = false;  // set_ready(true) answers as a stopping host does

  explicit Fixture(const std::string& extra_upstream = "") {
    const std::string text =
        "[global]\naccess_log = \"off\"\n"
        "[[listener]]\nname = \"front\"\nlisten = \"127.0.0.1:0\"\nupstream = \"pg\"\n"
        "[upstream.pg]\n" + extra_upstream +
        "servers = [{ address = \"127.0.0.1:5001\" }, { address = \"[::1]:5002\", weight = 3 }]\n";
    snapshot = Snapshot::build(std::make_shared<const Config>(parse_config(text, "t.toml")), registry, 1);
    info.started_at_ms = 1000;
    info.generation = 1;
    info.config_file = "t.toml";
  }

  AdminHooks hooks() {
    AdminHooks h;
    h.snapshot = [this] { return snapshot; };
    h.info = [this] { return info; };
    h.reload = [this] {
      ++reloads;
      return Outcome{false, "t.toml:3:1: bad"};
    };
    h.put_config = [](std::string_view body) { return Outcome{body == "ok", body == "ok" ? "fine" : "t.toml:1:2: no"}; };
    h.close_sessions = [this](std::shared_ptr<const ServerState> s, Cause c) { closed.emplace_back(s->address.text, c); };
    h.set_ready = [this](bool ok, const std::string&) {
      if (ok && refuse_ready) return Outcome{false, "stopping"};
      info.ready = ok;
      info.not_ready_reason = ok ? "" : "failed by hand";
      return Outcome{true, ok ? "ready" : "not ready"};
    };
    return h;
  }
};

inline Request request(std::string method, std::string path, std::string body = "") {
  Request r;
  r.method = std::move(method);
  r.path = std::move(path);
  r.body = std::move(body);
  r.peer = "127.0.0.1:1";
  r.headers["host"] = "127.0.0.1:9090";  // what a client of the default listen address sends
  return r;
}

}  // namespace sluice::admin::testing
