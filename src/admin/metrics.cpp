// GET /metrics: the Prometheus text exposition format (0.0.4), written here
// once: families with HELP and TYPE, escaped label values, cumulative
// histogram buckets. Reads the data path's own atomics at scrape time.
#include <cstdio>
#include <string>
#include <vector>

#include "admin/admin_api.hpp"
#include "sluice_version.hpp"

namespace sluice::admin {

namespace {

std::string escape_label(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string number(double v) {
  char buf[40];
  if (v >= 0 && v < 9.007199254740992e15 && v == static_cast<double>(static_cast<std::uint64_t>(v))) {
    std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(v));
  } else {
    std::snprintf(buf, sizeof buf, "%.10g", v);
  }
  return buf;
}

using Labels = std::vector<std::pair<std::string_view, std::string_view>>;

class Writer {
 public:
  // Starts a family. Every sample of a family must follow its start.
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  void sample(std::string_view name, const Labels& labels, double value) {
    out_ += name;
    if (!labels.empty()) {
      out_ += '{';
      bool first = true;
      for (const auto& [k, v] : labels) {
        if (!first) out_ += ',';
        first = false;
        out_ += k;
        out_ += "=\"";
        out_ += escape_label(v);
        out_ += '"';
      }
      out_ += '}';
    }
    out_ += ' ';
    out_ += number(value);
    out_ += '\n';
  }
  void sample(std::string_view name, const Labels& labels, std::uint64_t value) {
    sample(name, labels, static_cast<double>(value));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

double load(const std::atomic<std::uint64_t>& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); }

// One series per server of every upstream, for a family whose value comes from `value`.
template <typename F>
void per_server(Writer& w, const Snapshot& snap, std::string_view name, std::string_view type,
                std::string_view help, F value) {
  w.family(name, type, help);
  for (const auto& [uname, up] : snap.upstreams) {
    for (std::size_t i = 0; i < up->size(); ++i) {
      const std::string& addr = up->server(i).address.text;
      w.sample(name, {{"upstream", uname}, {"server", addr}}, value(*up, i));
    }
  }
}

template <typename F>
void per_listener(Writer& w, const Snapshot& snap, std::string_view name, std::string_view type,
                  std::string_view help, F value) {
  w.family(name, type, help);
  for (const ListenerView& l : snap.listeners) w.sample(name, {{"listener", l.config->name}}, value(*l.stats));
}

}  // namespace

std::string metrics_text(const Snapshot& snap, const ProcessInfo& info, TimePoint now) {
  Writer w;
  w.family("sluice_build_info", "gauge", "Version of the running sluice (always 1).");
  w.sample("sluice_build_info", {{"version", SLUICE_VERSION}}, 1.0);
  w.family("sluice_start_time_seconds", "gauge", "Start time of the process, seconds since the epoch.");
  w.sample("sluice_start_time_seconds", {}, static_cast<double>(info.started_at_ms) / 1000.0);
  w.family("sluice_config_generation", "gauge", "Generation of the running configuration (1 at start).");
  w.sample("sluice_config_generation", {}, info.generation);
  w.family("sluice_config_last_reload_successful", "gauge",
           "1 when the last reload succeeded or none was tried, 0 when it failed.");
  w.sample("sluice_config_last_reload_successful", {}, !info.reload_attempted || info.reload_ok ? 1.0 : 0.0);
  w.family("sluice_reloads_total", "counter", "Configuration reloads by result.");
  w.sample("sluice_reloads_total", {{"result", "ok"}}, info.reloads_ok);
  w.sample("sluice_reloads_total", {{"result", "error"}}, info.reloads_failed);
  w.family("sluice_ready", "gauge",
           "1 while GET /ready answers 200, 0 while the instance is being taken out (healthcheck/fail, SIGTERM).");
  w.sample("sluice_ready", {}, info.ready ? 1.0 : 0.0);

  const ProcessCounters& pc = snap.registry->counters();
  w.family("sluice_connections", "gauge", "Open client connections, all listeners.");
  w.sample("sluice_connections", {}, load(pc.connections));
  w.family("sluice_accept_pauses_total", "counter", "Times a worker paused accepting because descriptors ran out.");
  w.sample("sluice_accept_pauses_total", {}, load(pc.accept_pauses));
  w.family("sluice_local_errors_total", "counter",
           "Connects to servers that failed for lack of sluice's own resources (cause local_resource).");
  w.sample("sluice_local_errors_total", {}, load(pc.local_errors));

  per_listener(w, snap, "sluice_listener_active_sessions", "gauge", "Client connections open now.",
               [](const ListenerStats& s) { return load(s.active); });
  per_listener(w, snap, "sluice_listener_accepted_total", "counter", "Client connections accepted.",
               [](const ListenerStats& s) { return load(s.accepted); });
  per_listener(w, snap, "sluice_listener_bytes_in_total", "counter", "Bytes delivered from clients to servers.",
               [](const ListenerStats& s) { return load(s.bytes_in); });
  per_listener(w, snap, "sluice_listener_bytes_out_total", "counter", "Bytes delivered from servers to clients.",
               [](const ListenerStats& s) { return load(s.bytes_out); });
  w.family("sluice_listener_closed_total", "counter", "Client connections closed, by termination cause.");
  for (const ListenerView& l : snap.listeners) {
    for (std::size_t c = 1; c < kCauseCount; ++c) {  // 0 is "none"
      const std::string_view cause = to_string(static_cast<Cause>(c));
      w.sample("sluice_listener_closed_total", {{"listener", l.config->name}, {"cause", cause}},
               l.stats->closed.get(static_cast<Cause>(c)));
    }
  }

  per_server(w, snap, "sluice_server_up", "gauge", "1 when the server may get new sessions now, else 0.",
             [now](const Upstream& u, std::size_t i) { return u.server(i).eligible(now) ? 1.0 : 0.0; });
  per_server(w, snap, "sluice_server_weight", "gauge", "Weight (the admin override, else the file's).",
             [](const Upstream& u, std::size_t i) { return static_cast<double>(u.base_weight(i)); });
  per_server(w, snap, "sluice_server_effective_weight", "gauge", "Weight the balancer uses now (slow start).",
             [now](const Upstream& u, std::size_t i) { return u.effective_weight(i, now); });
  per_server(w, snap, "sluice_server_active_sessions", "gauge", "Sessions connecting to or proxying with the server.",
             [](const Upstream& u, std::size_t i) {
               return static_cast<double>(u.server(i).active.load(std::memory_order_relaxed));
             });
  per_server(w, snap, "sluice_server_sessions_total", "counter", "Times the server was chosen.",
             [](const Upstream& u, std::size_t i) { return load(u.server(i).total_sessions); });
  per_server(w, snap, "sluice_server_failures_total", "counter", "Failed connect attempts (the server's fault).",
             [](const Upstream& u, std::size_t i) { return load(u.server(i).total_failures); });
  per_server(w, snap, "sluice_server_bytes_in_total", "counter", "Bytes delivered from clients to the server.",
             [](const Upstream& u, std::size_t i) { return load(u.server(i).bytes_in); });
  per_server(w, snap, "sluice_server_bytes_out_total", "counter", "Bytes delivered from the server to clients.",
             [](const Upstream& u, std::size_t i) { return load(u.server(i).bytes_out); });

  w.family("sluice_upstream_fallback_total", "counter",
           "Sessions an upstream sent on to its fallback because none of its servers was eligible.");
  for (const auto& [from, link] : snap.fallbacks) {
    w.sample("sluice_upstream_fallback_total", {{"upstream", from->name()}, {"fallback", link.to->name()}},
             load(*link.used));
  }

  w.family("sluice_server_connect_seconds", "histogram", "Time to connect to the server (successful connects).");
  for (const auto& [uname, up] : snap.upstreams) {
    for (std::size_t i = 0; i < up->size(); ++i) {
      const ServerState& s = up->server(i);
      const std::string& addr = s.address.text;
      double cumulative = 0;
      for (std::size_t b = 0; b < kConnectBuckets.size(); ++b) {
        cumulative += load(s.connect_buckets[b]);
        const std::string le = number(kConnectBuckets[b]);
        w.sample("sluice_server_connect_seconds_bucket", {{"upstream", uname}, {"server", addr}, {"le", le}},
                 cumulative);
      }
      cumulative += load(s.connect_buckets[kConnectBuckets.size()]);
      w.sample("sluice_server_connect_seconds_bucket", {{"upstream", uname}, {"server", addr}, {"le", "+Inf"}},
               cumulative);
      w.sample("sluice_server_connect_seconds_sum", {{"upstream", uname}, {"server", addr}},
               load(s.connect_sum_us) / 1e6);
      w.sample("sluice_server_connect_seconds_count", {{"upstream", uname}, {"server", addr}},
               cumulative);  // equal to the +Inf bucket, as the format requires
    }
  }
  return w.take();
}

}  // namespace sluice::admin
