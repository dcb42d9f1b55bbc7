// GET /metrics: the Prometheus text exposition format (0.0.4), written here
// once: families with HELP and TYPE, escaped label values, cumulative
// histogram buckets. Reads the data path's own atomics at scrape time.
#include <array>
#include <charconv>
#include <string>
#include <vector>

#include "admin/admin_api.hpp"
#include "sluice/version.hpp"
#include "upstream/availability.hpp"

namespace sluice::admin {

namespace {

// Whole numbers as integers, others with ten significant digits (printf's
// %.10g). to_chars: no locale, no format string to parse, no allocation.
std::string_view number(double v, std::array<char, 40>& buf) {
  std::to_chars_result r;
  if (v >= 0 && v < 9.007199254740992e15 && v == static_cast<double>(static_cast<std::uint64_t>(v))) {
    r = std::to_chars(buf.data(), buf.data() + buf.size(), static_cast<std::uint64_t>(v));
  } else {
    r = std::to_chars(buf.data(), buf.data() + buf.size(), v, std::chars_format::general, 10);
  }
  return {buf.data(), static_cast<std::size_t>(r.ptr - buf.data())};
}

void append_escaped(std::string& out, std::string_view v) {
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
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
        append_escaped(out_, v);
        out_ += '"';
      }
      out_ += '}';
    }
    out_ += ' ';
    std::array<char, 40> buf;
    out_ += number(value, buf);
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

// The _bucket (cumulative), _sum and _count samples of one histogram series.
template <std::size_t N>
void histogram(Writer& w, const std::string& name, const Labels& labels, const Histogram<N>& h) {
  const std::string bucket = name + "_bucket";
  Labels with_le = labels;
  with_le.emplace_back("le", "");
  double cumulative = 0;
  for (std::size_t b = 0; b <= N; ++b) {
    cumulative += static_cast<double>(h.bucket(b));
    std::array<char, 40> buf;
    const std::string le = b < N ? std::string(number(h.bounds()[b], buf)) : "+Inf";
    with_le.back().second = le;
    w.sample(bucket, with_le, cumulative);
  }
  w.sample(name + "_sum", labels, h.sum_seconds());
  w.sample(name + "_count", labels, cumulative);  // equal to the +Inf bucket, as the format requires
}

// Each upstream's server count (DNS changes it) and the resolver's counters.
void dns_metrics(Writer& w, const Snapshot& snap, const ProcessInfo& info) {
  w.family("sluice_upstream_servers", "gauge", "Servers of the upstream now (from the file and from DNS).");
  for (const auto& [uname, up] : snap.upstreams) w.sample("sluice_upstream_servers", {{"upstream", uname}}, up->size());
  if (!info.dns.enabled) return;
  w.family("sluice_dns_queries_total", "counter", "DNS queries sent for discovered servers.");
  w.sample("sluice_dns_queries_total", {}, info.dns.queries);
  w.family("sluice_dns_errors_total", "counter",
           "DNS queries that failed, by kind (nxdomain, timeout, servfail, refused, network, other).");
  for (std::string_view kind : {"nxdomain", "timeout", "servfail", "refused", "network", "other"}) {
    const auto it = info.dns.errors.find(std::string(kind));
    w.sample("sluice_dns_errors_total", {{"kind", kind}}, it != info.dns.errors.end() ? it->second : 0);
  }
  w.family("sluice_dns_changes_total", "counter", "DNS answers that changed an upstream's servers.");
  w.sample("sluice_dns_changes_total", {}, info.dns.changes);
  w.family("sluice_dns_entry_servers", "gauge", "Servers each discovery entry gives now (held ones included).");
  for (const DnsEntryStatus& e : info.dns.entries) {
    w.sample("sluice_dns_entry_servers", {{"upstream", e.upstream}, {"name", e.name}},
             static_cast<std::uint64_t>(e.servers.size()));
  }
}

}  // namespace

std::string metrics_text(const Snapshot& snap, const ProcessInfo& info, TimePoint now) {
  Writer w;
  w.family("sluice_build_info", "gauge", "Version of the running sluice (always 1).");
  w.sample("sluice_build_info", {{"version", sluice::version()}}, 1.0);
  w.family("sluice_start_time_seconds", "gauge",
           "Start time of the service, seconds since the epoch (kept across binary upgrades).");
  w.sample("sluice_start_time_seconds", {}, static_cast<double>(info.started_at_ms) / 1000.0);
  w.family("sluice_process_start_time_seconds", "gauge", "Start time of this process, seconds since the epoch.");
  w.sample("sluice_process_start_time_seconds", {}, static_cast<double>(info.process_started_at_ms) / 1000.0);
  w.family("sluice_config_generation", "gauge",
           "Generation of the running configuration (1 at start; a binary upgrade goes on from the old one's).");
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

  w.family("sluice_listener_session_seconds", "histogram",
           "How long client connections lasted, from accept to close (those refused by policy left out).");
  for (const ListenerView& l : snap.listeners) {
    histogram(w, "sluice_listener_session_seconds", {{"listener", l.config->name}}, l.stats->session_seconds);
  }
  // Per SNI route: the routes the file configures (and the default), never
  // the names clients send, so the series are as many as the routes.
  struct RouteSeries {
    const std::string* listener;
    std::string route;
    const std::string* upstream;
    const RouteStats* stats;
  };
  std::vector<RouteSeries> routes;
  static const std::string kDefault = "(default)";
  for (const ListenerView& l : snap.listeners) {
    if (!l.default_route_stats) continue;
    for (std::size_t r = 0; r < l.route_stats.size(); ++r) {
      routes.push_back({&l.config->name, route_name(l.config->routes[r]), &l.config->routes[r].upstream,
                        l.route_stats[r].get()});
    }
    routes.push_back({&l.config->name, kDefault, &l.config->default_upstream, l.default_route_stats.get()});
  }
  const auto per_route = [&](std::string_view name, std::string_view help, auto value) {
    w.family(name, "counter", help);
    for (const RouteSeries& r : routes) {
      w.sample(name, {{"listener", *r.listener}, {"route", r.route}, {"upstream", *r.upstream}}, value(*r.stats));
    }
  };
  per_route("sluice_route_sessions_total", "Sessions a preread sent by this SNI route (route=\"(default)\": the default).",
            [](const RouteStats& r) { return load(r.sessions); });
  per_route("sluice_route_bytes_in_total", "Bytes delivered from clients to servers on this route (at session end).",
            [](const RouteStats& r) { return load(r.bytes_in); });
  per_route("sluice_route_bytes_out_total", "Bytes delivered from servers to clients on this route (at session end).",
            [](const RouteStats& r) { return load(r.bytes_out); });

  per_server(w, snap, "sluice_server_up", "gauge",
             "1 when the server takes new sessions now, else 0 (down, standby, fenced, drained or disabled).",
             [now](const Upstream& u, std::size_t i) { return u.server(i).takes_sessions(now) ? 1.0 : 0.0; });
  per_server(w, snap, "sluice_server_fenced", "gauge",
             "1 while the server is fenced: another primary serves, or a failover away from it is under way.",
             [](const Upstream& u, std::size_t i) { return u.server(i).fenced() ? 1.0 : 0.0; });
  w.family("sluice_server_state", "gauge", "1 for the server's state now, 0 for the others.");
  for (const auto& [uname, up] : snap.upstreams) {
    for (std::size_t i = 0; i < up->size(); ++i) {
      const std::string state = up->server(i).status(now).state;
      for (const char* one : {"up", "standby", "down", "fenced", "drained", "disabled"}) {
        w.sample("sluice_server_state", {{"upstream", uname}, {"server", up->server(i).address.text}, {"state", one}},
                 state == one ? 1.0 : 0.0);
      }
    }
  }
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

  per_server(w, snap, "sluice_server_peak_sessions", "gauge", "Most sessions with the server at once since start.",
             [](const Upstream& u, std::size_t i) {
               return static_cast<double>(u.server(i).peak_active.load(std::memory_order_relaxed));
             });
  per_server(w, snap, "sluice_server_downtime_seconds_total", "counter",
             "Time the server spent down by health (not drained or disabled).",
             [now](const Upstream& u, std::size_t i) {
               return std::chrono::duration<double>(u.server(i).downtime(now)).count();
             });

  // Active checks: only for the servers of upstreams that have them.
  w.family("sluice_server_check_success", "gauge",
           "1 when the server's last active check passed, 0 when it failed or could not run.");
  for (const auto& [uname, up] : snap.upstreams) {
    if (!up->config().health) continue;
    for (std::size_t i = 0; i < up->size(); ++i) {
      const ServerState::LastCheck c = up->server(i).last_check();
      if (c.result == CheckResult::none) continue;
      w.sample("sluice_server_check_success", {{"upstream", uname}, {"server", up->server(i).address.text}},
               c.result == CheckResult::pass ? 1.0 : 0.0);
    }
  }
  w.family("sluice_server_check_failures_total", "counter", "Active checks the server failed.");
  for (const auto& [uname, up] : snap.upstreams) {
    if (!up->config().health) continue;
    for (std::size_t i = 0; i < up->size(); ++i) {
      w.sample("sluice_server_check_failures_total", {{"upstream", uname}, {"server", up->server(i).address.text}},
               load(up->server(i).check_failures));
    }
  }
  w.family("sluice_server_check_seconds", "histogram",
           "How long active checks took (passed or failed; not those sluice itself could not run).");
  for (const auto& [uname, up] : snap.upstreams) {
    if (!up->config().health) continue;
    for (std::size_t i = 0; i < up->size(); ++i) {
      const ServerState& st = up->server(i);
      histogram(w, "sluice_server_check_seconds", {{"upstream", uname}, {"server", st.address.text}}, st.check_seconds);
    }
  }

  w.family("sluice_upstream_servers_available", "gauge",
           "Servers of the upstream that could take a new session now (0: its clients get no_server or its "
           "fallback).");
  for (const auto& [uname, up] : snap.upstreams) {
    w.sample("sluice_upstream_servers_available", {{"upstream", uname}}, availability(*up, now).eligible);
  }
  w.family("sluice_upstream_retired_sessions", "gauge",
           "Sessions still open on a server that a reload or a DNS change removed (one series while it has any).");
  for (const RetiredGroup& r : retired_servers(*snap.registry)) {
    w.sample("sluice_upstream_retired_sessions", {{"upstream", r.upstream}, {"server", r.address}}, r.sessions);
  }

  w.family("sluice_upstream_fallback_total", "counter",
           "Sessions an upstream sent on to its fallback because none of its servers was eligible.");
  for (const auto& [from, link] : snap.fallbacks) {
    w.sample("sluice_upstream_fallback_total", {{"upstream", from->name()}, {"fallback", link.to->name()}},
             load(*link.used));
  }

  // Wait queues: only upstreams with `queue` > 0 have a series.
  const auto queued = [&snap](auto f) {
    for (const auto& [uname, up] : snap.upstreams) {
      if (const WaitQueue* q = up->queue()) f(uname, *q);
    }
  };
  w.family("sluice_upstream_queue_length", "gauge", "Clients waiting in the upstream's queue for a server slot.");
  queued([&w](const std::string& u, const WaitQueue& q) {
    w.sample("sluice_upstream_queue_length", {{"upstream", u}}, static_cast<double>(q.length()));
  });
  w.family("sluice_upstream_queued_total", "counter", "Clients that had to wait in the upstream's queue.");
  queued([&w](const std::string& u, const WaitQueue& q) {
    w.sample("sluice_upstream_queued_total", {{"upstream", u}}, static_cast<double>(q.queued_total()));
  });
  w.family("sluice_upstream_queue_timeouts_total", "counter",
           "Clients that waited queue_timeout without a slot (cause queue_timeout).");
  queued([&w](const std::string& u, const WaitQueue& q) {
    w.sample("sluice_upstream_queue_timeouts_total", {{"upstream", u}}, static_cast<double>(q.timeouts()));
  });
  w.family("sluice_upstream_queue_refused_total", "counter",
           "Clients that found every server and the queue full (refused, or sent to the fallback).");
  queued([&w](const std::string& u, const WaitQueue& q) {
    w.sample("sluice_upstream_queue_refused_total", {{"upstream", u}}, static_cast<double>(q.refused()));
  });
  w.family("sluice_upstream_queue_wait_seconds", "histogram",
           "How long clients waited in the upstream's queue (served, timed out or gone).");
  queued([&w](const std::string& u, const WaitQueue& q) {
    histogram(w, "sluice_upstream_queue_wait_seconds", {{"upstream", u}}, q.wait_seconds());
  });

  w.family("sluice_server_connect_seconds", "histogram", "Time to connect to the server (successful connects).");
  for (const auto& [uname, up] : snap.upstreams) {
    for (std::size_t i = 0; i < up->size(); ++i) {
      const ServerState& s = up->server(i);
      const std::string& addr = s.address.text;
      double cumulative = 0;
      for (std::size_t b = 0; b < kConnectBuckets.size(); ++b) {
        cumulative += load(s.connect_buckets[b]);
        std::array<char, 40> buf;
        const std::string le(number(kConnectBuckets[b], buf));
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
  dns_metrics(w, snap, info);
  return w.take();
}

}  // namespace sluice::admin
