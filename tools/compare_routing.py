#!/usr/bin/python3
"""Per-connection (L4, sluice) against per-request (L7, nginx http) routing.

N small HTTP/1.1 keep-alive backends run on loopback, each answering with its
own id; `/cheap` answers at once and `/expensive` sleeps a few milliseconds,
longer on the slower backends. The same workload (C keep-alive connections,
each sending R requests, some clients heavier than others) goes through

  (a) sluice, which picks a backend once per connection (least_conn), and
  (b) nginx's `http` proxy, which picks one per request (`least_conn` in an
      `upstream` block, keep-alive connections to the backends).

For each backend the tool prints requests, connections and busy time (the sum
of its request service times) and the imbalance max/mean, how many distinct
backends each client connection reached, the wall time, and the proxy's CPU
per request (utime + stime from /proc/PID/stat, master and workers for
nginx). Then, when PostgreSQL is installed, the same question for a database
pool: pgbench with 8 persistent connections against pgbench -C (a new
connection per transaction) through sluice over two servers.

Everything listens on 127.0.0.1 on ports the kernel picks; every wait has a
deadline; only processes started here are signalled, by PID.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import http.server
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
sys.path[:0] = [str(TOOLS), str(REPO / "tests" / "integration"), str(REPO / "tests" / "e2e")]

# The benchmark already starts, measures and stops proxies by PID; the test
# harness renders sluice configs and runs sluice; dbpeers runs PostgreSQL.
from bench import (Processes, cpu_seconds, free_port, loadavg, read_lines,  # noqa: E402
                   tail, wait_listening)
import harness  # noqa: E402

CHEAP_PATH = "/cheap"
EXPENSIVE_PATH = "/expensive"
EXPENSIVE_MS = 4.0         # what /expensive costs on the fastest backend
EXPENSIVE_SHARE = (0.05, 0.5)  # lightest and heaviest client's share of /expensive
REQUEST_TIMEOUT_S = 10
SETTLE_S = 0.3             # lets the proxy finish closing sessions before its CPU is read
PG_CLIENTS = 8
PG_RELOAD_AT = 1 / 3       # share of the pgbench run after which the second server is added

PROFILES = {
    "full": {"backends": 4, "connections": 12, "requests": 2500, "limit_s": 120, "pg_s": 8},
    "quick": {"backends": 4, "connections": 8, "requests": 500, "limit_s": 15, "pg_s": 3},
}


class CompareError(Exception):
    """A proxy or backend failed to start or died; the message says why."""


# --------------------------------------------------------------------------
# Backends: one process each, so that their counters are theirs alone and
# they do not share the client's interpreter lock.

def slowness_of(index: int, count: int) -> int:
    """The first half of the backends are fast (1×), the rest 2×, 3×, ..."""
    return max(1, index - math.ceil(count / 2) + 2)


class BackendStats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {"requests": 0, "cheap": 0, "expensive": 0, "connections": 0, "busy_s": 0.0}

    def add(self, **deltas):
        with self.lock:
            for key, value in deltas.items():
                self.counts[key] += value


def make_handler(backend_id: str, expensive_s: float, stats: BackendStats):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"   # keep-alive unless the client closes
        # Buffered: handle_one_request() flushes once per request, so headers
        # and body leave in one write, as from a real server (not two
        # segments that a proxy would have to handle twice).
        wbufsize = 1 << 16
        disable_nagle_algorithm = True

        def setup(self):
            super().setup()
            stats.add(connections=1)

        def do_GET(self):
            started = time.perf_counter()
            if self.path == EXPENSIVE_PATH:
                time.sleep(expensive_s)
            elif self.path != CHEAP_PATH:
                self.send_error(404)
                return
            body = f"{backend_id}\n".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            kind = "expensive" if self.path == EXPENSIVE_PATH else "cheap"
            stats.add(requests=1, busy_s=time.perf_counter() - started, **{kind: 1})

        def log_message(self, *args):
            pass

    return Handler


def serve_backend(spec: str) -> int:
    """Runs one backend: prints "listening PORT", serves until its standard
    input closes, then prints its counters as one JSON line."""
    backend_id, expensive_ms = spec.split(",")
    stats = BackendStats()
    handler = make_handler(backend_id, float(expensive_ms) / 1000, stats)
    http.server.ThreadingHTTPServer.request_queue_size = 128
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"listening {server.server_address[1]}", flush=True)
    sys.stdin.read()
    # The proxy in front has stopped, so no request is in flight: report and
    # exit without waiting for serve_forever's next poll.
    with stats.lock:
        print(json.dumps({"id": backend_id, **stats.counts}), flush=True)
    return 0


@dataclass
class Backend:
    id: str
    slowness: int
    port: int
    proc: subprocess.Popen


class BackendSet:
    """N backend processes, started fresh for each mode."""

    def __init__(self, procs: Processes, workdir: str, count: int, tag: str):
        self.procs = procs
        self.backends = [self._start(workdir, f"b{i + 1}", slowness_of(i, count), tag)
                         for i in range(count)]

    def _start(self, workdir, backend_id, slowness, tag) -> Backend:
        log = os.path.join(workdir, f"{tag}-{backend_id}.log")
        spec = f"{backend_id},{EXPENSIVE_MS * slowness}"
        proc = self.procs.start([sys.executable, __file__, "--serve-backend", spec],
                                log_path=log, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        lines = read_lines(proc, 1, 10.0)
        if not lines or not lines[0].startswith("listening "):
            raise CompareError(f"backend {backend_id} did not start: {tail(log)}")
        return Backend(backend_id, slowness, int(lines[0].split()[1]), proc)

    @property
    def ports(self) -> list[int]:
        return [b.port for b in self.backends]

    def finish(self) -> list[dict]:
        """Stops every backend and returns its counters (in backend order)."""
        for b in self.backends:
            b.proc.stdin.close()  # the backend reports and exits
            b.proc.stdin = None
        out = []
        for b in self.backends:
            lines = read_lines(b.proc, 1, 10.0, stop=lambda l: l.startswith("{"))
            self.procs.stop(b.proc)
            if not lines or not lines[-1].startswith("{"):
                raise CompareError(f"backend {b.id} did not report its counters")
            out.append({**json.loads(lines[-1]), "slowness": b.slowness})
        return out


# --------------------------------------------------------------------------
# The two proxies. Both expose port, cpu() and stop().

def sluice_config(servers: list[str]) -> str:
    listener = harness.listener(name="routing", upstream="pool", idle_timeout="600s")
    global_ = {"workers": 1, "access_log": "off", "log_level": "info", "shutdown_timeout": "2s"}
    upstream = harness.upstream(*servers, balance="least_conn")
    return harness.render_config(global_, [listener], {"pool": upstream})


class SluiceProxy:
    label = "sluice"

    def __init__(self, workdir: str, servers: list[str]):
        self.sluice = harness.Sluice(Path(workdir), sluice_config(servers), ["routing"],
                                     name="sluice")
        try:
            self.sluice.start()
        except AssertionError as exc:
            self.sluice.stop()
            raise CompareError(f"sluice did not start: {exc}") from None
        self.port = self.sluice.port()

    def cpu(self) -> float:
        return cpu_seconds([self.sluice.pid])

    def reload(self, servers: list[str]):
        self.sluice.reload(sluice_config(servers))

    def stop(self):
        self.sluice.stop()


def nginx_config(port: int, prefix: str, servers: list[str]) -> str:
    temp_paths = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"]
    lines = [
        "worker_processes 1;",
        f"pid {prefix}/nginx.pid;",
        f"error_log {prefix}/error.log warn;",
        "events { worker_connections 1024; }",
        "http {",
        "  access_log off;",
        *[f"  {name}_temp_path {prefix}/{name}_temp;" for name in temp_paths],
        # The default (1000) would close the clients' long connections mid-run.
        "  keepalive_requests 1000000;",
        "  keepalive_timeout 600s;",
        "  upstream pool {",
        "    least_conn;",
        *[f"    server {address};" for address in servers],
        "    keepalive 32;",
        "  }",
        "  server {",
        f"    listen 127.0.0.1:{port};",
        "    location / {",
        "      proxy_pass http://pool;",
        "      proxy_http_version 1.1;",
        '      proxy_set_header Connection "";',  # keep the upstream connection open
        "    }",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def child_pids(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


class NginxProxy:
    label = "nginx"

    def __init__(self, procs: Processes, binary: str, workdir: str, servers: list[str]):
        self.procs = procs
        self.port = free_port()
        prefix = os.path.join(workdir, "nginx")
        os.makedirs(prefix, exist_ok=True)
        os.chmod(prefix, 0o755)  # the workers run as an unprivileged user
        conf = os.path.join(prefix, "nginx.conf")
        with open(conf, "w") as f:
            f.write(nginx_config(self.port, prefix, servers))
        self.log = os.path.join(prefix, "error.log")
        self.proc = procs.start([binary, "-p", prefix + "/", "-e", self.log, "-c", conf,
                                 "-g", "daemon off;"], log_path=os.path.join(prefix, "stderr.log"))
        # The master listens before it forks the workers: wait for both.
        ready = wait_listening(self.port, self.proc) and within(
            lambda: child_pids(self.proc.pid), 5.0)
        if not ready:
            self.stop()
            raise CompareError(f"nginx did not start: {tail(self.log)}")

    def cpu(self) -> float:
        return cpu_seconds([self.proc.pid, *child_pids(self.proc.pid)])

    def stop(self):
        self.procs.stop(self.proc)


def within(pred, timeout: float) -> bool:
    """True once pred() is, False if it is not within `timeout` seconds."""
    try:
        return bool(harness.wait_until(pred, timeout=timeout))
    except harness.Timeout:
        return False


# --------------------------------------------------------------------------
# The client: C keep-alive connections, each a thread sending its own plan of
# requests one after another (a closed loop, like a browser or an app server).

def connection_plans(connections: int, requests: int, seed: int) -> list[list[str]]:
    """Some clients are heavier than others: their share of /expensive runs
    evenly from EXPENSIVE_SHARE[0] to [1], in a seeded random order."""
    rng = random.Random(seed)
    low, high = EXPENSIVE_SHARE
    shares = [low + (high - low) * i / max(connections - 1, 1) for i in range(connections)]
    rng.shuffle(shares)
    return [[EXPENSIVE_PATH if rng.random() < share else CHEAP_PATH for _ in range(requests)]
            for share in shares]


@dataclass
class ClientResult:
    latencies: list[float] = field(default_factory=list)
    served_by: set[str] = field(default_factory=set)  # the ids in the answers
    finished_s: float = 0.0
    errors: int = 0
    first_error: str = ""


def drive(conn: http.client.HTTPConnection, plan: list[str], go: threading.Event,
          started: list[float], deadline: float, result: ClientResult):
    go.wait()
    try:
        for path in plan:
            if time.monotonic() >= deadline:
                break
            t0 = time.perf_counter()
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise CompareError(f"{path} answered {resp.status}")
            result.served_by.add(body.decode().strip())
            result.latencies.append(time.perf_counter() - t0)
    except (OSError, http.client.HTTPException, CompareError) as exc:
        result.errors += 1
        result.first_error = f"{type(exc).__name__}: {exc}"
    finally:
        result.finished_s = time.monotonic() - started[0]
        conn.close()


def run_workload(port: int, plans: list[list[str]],
                 limit_s: float) -> tuple[list[ClientResult], float]:
    """Opens every connection first, in order (so the L4 proxy sees them all
    before any request), then lets all clients go at once."""
    conns = []
    for _ in plans:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
        conn.connect()
        conns.append(conn)
    go, started = threading.Event(), [0.0]
    results = [ClientResult() for _ in plans]
    deadline = time.monotonic() + limit_s
    threads = [threading.Thread(target=drive, args=(c, p, go, started, deadline, r), daemon=True)
               for c, p, r in zip(conns, plans, results)]
    for t in threads:
        t.start()
    started[0] = time.monotonic()
    go.set()
    for t in threads:
        t.join(timeout=max(deadline - time.monotonic(), 0) + REQUEST_TIMEOUT_S + 5)
    return results, time.monotonic() - started[0]


# --------------------------------------------------------------------------
# One mode = fresh backends + fresh proxy + the workload.

@dataclass
class ModeResult:
    name: str            # "L4" or "L7"
    proxy: str
    backends: list[dict]
    clients: list[ClientResult]
    wall_s: float
    proxy_cpu_s: float
    planned: int

    @property
    def requests(self) -> int:
        return sum(len(c.latencies) for c in self.clients)

    def imbalance(self, key: str) -> float | None:
        values = [b[key] for b in self.backends]
        mean = statistics.mean(values) if values else 0
        return max(values) / mean if mean else None

    def latency_ms(self, q: float) -> float:
        values = sorted(x for c in self.clients for x in c.latencies)
        return values[min(int(q * len(values)), len(values) - 1)] * 1000 if values else 0.0

    def cpu_us_per_request(self) -> float:
        return self.proxy_cpu_s * 1e6 / max(self.requests, 1)

    def reached(self) -> list[int]:
        """How many client connections reached 1, 2, ... N distinct backends
        (index k-1 holds k), from the backend ids in the answers each
        connection received."""
        counts = [0] * len(self.backends)
        for c in self.clients:
            if c.served_by:
                counts[min(len(c.served_by), len(counts)) - 1] += 1
        return counts


def run_mode(name: str, make_proxy, ctx) -> ModeResult:
    backends = BackendSet(ctx.procs, ctx.workdir, ctx.backends, name)
    proxy = None
    try:
        proxy = make_proxy([f"127.0.0.1:{p}" for p in backends.ports])
        cpu0 = proxy.cpu()
        clients, wall = run_workload(proxy.port, ctx.plans, ctx.limit_s)
        time.sleep(SETTLE_S)
        cpu = proxy.cpu() - cpu0
    finally:
        if proxy is not None:
            proxy.stop()
    stats = backends.finish()
    planned = sum(len(p) for p in ctx.plans)
    return ModeResult(name, proxy.label, stats, clients, wall, cpu, planned)


# --------------------------------------------------------------------------
# Printing

def fmt(value, spec="{:.2f}") -> str:
    return "–" if value is None else spec.format(value)


def print_table(header: list[str], rows: list[list[str]]):
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def finish_range(m: ModeResult) -> str:
    finished = [c.finished_s for c in m.clients]
    return f"{min(finished):.2f} s to {max(finished):.2f} s"


def print_mode(m: ModeResult, title: str):
    print(f"\n### {m.name}: {title}\n")
    rows = [[b["id"], f"{b['slowness']}×", str(b["requests"]), str(b["expensive"]),
             str(b["connections"]), f"{b['busy_s']:.2f}"] for b in m.backends]
    rows.append(["imbalance max/mean", "", fmt(m.imbalance("requests")),
                 fmt(m.imbalance("expensive")), fmt(m.imbalance("connections")),
                 fmt(m.imbalance("busy_s"))])
    print_table(["backend", "slowness", "requests", "of which /expensive", "connections",
                 "busy s"], rows)
    errors = sum(c.errors for c in m.clients)
    print(f"\n{m.requests} of {m.planned} requests in {m.wall_s:.2f} s; client connections "
          f"finished from {finish_range(m)}; "
          f"{m.proxy} CPU {m.proxy_cpu_s:.2f} s = {m.cpu_us_per_request():.1f} µs/request; "
          f"{errors} errors")
    firsts = [c.first_error for c in m.clients if c.first_error]
    if firsts:
        print(f"first error: {firsts[0]}")


def print_reached(l4: ModeResult, l7: ModeResult):
    print("\n### backends reached per client connection\n")
    print("Client connections (of the workload's C) that received answers from k "
          "distinct backends.\n")
    print_table(["backends reached", f"L4 ({l4.proxy})", f"L7 ({l7.proxy})"],
                [[str(k + 1), str(a), str(b)]
                 for k, (a, b) in enumerate(zip(l4.reached(), l7.reached()))])


def print_summary(l4: ModeResult, l7: ModeResult):
    print("\n### side by side\n")
    figures = [
        ("requests imbalance (max/mean)", lambda m: fmt(m.imbalance("requests"))),
        ("busy-time imbalance (max/mean)", lambda m: fmt(m.imbalance("busy_s"))),
        ("backend connections opened", lambda m: str(sum(b["connections"] for b in m.backends))),
        ("backends seen per client connection",
         lambda m: f"{statistics.mean(len(c.served_by) for c in m.clients):.1f}"),
        ("wall time, s", lambda m: f"{m.wall_s:.2f}"),
        ("requests/s", lambda m: f"{m.requests / max(m.wall_s, 1e-9):.0f}"),
        ("latency p50 / p99, ms", lambda m: f"{m.latency_ms(0.5):.2f} / {m.latency_ms(0.99):.2f}"),
        ("proxy CPU µs/request", lambda m: f"{m.cpu_us_per_request():.1f}"),
    ]
    print_table(["figure", f"L4 ({l4.proxy})", f"L7 ({l7.proxy})"],
                [[label, get(l4), get(l7)] for label, get in figures])


def cpu_comparison(l4: ModeResult, l7: ModeResult) -> str:
    sluice, nginx = l4.cpu_us_per_request(), l7.cpu_us_per_request()
    if min(sluice, nginx) <= 0:
        return "too little to compare"
    if nginx >= sluice:
        return f"sluice spent {nginx / sluice:.1f}× less"
    return f"sluice spent {sluice / nginx:.1f}× more"


def print_notes(title: str, bullets: list[str]):
    """A heading and bullets, wrapped to 78 columns (the figures in them vary)."""
    print(f"\n{title}\n")
    for bullet in bullets:
        print(textwrap.fill(" ".join(bullet.split()), width=78, initial_indent="- ",
                            subsequent_indent="  "))


def print_http_explanation(l4: ModeResult, l7: ModeResult):
    l7_conns = sum(b["connections"] for b in l7.backends)
    print_notes("What differs, and why:", [
        f"""L4 (sluice) chooses a backend when a connection opens, so every
        request on that connection goes to the same backend. least_conn spreads
        the *connections* evenly ({fmt(l4.imbalance("connections"))} max/mean),
        but a connection is a unit of unknown size: a heavy client, or one that
        landed on a slow backend, keeps its backend busy for as long as it
        lasts. With few long connections this pins load: busy time
        {fmt(l4.imbalance("busy_s"))} max/mean here, and the clients finished
        anywhere from {finish_range(l4)}.""",
        f"""L7 (nginx http) parses every request and chooses per request.
        least_conn there counts requests in flight, so a slow backend, which
        holds its requests longer, is given fewer of them: busy time
        {fmt(l7.imbalance("busy_s"))} max/mean, clients finished from
        {finish_range(l7)}. It opened {l7_conns} connections to the backends over
        the run and shared them among all clients.""",
        f"""The price of looking inside: for every request nginx parses the
        request and the response headers, rebuilds the request for the backend
        and manages its pool of backend connections; sluice copies bytes. Here
        nginx spent {l7.cpu_us_per_request():.1f} µs of CPU per request and
        sluice {l4.cpu_us_per_request():.1f} µs ({cpu_comparison(l4, l7)}). At
        these rates both wake up for every message, and that fixed cost, which
        a busy machine inflates, weighs on both alike. An L7 proxy must also
        speak the protocol, and terminate TLS to see it; sluice never parses
        the bytes, so it carries PostgreSQL, Redis, or TLS it does not decrypt,
        at the same cost.""",
    ])
    print_notes("When to pick which:", [
        """L4 when connections are short or many (the per-connection choice
        then evens out), when the protocol is not HTTP or is end-to-end TLS,
        when the backends tie state to a connection (database sessions,
        transactions, prepared statements), and when CPU per byte matters.""",
        """L7 when a few long-lived keep-alive or multiplexed connections
        carry most requests (HTTP/1.1 keep-alive from other proxies, HTTP/2,
        gRPC), when request cost varies a lot, or when routing needs the
        request itself (paths, headers, retrying one request).""",
        """sluice's `max_lifetime` listener key (e.g. `max_lifetime = "5m"`)
        closes each session that long after it was accepted, busy or not. The
        client reconnects and least_conn puts the new connection on the
        backend with the fewest sessions. That undoes pinning by *connection
        count*: a backend added or back from a failure fills up within one
        lifetime, and heavy clients are reshuffled over time. It does not make
        a per-connection choice see request cost: here every backend already
        holds as many connections as the others, so a reconnecting client may
        well land where it was. A request in flight at that moment is cut, so
        pick a lifetime far longer than a request and let clients retry
        idempotent requests; a client or pool that retires its own connections
        by age does the same between requests, more gently, with
        `max_lifetime` as the backstop.""",
    ])


# --------------------------------------------------------------------------
# Chart

L4_COLOR, L7_COLOR = "#4c72b0", "#dd8452"
POOL_COLOR, PER_XACT_COLOR = "#55a868", "#c44e52"


def write_chart(path: str, l4: ModeResult, l7: ModeResult, db: list[PgRun] | None,
                db_note: str):
    """Six panels. Top: where the HTTP requests and their cost landed, and
    how many backends each client connection reached. Bottom: how long the
    workload took, then the database pool (pgbench) when it ran. The
    backends' connection counts are left out: with least_conn both modes
    open about as many, so that panel showed nothing."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams["svg.hashsalt"] = "sluice-routing"  # the same run gives the same file
    plt.rcParams["svg.fonttype"] = "none"  # text stays text: smaller, searchable
    fig, axes = plt.subplots(2, 3, figsize=(13, 8.4))
    modes = ((l4, -0.2, L4_COLOR, "per connection"), (l7, 0.2, L7_COLOR, "per request"))
    xs = list(range(len(l4.backends)))
    labels = [f"{b['id']} ({b['slowness']}×)" for b in l4.backends]
    for ax, key, title in ((axes[0][0], "requests", "requests served, per backend"),
                           (axes[0][1], "busy_s", "busy time per backend, s")):
        for m, offset, color, how in modes:
            ax.bar([x + offset for x in xs], [b[key] for b in m.backends], 0.4, color=color,
                   label=f"{m.name}: {m.proxy}, one choice {how}")
        ax.set_xticks(xs, labels)
        ax.set_xlabel("backend (slowness)")
        ax.set_title(f"{title}\nmax/mean: L4 {fmt(l4.imbalance(key))}, "
                     f"L7 {fmt(l7.imbalance(key))}", fontsize=10)
    chart_reached(axes[0][2], modes, len(l4.clients))
    chart_wall(axes[1][0], modes)
    if db:
        chart_db_share(axes[1][1], db)
        chart_db_rate(axes[1][2], db)
    else:
        for ax in axes[1][1:]:
            ax.axis("off")
        axes[1][1].text(0, 0.5, f"PostgreSQL pool: {db_note}", fontsize=10, wrap=True)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, 0.965), ncol=2,
               fontsize=9, frameon=False)
    fig.suptitle(f"HTTP: {len(l4.clients)} keep-alive client connections × "
                 f"{l4.planned // max(len(l4.clients), 1)} requests over {len(l4.backends)} "
                 f"backends, least_conn in both modes", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.935), h_pad=2.5)
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def chart_reached(ax, modes, clients: int):
    from matplotlib.ticker import MaxNLocator
    ks = list(range(1, len(modes[0][0].backends) + 1))
    for m, offset, color, _ in modes:
        ax.bar([k + offset for k in ks], m.reached(), 0.4, color=color)
    ax.set_xticks(ks)
    ax.set_xlabel("distinct backends that answered it")
    ax.set_ylabel("client connections")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, clients * 1.1)
    ax.set_title("backends reached per client connection\n"
                 f"(each of the {clients} client connections counted once)", fontsize=10)


def chart_wall(ax, modes):
    """A bar per mode for the whole workload, a dot per client connection
    for when it had sent all its requests."""
    for i, (m, _, color, how) in enumerate(modes):
        ax.bar(i, m.wall_s, 0.6, color=color)
        finished = sorted(c.finished_s for c in m.clients)
        spread = [i - 0.2 + 0.4 * j / max(len(finished) - 1, 1) for j in range(len(finished))]
        ax.plot(spread, finished, "o", color="black", markersize=3.5)
        ax.annotate(f"{m.wall_s:.1f} s", (i, m.wall_s), textcoords="offset points",
                    xytext=(0, 3), ha="center", fontsize=9)
    ax.plot([], [], "o", color="black", markersize=3.5,
            label="when one client connection finished")
    ax.legend(fontsize=8, loc="upper right", frameon=False)
    ax.set_xticks([0, 1], [f"{m.name} {m.proxy}\n({how})" for m, _, _, how in modes])
    ax.set_xlim(-0.7, 1.7)
    ax.set_ylim(0, max(m.wall_s for m, *_ in modes) * 1.3)
    ax.set_ylabel("seconds")
    ax.set_title("wall time of the HTTP workload, s\n(bar: all of it; dots: each client "
                 "connection)", fontsize=10)


def db_bars(ax, db: list[PgRun], value, label):
    """Grouped by scenario, a bar each for persistent connections and -C;
    `label(run)` is written over each bar."""
    scenarios = list(dict.fromkeys(r.scenario for r in db))
    runs = {(r.scenario, r.mode): r for r in db}
    for mode, offset, color, name in (
            ("persistent", -0.2, POOL_COLOR, "persistent connections (a pool)"),
            ("-C", 0.2, PER_XACT_COLOR, "pgbench -C: a new connection per transaction")):
        for i, scenario in enumerate(scenarios):
            run = runs.get((scenario, mode))
            if run is None:
                continue
            ax.bar(i + offset, value(run), 0.4, color=color, label=name if i == 0 else None)
            ax.annotate(label(run), (i + offset, value(run)), textcoords="offset points",
                        xytext=(0, 3), ha="center", fontsize=8)
    ax.set_xticks(range(len(scenarios)), [
        {"steady": "steady\n(a, b from the start)",
         "scale-out": "scale-out\n(b joins by reload)"}.get(s, s) for s in scenarios])
    ax.set_xlim(-0.7, len(scenarios) - 0.3)
    ax.legend(fontsize=8, loc="upper left", frameon=False)


def chart_db_share(ax, db: list[PgRun]):
    db_bars(ax, db, share_of_b, lambda r: f"{share_of_b(r):.0f} %")
    ax.set_ylim(0, 100)
    ax.set_ylabel("% of all transactions")
    ax.set_title(f"PostgreSQL via sluice: share of transactions on server b\n"
                 f"(pgbench -c {PG_CLIENTS}, servers a and b, least_conn)", fontsize=10)


def chart_db_rate(ax, db: list[PgRun]):
    db_bars(ax, db, lambda r: r.tps, lambda r: f"{r.tps:.0f} tps\n"
            f"{sum(r.sessions)} sessions")
    ax.set_yscale("log")
    ax.set_ylim(min(max(r.tps, 0.1) for r in db) / 3, max(max(r.tps for r in db), 1) * 30)
    ax.set_ylabel("transactions per second (log scale)")
    ax.set_title("PostgreSQL via sluice: transactions per second\n"
                 "(label: server sessions that committed)", fontsize=10)


# --------------------------------------------------------------------------
# The database pool: pgbench through sluice over two PostgreSQL servers.

PG_TABLE = "routed_xacts"
PG_SCRIPT = f"INSERT INTO {PG_TABLE} VALUES (pg_backend_pid());\n"


@dataclass
class PgRun:
    scenario: str
    mode: str
    xacts: list[int]        # per server, from each server's own table
    sessions: list[int]     # distinct backend PIDs that committed there
    tps: float
    cpu_us_per_xact: float
    ok: bool
    note: str = ""


def pg_counts(dbpeers, servers) -> tuple[list[int], list[int]]:
    xacts, sessions = [], []
    for srv in servers:
        out = dbpeers.psql(srv.port, f"SELECT count(*), count(DISTINCT pid) FROM {PG_TABLE}")
        n, pids = out.stdout.strip().split("|")
        xacts.append(int(n))
        sessions.append(int(pids))
    return xacts, sessions


def run_pgbench(dbpeers, ctx, servers, scenario: str, per_xact_connect: bool) -> PgRun:
    """One pgbench run through a fresh sluice. In the "scale-out" scenario
    sluice starts with the first server only and a reload adds the second
    after PG_RELOAD_AT of the run."""
    for srv in servers:
        dbpeers.psql(srv.port, f"TRUNCATE {PG_TABLE}")
    addresses = [s.address for s in servers]
    scale_out = scenario == "scale-out"
    proxy = SluiceProxy(ctx.workdir, addresses[:1] if scale_out else addresses)
    args = ["-n", "-c", str(PG_CLIENTS), "-j", "2", "-T", str(ctx.pg_s), "-f", ctx.pg_script]
    if per_xact_connect:
        args.append("-C")
    try:
        cpu0 = proxy.cpu()
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(dbpeers.pgbench, proxy.port, *args, timeout=ctx.pg_s + 60)
            if scale_out:
                time.sleep(ctx.pg_s * PG_RELOAD_AT)
                proxy.reload(addresses)
            result = future.result(timeout=ctx.pg_s + 90)
        time.sleep(SETTLE_S)
        cpu = proxy.cpu() - cpu0
    finally:
        proxy.stop()
    xacts, sessions = pg_counts(dbpeers, servers)
    m = re.search(r"tps = ([0-9.]+)", result.stdout)
    note = "" if result.returncode == 0 else (result.stderr.strip().splitlines() or ["?"])[-1]
    return PgRun(scenario, "-C" if per_xact_connect else "persistent", xacts, sessions,
                 float(m.group(1)) if m else 0.0, cpu * 1e6 / max(sum(xacts), 1),
                 result.returncode == 0, note)


def run_db_comparison(ctx) -> tuple[list[PgRun] | None, str]:
    """The pgbench runs, or None and why there are none."""
    import dbpeers
    missing = dbpeers.pg_missing()
    if missing:
        print(f"\n## Database pool: skipped, PostgreSQL is not installed here ({missing}).")
        return None, f"not measured, PostgreSQL is not installed ({missing})"
    ctx.pg_script = os.path.join(ctx.workdir, "routed.sql")
    with open(ctx.pg_script, "w") as f:
        f.write(PG_SCRIPT)
    runs = []
    with dbpeers.pg_cluster_pair() as clusters, dbpeers.pg_servers(clusters) as servers:
        for srv in servers:
            dbpeers.psql(srv.port, f"CREATE TABLE {PG_TABLE} (pid int)")
        for scenario in ("steady", "scale-out"):
            for per_xact_connect in (False, True):
                runs.append(run_pgbench(dbpeers, ctx, servers, scenario, per_xact_connect))
                print(f"[{time.monotonic() - ctx.started:5.1f}s] pgbench {scenario} "
                      f"{runs[-1].mode} done", file=sys.stderr, flush=True)
    print_db(runs, ctx.pg_s)
    return runs, ""


def share_of_b(run: PgRun) -> float:
    return 100 * run.xacts[1] / max(sum(run.xacts), 1)


def print_db(runs: list[PgRun], seconds: float):
    print(f"\n## Database pool: pgbench -c {PG_CLIENTS} through sluice (least_conn) over two "
          f"PostgreSQL servers, {seconds} s each\n")
    print('"steady": both servers from the start. "scale-out": sluice starts with server a '
          f"only; a reload adds b after {seconds * PG_RELOAD_AT:.1f} s.\n")
    rows = [[r.scenario, "pgbench" + (" -C" if r.mode == "-C" else ""),
             str(r.xacts[0]), str(r.xacts[1]), f"{share_of_b(r):.0f} %",
             f"{r.sessions[0]} / {r.sessions[1]}", f"{r.tps:.0f}",
             f"{r.cpu_us_per_xact:.1f}", "ok" if r.ok else f"failed: {r.note}"] for r in runs]
    print_table(["scenario", "client", "xacts on a", "xacts on b", "b's share",
                 "sessions a / b", "tps", "sluice CPU µs/xact", "pgbench"], rows)
    print_db_explanation({(r.scenario, r.mode): r for r in runs})


def print_db_explanation(runs: dict[tuple[str, str], PgRun]):
    steady = runs["steady", "persistent"]
    scale_out, scale_out_c = runs["scale-out", "persistent"], runs["scale-out", "-C"]
    print_notes("What it means for connection pools:", [
        f"""With persistent connections (a pool, or pgbench without -C)
        sluice places each connection once and transactions follow their
        connection. With both servers from the start the {PG_CLIENTS}
        connections split {steady.sessions[0]} / {steady.sessions[1]}, and the
        transactions with them (b's share {share_of_b(steady):.0f} %: each
        connection ran as fast as its server and its pgbench thread let it).""",
        f"""A server added later, or back from maintenance, gets nothing from
        a pool whose connections are already open: in "scale-out" b served
        {scale_out.xacts[1]} transactions of the persistent run, and would
        serve none however long it went on. Rebalancing needs the pool to
        reopen connections: a maximum connection age in the pool (it closes
        them between transactions), or sluice's `max_lifetime` as a backstop
        (it closes busy sessions too, aborting the transaction in flight).""",
        f"""With a connection per transaction (-C) every transaction is
        routed anew, so b takes its share as soon as it is in
        ({share_of_b(scale_out_c):.0f} % of the whole run, having joined after
        {PG_RELOAD_AT:.0%} of it), but every transaction pays a TCP connect, a
        PostgreSQL backend start and authentication: compare the tps and
        sluice's CPU per transaction. That is what pools are for. Put sluice
        in front of a pool that recycles its connections, or of a pooler
        (PgBouncer) that multiplexes transactions, rather than dropping the
        pool.""",
    ])


# --------------------------------------------------------------------------

class Context:
    pass


def default_sluice() -> str:
    """The release build when there is one: its CPU figures are the fair ones."""
    for candidate in ("build-rel/sluice", "build/sluice"):
        if os.access(REPO / candidate, os.X_OK):
            return str(REPO / candidate)
    return str(REPO / "build/sluice")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sluice", default=default_sluice(),
                    help="sluice binary (default: build-rel/sluice if present, else build/sluice)")
    ap.add_argument("--nginx", default=shutil.which("nginx") or "/usr/sbin/nginx",
                    help="nginx binary (default: nginx from PATH)")
    ap.add_argument("--out", metavar="DIR", help="write DIR/routing.svg (needs python3-matplotlib)")
    ap.add_argument("--quick", action="store_true", help="small run, all of it in under a minute")
    ap.add_argument("--no-db", action="store_true", help="skip the PostgreSQL pool comparison")
    ap.add_argument("--backends", type=int, help="number of backends (N)")
    ap.add_argument("--connections", type=int, help="client keep-alive connections (C)")
    ap.add_argument("--requests", type=int, help="requests per connection (R)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the request mix")
    ap.add_argument("--serve-backend", metavar="ID,MS", help=argparse.SUPPRESS)
    args = ap.parse_args()
    profile = PROFILES["quick" if args.quick else "full"]
    for key in ("backends", "connections", "requests"):
        if getattr(args, key) is None:
            setattr(args, key, profile[key])
    if not (2 <= args.backends <= 16 and 1 <= args.connections <= 256
            and 1 <= args.requests <= 100000):
        ap.error("need 2..16 backends, 1..256 connections and 1..100000 requests")
    args.profile = profile
    return args


def check_tools(args) -> str | None:
    if not os.access(args.sluice, os.X_OK):
        return f"sluice binary not found at {args.sluice} (build it, or pass --sluice)"
    if not shutil.which(args.nginx):
        return f"nginx not found ({args.nginx}); install Debian's nginx or pass --nginx"
    if args.out:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return "--out needs python3-matplotlib (tools/setup.sh installs it)"
    return None


def run_http_comparison(ctx, args) -> tuple[ModeResult, ModeResult]:
    l4 = run_mode("L4", lambda servers: SluiceProxy(ctx.workdir, servers), ctx)
    print(f"[{time.monotonic() - ctx.started:5.1f}s] L4 done", file=sys.stderr, flush=True)
    l7 = run_mode("L7", lambda servers: NginxProxy(ctx.procs, args.nginx, ctx.workdir, servers),
                  ctx)
    print(f"[{time.monotonic() - ctx.started:5.1f}s] L7 done", file=sys.stderr, flush=True)
    return l4, l7


def print_report_head(args, load_before: str):
    slow = ", ".join(f"b{i + 1} {slowness_of(i, args.backends)}×" for i in range(args.backends))
    print(f"# L4 (per connection) against L7 (per request) routing "
          f"({'quick' if args.quick else 'full'} run; {os.cpu_count()} CPUs; "
          f"load average {load_before} before, {loadavg()} after)\n")
    print(f"{args.backends} backends ({slow}); {CHEAP_PATH} answers at once, {EXPENSIVE_PATH} "
          f"sleeps {EXPENSIVE_MS:g} ms × slowness. {args.connections} keep-alive connections × "
          f"{args.requests} requests; each client's share of {EXPENSIVE_PATH} lies between "
          f"{EXPENSIVE_SHARE[0]:.0%} and {EXPENSIVE_SHARE[1]:.0%} (seed {args.seed}). Busy s = "
          f"sum of a backend's request service times.")


def main() -> int:
    args = parse_args()
    if args.serve_backend:
        return serve_backend(args.serve_backend)
    problem = check_tools(args)
    if problem:
        print(f"compare_routing: {problem}", file=sys.stderr)
        return 2
    os.environ["SLUICE_BIN"] = os.path.abspath(args.sluice)  # harness.Sluice runs this one
    ctx = Context()
    ctx.procs, ctx.started = Processes(), time.monotonic()
    ctx.workdir = tempfile.mkdtemp(prefix="sluice-routing-")
    ctx.backends = args.backends
    ctx.limit_s, ctx.pg_s = args.profile["limit_s"], args.profile["pg_s"]
    ctx.plans = connection_plans(args.connections, args.requests, args.seed)
    load_before = loadavg()
    try:
        l4, l7 = run_http_comparison(ctx, args)
        print_report_head(args, load_before)
        print_mode(l4, "sluice, one choice per connection (least_conn)")
        print_mode(l7, "nginx http, one choice per request (least_conn, keepalive 32)")
        print_reached(l4, l7)
        print_summary(l4, l7)
        print_http_explanation(l4, l7)
        db, db_note = (None, "not measured in this run (--no-db)") if args.no_db \
            else run_db_comparison(ctx)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            write_chart(os.path.join(args.out, "routing.svg"), l4, l7, db, db_note)
            print(f"\nchart: {os.path.join(args.out, 'routing.svg')}")
        db_ok = all(r.ok for r in db or [])
    except (CompareError, OSError, subprocess.TimeoutExpired, AssertionError) as exc:
        print(f"compare_routing: {exc}", file=sys.stderr)
        return 1
    finally:
        ctx.procs.stop_all()
        shutil.rmtree(ctx.workdir, ignore_errors=True)
    errors = sum(c.errors for m in (l4, l7) for c in m.clients)
    return 0 if errors == 0 and db_ok else 1


if __name__ == "__main__":
    sys.exit(main())
