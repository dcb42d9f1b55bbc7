#!/usr/bin/env python3
"""Benchmark sluice against HAProxy (mode tcp) and nginx (stream) on loopback.

Every system gets the same backends, the same loads and one worker thread.
For each load the script records the proxy's own CPU time (utime + stime from
/proc/PID/stat) and divides it by the work done, so the figures that matter
are CPU per connection / per request / per GB and memory per idle connection,
plus rates and latency percentiles. Beside the proxy's own CPU it reports the
busy time of the whole machine (/proc/stat) over the same work, so that cost
moved into the kernel or onto the peers still shows. Ratios sluice/HAProxy
and sluice/nginx are printed next to them.

--latency, --storm and --capacity replace the loads with open-loop latency
at fixed offered rates, changes under load, and the highest rate each system
serves within a p99 bound; --phases, where sluice's slowest sessions lose
their time (tools/openloop.py).

The script builds nothing: point it at a sluice binary and a loadgen binary.
It only ever signals processes it started itself, by PID.
"""

import argparse
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
ALL_SYSTEMS = ["sluice", "haproxy", "nginx"]
# sluice with listener settings other than the defaults: opt-in systems
# (e.g. --only sluice,sluice-pipe,sluice-auto,haproxy,nginx --loads bulk).
# sluice-nohalfclose ends a session on its first FIN, like nginx's default.
VARIANT_SYSTEMS = {"sluice-pipe": ['splice = "pipe"'], "sluice-auto": ['splice = "auto"'],
                   "sluice-nohalfclose": ["half_close = false"]}
# TCP keepalive and several workers, beside peers configured the same way
# (see PEER_VARIANTS). sluice-base-* run the --sluice-base binary.
VARIANT_SYSTEMS.update({
    "sluice-keepalive": ["tcp_keepalive = true"], "sluice-base-keepalive": ["tcp_keepalive = true"],
    "sluice-w2": ["workers = 2"], "sluice-base-w2": ["workers = 2"]})
# The listen backlog sluice had before 4096 (nginx's default): beside
# sluice in one run, the evidence for the default (docs/decisions.md).
VARIANT_SYSTEMS["sluice-backlog511"] = ["backlog = 511"]
# The control thread on CPU 1 and the worker on CPU 0 ([global]
# control_cpu): beside sluice in --storm, whether keeping the admin API,
# reloads and checks off the worker's core keeps them off its tail.
VARIANT_SYSTEMS["sluice-control-cpu"] = ["control_cpu = 1"]
# nginx with `proxy_half_close on`: a FIN is passed on and the session waits
# for the other side's, as sluice always does and HAProxy does by default
# (nginx's default closes both sides on the first FIN). Opt-in, beside nginx.
NGINX_HALF_CLOSE = "nginx-halfclose"
# nginx-keepalive: `so_keepalive=60s:10s:6` on `listen` and `proxy_socket_keepalive
# on` (sluice's default keepalive; nginx cannot set the server leg's times, so
# that leg uses the kernel's). haproxy-w2 / nginx-w2: `nbthread 2` /
# `worker_processes 2`, beside sluice-w2.
PEER_VARIANTS = {"nginx-keepalive": {"keepalive": True}, "nginx-w2": {"workers": 2},
                 "haproxy-w2": {"nbthread": 2}}
PEERS = ("haproxy", "nginx", NGINX_HALF_CLOSE, *PEER_VARIANTS)
ALL_LOADS = ["conn", "conn_sc", "rr", "bulk", "bulk_fault", "idle", "tls", "sys", "sys_sc",
             "pgbench", "pgbench_c", "conn_1000", "conn_1000_hash", "conn_1000_dns",
             "conn_1000_dns_hash"]
ALL_LOADS.insert(ALL_LOADS.index("pgbench_c") + 1, "sysbench")
PG_LOADS = ("pgbench", "pgbench_c")
MANY_LOADS = ("conn_1000", "conn_1000_hash")
MANY_SERVERS = 1000
# The conn_1000 backends given by a DNS server (dnsmasq) the benchmark
# starts: one name with MANY_SERVERS A records, asked again every second.
DNS_LOADS = ("conn_1000_dns", "conn_1000_dns_hash")
DNS_NAME = "many.bench.test"
SLUICE_ONLY = "sluice only"  # the result of a DNS load for HAProxy and nginx
NGINX_STREAM_MODULE = "/usr/lib/nginx/modules/ngx_stream_module.so"
TLS_NAMES = ["a.bench.test", "b.bench.test"]
CONNECT_TIMEOUT_S = 5
IDLE_TIMEOUT_S = 600  # the same idle/session timeout in all three proxies

# Load sizes. "quick" is a smoke run (about half a minute for all systems).
PROFILES = {
    "full": {
        "conn_s": 10, "conn_c": 32, "payload": 64,
        "rr_s": 10, "rr_c": 32, "rr_size": 64,
        "bulk_bytes": 2 << 30, "bulk_c": 4,
        "idle_count": 2000,
        "tls_s": 10, "tls_c": 16,
        "sys_s": 3,
        "pg_s": 10, "pg_c": 8, "pg_scale": 4,
        "many_s": 10,
    },
    "quick": {
        "conn_s": 1.5, "conn_c": 32, "payload": 64,
        "rr_s": 1.5, "rr_c": 32, "rr_size": 64,
        "bulk_bytes": 256 << 20, "bulk_c": 4,
        "idle_count": 500,
        "tls_s": 1.5, "tls_c": 16,
        "sys_s": 1,
        "pg_s": 2, "pg_c": 8, "pg_scale": 1,
        "many_s": 1.5,
    },
}


# The sysbench load's sizes, per profile.
PROFILES["full"].update({"sb_s": 10, "sb_c": 8, "sb_tables": 2, "sb_rows": 10000})
PROFILES["quick"].update({"sb_s": 2, "sb_c": 8, "sb_tables": 1, "sb_rows": 10000})


class BenchError(Exception):
    """A load or a proxy failed; the message says why."""


# --------------------------------------------------------------------------
# Processes: everything started here is tracked and stopped by PID.

class Processes:
    def __init__(self):
        self.procs = []

    def start(self, argv, log_path=None, stdin=subprocess.DEVNULL, stdout=None):
        log = open(log_path, "ab") if log_path else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(
                argv, stdin=stdin,
                stdout=stdout if stdout is not None else log,
                stderr=log, preexec_fn=_raise_nofile)
        finally:
            if log_path:
                log.close()
        self.procs.append(proc)
        return proc

    def stop(self, proc, grace=3.0):
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            except ProcessLookupError:
                pass
        for stream in (proc.stdin, proc.stdout):
            if stream:
                stream.close()
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self):
        for proc in list(reversed(self.procs)):
            try:
                self.stop(proc)
            except Exception as exc:  # keep stopping the rest
                print(f"warning: could not stop pid {proc.pid}: {exc}", file=sys.stderr)


def _raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# --------------------------------------------------------------------------
# /proc readings

def cpu_seconds(pids):
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            # The command name may contain spaces; fields restart after ')'.
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / CLK_TCK


def worker_pids(pid, count, timeout=5.0):
    """The `count` child processes of `pid` (nginx's workers under its master)."""
    deadline = time.monotonic() + timeout
    while True:
        kids = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(k) for k in f.read().split()]
        if len(kids) >= count or time.monotonic() > deadline:
            return kids


def rss_bytes(pids):
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def loadavg():
    """1-minute load average: other work on the machine skews rates, not CPU/op."""
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def machine_cpu_ticks():
    """The whole machine's CPU time since boot, all cores summed, in clock
    ticks: user, nice, system, idle, iowait, irq, softirq, steal (/proc/stat)."""
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:9]]


def machine_busy_seconds():
    """CPU time the whole machine has spent busy since boot: user + nice +
    system + irq + softirq + steal (everything but idle and iowait; guest
    time is already inside user)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = machine_cpu_ticks()
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def steal_seconds():
    """Time the host gave this machine's CPUs to others while they wanted to
    run, since boot, all cores summed."""
    return machine_cpu_ticks()[7] / CLK_TCK


def listen_queue_counters():
    """The machine's TcpExt ListenOverflows (a SYN or a completed handshake
    dropped because a listening socket's accept queue was full) and
    ListenDrops (every drop at a listening socket, overflows included),
    since boot (/proc/net/netstat)."""
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], (int(v) for v in values.split()[1:])))
            return {"overflows": table.get("ListenOverflows", 0), "drops": table.get("ListenDrops", 0)}
    return {"overflows": 0, "drops": 0}


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, proc, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.02)
    return False


def read_lines(proc, want, timeout, stop=None):
    """Reads up to `want` stdout lines from `proc`, waiting at most `timeout` s.

    Reads the raw fd so that select() never misses lines already buffered.
    Stops early at EOF or at a line for which `stop(line)` is true.
    """
    fd = proc.stdout.fileno()
    buf = b""
    lines = []
    deadline = time.monotonic() + timeout
    while len(lines) < want and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf and len(lines) < want:
            line, buf = buf.split(b"\n", 1)
            lines.append(line.decode().strip())
            if stop and stop(lines[-1]):
                return lines
    return lines


def tail(path, lines=8):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).strip()
    except OSError:
        return ""


# --------------------------------------------------------------------------
# Backends (shared by all systems)

class Backends:
    def __init__(self, procs, loadgen, workdir, want_tls, want_many=False):
        self.procs = procs
        self.loadgen = loadgen
        self.workdir = workdir
        self.echo = self._serve(["--mode", "echo", "--listeners", "2"], "echo")
        self.echo_close = self._serve(["--mode", "echo_close", "--listeners", "2"], "echo_close")
        self.source = self._serve(["--mode", "source", "--listeners", "2"], "source")
        self.tls = {}
        if want_tls:
            for name in TLS_NAMES:
                cert, key = make_cert(workdir, name)
                self.tls[name] = self._serve(["--mode", "echo", "--tls", cert, key], "tls-" + name)
        self.many = []
        if want_many:
            # One echo process reached at MANY_SERVERS loopback addresses
            # (127.0.0.1, 127.0.0.2, ...: all of 127/8 is local on Linux), so
            # the backend does the same work whether the proxy has one server
            # or a thousand. That needs the wildcard address; every connection
            # to it still goes over loopback.
            port = self._serve(["--mode", "echo", "--host", "0.0.0.0"], "echo-many")[0]
            self.many = [f"{loopback_address(i)}:{port}" for i in range(MANY_SERVERS)]

    def _serve(self, args, tag):
        proc = self.procs.start([self.loadgen, "serve", *args, "--port", "0"],
                                log_path=os.path.join(self.workdir, f"backend-{tag}.log"),
                                stdout=subprocess.PIPE)
        want = int(args[args.index("--listeners") + 1]) if "--listeners" in args else 1
        ports = [int(l.split()[1]) for l in read_lines(proc, want, 5.0)
                 if l.startswith("listening ")]
        if len(ports) < want:
            raise BenchError(f"backend {tag} did not start: "
                             + tail(os.path.join(self.workdir, f"backend-{tag}.log")))
        return ports


def loopback_address(i):
    """The i-th address of 127.0.0.0/8 from 127.0.0.1 on: 127.0.0.1, ..., 127.0.3.232."""
    return socket.inet_ntoa((0x7F000001 + i).to_bytes(4, "big"))


def make_cert(workdir, name):
    cert = os.path.join(workdir, name + ".crt")
    key = os.path.join(workdir, name + ".key")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=" + name,
         "-addext", "subjectAltName=DNS:" + name],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
    return cert, key


# --------------------------------------------------------------------------
# Proxy configurations. `plain` = list of servers behind one listener;
# `tls` = {sni name: [servers]} behind a preread listener (first name is default).
# A server is a port on 127.0.0.1 or a "host:port" string. `balance` is
# "least_conn" or "hash" (on the client's address).

def server_address(server):
    return server if isinstance(server, str) else f"127.0.0.1:{server}"


def sluice_config(listen_port, plain=None, tls=None, balance="least_conn", settings=(), fault=None,
                  tail=()):
    # A variant's `workers` and `control_cpu` go to [global]; its
    # tcp_keepalive replaces ours.
    workers = [x for x in settings if x.startswith("workers")] or ["workers = 1"]
    workers += [x for x in settings if x.startswith(("control_cpu", "log_phases"))]
    access_log = [x for x in settings if x.startswith("access_log")] or ['access_log = "off"']
    keepalive = [x for x in settings if x.startswith("tcp_keepalive")] or ["tcp_keepalive = false"]
    settings = [x for x in settings if not x.startswith(("workers", "control_cpu", "log_phases", "access_log",
                                                           "tcp_keepalive"))]
    out = [
        "[global]",
        *workers,
        *access_log,
        'log_level = "error"',
        "",
        "[[listener]]",
        'name = "bench"',
        f'listen = "127.0.0.1:{listen_port}"',
        f'connect_timeout = "{CONNECT_TIMEOUT_S}s"',
        f'idle_timeout = "{IDLE_TIMEOUT_S}s"',
        # HAProxy and nginx leave TCP keepalive off unless asked; sluice
        # turns it on by default, which costs four setsockopt calls per
        # server connection. Measured like for like.
        *keepalive,
    ]
    out += settings
    upstreams = {}
    if tls:
        names = list(tls)
        out += ['preread = "tls"', 'preread_timeout = "5s"', "routes = ["]
        for i, name in enumerate(names):
            out.append(f'  {{ sni = "{name}", upstream = "u{i}" }},')
            upstreams[f"u{i}"] = tls[name]
        out += ["]", 'default_upstream = "u0"']
    else:
        out.append('upstream = "u0"')
        upstreams["u0"] = plain
    policy = ['balance = "hash"', 'hash_key = "client_ip"'] if balance == "hash" else \
        ['balance = "least_conn"']
    if fault:
        fault_port, servers = fault
        out += ["", "[[listener]]", 'name = "fault"', f'listen = "127.0.0.1:{fault_port}"',
                f'connect_timeout = "{CONNECT_TIMEOUT_S}s"', f'idle_timeout = "{IDLE_TIMEOUT_S}s"',
                "tcp_keepalive = false", 'upstream = "fault"']
        upstreams["fault"] = servers
    for name, ports in upstreams.items():
        # A server given as (name:port, "resolve") is a DNS entry (the DNS loads).
        servers = ", ".join(f'{{ address = "{p[0]}", resolve = true }}' if isinstance(p, tuple)
                            else f'{{ address = "{server_address(p)}" }}' for p in ports)
        out += ["", f"[upstream.{name}]", *policy, f"servers = [{servers}]"]
    out += tail
    return "\n".join(out) + "\n"


def haproxy_config(listen_port, plain=None, tls=None, balance="least_conn", fault=None, nbthread=1):
    out = [
        "global",
        f"    nbthread {nbthread}",
        "    maxconn 8000",
        "",
        "defaults",
        "    mode tcp",
        f"    timeout connect {CONNECT_TIMEOUT_S}s",
        f"    timeout client {IDLE_TIMEOUT_S}s",
        f"    timeout server {IDLE_TIMEOUT_S}s",
        "",
        "frontend bench",
        f"    bind 127.0.0.1:{listen_port}",
    ]
    backends = {}
    if tls:
        names = list(tls)
        out += ["    tcp-request inspect-delay 5s",
                "    tcp-request content accept if { req.ssl_hello_type 1 }"]
        for i, name in enumerate(names):
            out.append(f"    use_backend u{i} if {{ req.ssl_sni -i {name} }}")
            backends[f"u{i}"] = tls[name]
    else:
        backends["u0"] = plain
    out.append("    default_backend u0")
    if fault:
        fault_port, backends["fault"] = fault
        out += ["", "frontend fault", f"    bind 127.0.0.1:{fault_port}", "    default_backend fault"]
    for name, ports in backends.items():
        out += ["", f"backend {name}",
                "    balance source" if balance == "hash" else "    balance leastconn"]
        out += [f"    server s{i} {server_address(p)}" for i, p in enumerate(ports)]
    return "\n".join(out) + "\n"


def nginx_config(listen_port, workdir, plain=None, tls=None, balance="least_conn",
                 half_close=False, fault=None, keepalive=False, workers=1):
    out = [
        f"load_module {NGINX_STREAM_MODULE};",
        f"worker_processes {workers};",
        "daemon off;",
        # Several workers need the master process (one process otherwise).
        f"master_process {'on' if workers > 1 else 'off'};",
        f"pid {workdir}/nginx.pid;",
        f"error_log {workdir}/nginx-error.log crit;",
        "worker_rlimit_nofile 20000;",
        "events { worker_connections 16384; }",
        "stream {",
    ]
    upstreams = {}
    if tls:
        names = list(tls)
        out.append("  map $ssl_preread_server_name $bench_upstream {")
        for i, name in enumerate(names):
            out.append(f"    {name} u{i};")
            upstreams[f"u{i}"] = tls[name]
        out.append("    default u0;")
        out.append("  }")
    else:
        upstreams["u0"] = plain
    if fault:
        upstreams["fault"] = fault[1]
    for name, ports in upstreams.items():
        out.append(f"  upstream {name} {{")
        out.append("    hash $remote_addr consistent;" if balance == "hash" else "    least_conn;")
        out += [f"    server {server_address(p)};" for p in ports]
        out.append("  }")
    out += [
        "  server {",
        f"    listen 127.0.0.1:{listen_port}{' so_keepalive=60s:10s:6' if keepalive else ''};",
        f"    proxy_connect_timeout {CONNECT_TIMEOUT_S}s;",
        f"    proxy_timeout {IDLE_TIMEOUT_S}s;",
    ]
    if keepalive:
        out.append("    proxy_socket_keepalive on;")
    if half_close:
        out.append("    proxy_half_close on;")
    if tls:
        out += ["    ssl_preread on;", "    preread_timeout 5s;", "    proxy_pass $bench_upstream;"]
    else:
        out.append("    proxy_pass u0;")
    out.append("  }")
    if fault:
        out += ["  server {", f"    listen 127.0.0.1:{fault[0]};",
                f"    proxy_connect_timeout {CONNECT_TIMEOUT_S}s;", f"    proxy_timeout {IDLE_TIMEOUT_S}s;",
                "    proxy_pass fault;", "  }"]
    out.append("}")
    return "\n".join(out) + "\n"


class Proxy:
    """One running proxy instance, fresh for every load."""

    def __init__(self, procs, system, binary, workdir, tag, plain=None, tls=None,
                 balance="least_conn", fault_servers=None, sluice_tail=(), sluice_settings=None):
        self.procs = procs
        self.port = free_port()
        # A second listener in front of `fault_servers`, on the same worker.
        self.fault_port = free_port() if fault_servers else None
        fault = (self.fault_port, fault_servers) if fault_servers else None
        self.log = os.path.join(workdir, f"{system}-{tag}.log")
        conf_dir = os.path.join(workdir, f"{system}-{tag}")
        os.makedirs(conf_dir, exist_ok=True)
        peer = PEER_VARIANTS.get(system, {})
        if system in ("sluice", "sluice-base") or system in VARIANT_SYSTEMS:
            path = os.path.join(conf_dir, "sluice.toml")
            settings = VARIANT_SYSTEMS.get(system, ()) if sluice_settings is None else sluice_settings
            text = sluice_config(self.port, plain, tls, balance, settings, fault, sluice_tail)
            argv = [binary, "-c", path]
        elif system.startswith("haproxy"):
            path = os.path.join(conf_dir, "haproxy.cfg")
            text = haproxy_config(self.port, plain, tls, balance, fault, **peer)
            argv = [binary, "-db", "-f", path]
        else:
            path = os.path.join(conf_dir, "nginx.conf")
            text = nginx_config(self.port, conf_dir, plain, tls, balance,
                                half_close=system == NGINX_HALF_CLOSE, fault=fault, **peer)
            argv = [binary, "-p", conf_dir, "-e", os.path.join(conf_dir, "nginx-error.log"),
                    "-c", path]
        with open(path, "w") as f:
            f.write(text)
        self.proc = procs.start(argv, log_path=self.log)
        if not wait_listening(self.port, self.proc):
            code = self.proc.poll()
            why = tail(self.log) or (f"exit code {code}" if code is not None else "not listening")
            self.stop()
            raise BenchError(f"{system} did not start: {why}")
        # With one worker thread and master_process off, each proxy is one process.
        self.pids = [self.proc.pid]
        if peer.get("workers", 1) > 1:
            self.pids += worker_pids(self.proc.pid, peer["workers"])

    def alive(self):
        return self.proc.poll() is None

    def cpu(self):
        return cpu_seconds(self.pids)

    def rss(self):
        return rss_bytes(self.pids)

    def stop(self):
        self.procs.stop(self.proc)


# --------------------------------------------------------------------------
# Loads. Each returns a dict of figures for one (system, load) run.

# `taskset -c CPUS` when --pin-loadgen is given: the load generator's client
# kept on its own CPUs, apart from the proxy's workers.
LOADGEN_PREFIX = []


def run_loadgen(loadgen, args, timeout):
    res = subprocess.run([*LOADGEN_PREFIX, loadgen, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         timeout=timeout)
    lines = [l for l in res.stdout.decode().splitlines() if l.startswith("{")]
    if not lines:
        raise BenchError(f"loadgen {args[0]} failed (exit {res.returncode}): "
                         + res.stderr.decode().strip()[-300:])
    return json.loads(lines[-1])


SETTLE_S = 0.3  # lets the proxy finish tearing sessions down before reading its CPU
BACKGROUND_S = 0.5  # how long the machine is watched, proxy idle, before a load


def measure(proxy, fn):
    """Runs the load `fn` and adds to its result the proxy's CPU seconds, the
    whole machine's busy CPU seconds while `fn` ran, and how many cores were
    busy just before it (work of others that the machine figure includes)."""
    t0, busy0 = time.monotonic(), machine_busy_seconds()
    time.sleep(BACKGROUND_S)
    background = (machine_busy_seconds() - busy0) / (time.monotonic() - t0)
    cpu0 = proxy.cpu()
    busy1 = machine_busy_seconds()
    result = fn()
    busy2 = machine_busy_seconds()
    time.sleep(SETTLE_S)
    if not proxy.alive():
        raise BenchError("proxy exited during the load: " + tail(proxy.log))
    result["proxy_cpu_s"] = proxy.cpu() - cpu0
    result["machine_cpu_s"] = busy2 - busy1
    result["background_cores"] = background
    return result


def cost_per(r, work, scale):
    """Proxy and machine CPU per unit of work: seconds * scale / work."""
    work = max(work, 1e-9)
    return {"cpu_per_op": r["proxy_cpu_s"] * scale / work,
            "machine_per_op": r["machine_cpu_s"] * scale / work,
            "background": r["background_cores"]}


def client_busy(r):
    return 100.0 * r.get("cpu_s", 0) / r["elapsed"] if r.get("elapsed") else 0.0


def rate_load(ctx, proxy, command, args, seconds, count="ops"):
    """A timed loadgen load that reports a rate and latency (conn, rr, tls);
    CPU per operation is in µs per `count` (connections or requests)."""
    r = measure(proxy, lambda: run_loadgen(ctx.loadgen, [
        command, "--target", f"127.0.0.1:{proxy.port}", "--duration", str(seconds), *args],
        seconds + 60))
    return {"rate": r["rate"], "p50_us": r["p50_us"], "p99_us": r["p99_us"],
            **cost_per(r, max(r[count], 1), 1e6), "errors": r["errors"],
            "client_busy": client_busy(r), "first_error": r.get("first_error", "")}


def load_conn(ctx, proxy):
    p = ctx.profile
    return rate_load(ctx, proxy, "conn", ["--concurrency", str(p["conn_c"]),
                                          "--payload", str(p["payload"])], p["conn_s"])


def strace_summary(path):
    """{syscall: calls} from `strace -c -U calls,name -o path`."""
    calls = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit() and parts[1] != "total":
                calls[parts[1]] = int(parts[0])
    return calls


def load_syscalls(ctx, proxy):
    """System calls per short connection, counted by strace over every thread
    of the proxy while one client makes connections one after another (so the
    count does not depend on how events happen to batch). A count, not a
    time: the same on a quiet or a noisy machine."""
    if not shutil.which("strace"):
        raise BenchError("strace not installed")
    out = os.path.join(ctx.workdir, f"strace-{proxy.port}.txt")
    # Every process of the proxy (nginx's workers too, when it has several).
    tracer = ctx.procs.start(["strace", "-c", "-f", "-q", "-U", "calls,name", "-o", out,
                              *[a for pid in proxy.pids for a in ("-p", str(pid))]])
    time.sleep(1.0)  # attaching to every thread takes a moment
    try:
        r = run_loadgen(ctx.loadgen, ["conn", "--target", f"127.0.0.1:{proxy.port}",
                                      "--duration", str(ctx.profile["sys_s"]),
                                      "--concurrency", "1", "--payload", str(ctx.profile["payload"])],
                        ctx.profile["sys_s"] + 60)
        time.sleep(SETTLE_S)
    finally:
        tracer.send_signal(signal.SIGINT)  # strace writes its summary on detach
        try:
            tracer.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        ctx.procs.stop(tracer)
    calls = strace_summary(out)
    conns = max(r["ops"], 1)
    return {"calls_per_conn": sum(calls.values()) / conns,
            "epoll_ctl_per_conn": calls.get("epoll_ctl", 0) / conns,
            "conns": r["ops"], "errors": r["errors"], "first_error": r.get("first_error", "")}


def load_rr(ctx, proxy):
    p = ctx.profile
    return rate_load(ctx, proxy, "rr", ["--concurrency", str(p["rr_c"]),
                                        "--size", str(p["rr_size"])], p["rr_s"], count="requests")


def load_bulk(ctx, proxy):
    p = ctx.profile
    r = measure(proxy, lambda: run_loadgen(ctx.loadgen, [
        "bulk", "--target", f"127.0.0.1:{proxy.port}", "--mode", "source",
        "--bytes", str(p["bulk_bytes"]), "--concurrency", str(p["bulk_c"]),
        "--timeout", "240"], 300))
    return {"rate": r["bytes_per_s"] / 1e9, **cost_per(r, max(r["bytes"], 1) / 1e9, 1),
            "errors": r["errors"], "client_busy": client_busy(r),
            "first_error": r.get("first_error", "")}


FAULT_SESSIONS = 16


def push_until_stopped(port, stop, blocked):
    """A client of the fault listener: pushes into a server that never reads
    until its send blocks (the fault is in place), then waits for `stop`."""
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        blocked.release()
        return
    c.settimeout(0.2)
    block = b"n" * 65536
    try:
        while True:
            c.send(block)
    except (socket.timeout, OSError):
        pass
    blocked.release()
    stop.wait()
    c.close()


def load_bulk_fault(ctx, start):
    """The bulk load through one listener, alone and then while FAULT_SESSIONS
    clients of another listener of the same proxy (one worker) push into a
    server that never reads. The tests only check that such a neighbour keeps
    moving (tests/integration/test_fault_neighbours.py); its share of the
    throughput is measured here."""
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(FAULT_SESSIONS * 2)  # never accepted: the kernel queues a little, then nothing moves
    stop = threading.Event()
    blocked = threading.Semaphore(0)
    threads = []
    try:
        proxy = start("main", plain=ctx.backends.source, fault_servers=[sink.getsockname()[1]])
        alone = load_bulk(ctx, proxy)
        for _ in range(FAULT_SESSIONS):
            t = threading.Thread(target=push_until_stopped, args=(proxy.fault_port, stop, blocked), daemon=True)
            t.start()
            threads.append(t)
        for _ in range(FAULT_SESSIONS):
            if not blocked.acquire(timeout=30):
                raise BenchError("bulk_fault: the pushing clients never blocked")
        during = load_bulk(ctx, proxy)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        sink.close()
    return {**during, "rate_alone": alone["rate"], "share": during["rate"] / max(alone["rate"], 1e-9),
            "errors": alone["errors"] + during["errors"],
            "first_error": alone["first_error"] or during["first_error"]}


def load_idle(ctx, proxy):
    count = ctx.profile["idle_count"]
    rss0 = proxy.rss()
    cpu0 = proxy.cpu()
    proc = ctx.procs.start([ctx.loadgen, "idle", "--target", f"127.0.0.1:{proxy.port}",
                            "--count", str(count), "--timeout", "60", "--hold", "120"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        lines = read_lines(proc, 1, 70.0)
        if lines != [f"ready {count}"]:
            raise BenchError("idle: connections did not all open: "
                             + (lines[0] if lines else "timed out"))
        time.sleep(SETTLE_S)
        rss1 = proxy.rss()
        cpu1 = proxy.cpu()
        proc.stdin.close()  # loadgen closes its connections and reports
        proc.stdin = None
        out = read_lines(proc, 1, 30.0, stop=lambda l: l.startswith("{"))
        proc.wait(timeout=30)
    finally:
        ctx.procs.stop(proc)
    if not out or not out[-1].startswith("{"):
        raise BenchError("idle: loadgen did not report after release")
    summary = json.loads(out[-1])
    if not proxy.alive():
        raise BenchError("proxy exited during the idle load: " + tail(proxy.log))
    return {"bytes_per_conn": (rss1 - rss0) / count, "rss_before": rss0, "rss_after": rss1,
            "cpu_per_op": (cpu1 - cpu0) * 1e6 / count,
            "errors": summary["errors"] + summary["dropped"],
            "first_error": summary.get("first_error", "")}


def load_tls(ctx, proxy):
    p = ctx.profile
    return rate_load(ctx, proxy, "tls", ["--sni", ",".join(TLS_NAMES), "--verify-name",
                                         "--concurrency", str(p["tls_c"])], p["tls_s"])


# --------------------------------------------------------------------------
# PostgreSQL for the pgbench loads. The end-to-end tests already start and
# stop real PostgreSQL servers (tests/e2e/dbpeers.py: initdb and the server
# run as the postgres OS user, the server is stopped by its postmaster's
# PID); the benchmark uses the same code rather than a copy of it.

def import_dbpeers():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for sub in ("tests/integration", "tests/e2e"):
        path = os.path.join(repo, sub)
        if path not in sys.path:
            sys.path.append(path)
    try:
        import dbpeers
    except ImportError as exc:
        return None, f"cannot load tests/e2e/dbpeers.py ({exc})"
    return dbpeers, dbpeers.pg_missing()


class Postgres:
    """A throwaway cluster in the benchmark's directory: initdb, one server on
    a free 127.0.0.1 port with its unix socket beside the data, `pgbench -i`."""

    def __init__(self, dbpeers, workdir, scale):
        self.dbpeers = dbpeers
        self.server = None
        # The server runs as the postgres user: it must be able to pass
        # through the (otherwise private) benchmark directory to its own.
        os.chmod(workdir, 0o711)
        root = os.path.join(workdir, "pg")
        os.mkdir(root, 0o755)
        shutil.chown(root, dbpeers.PG_USER, dbpeers.PG_USER)
        try:
            self.server = dbpeers.PgServer(dbpeers.PgCluster(Path(root), "bench"))
            self.port = self.server.port
            init = self.pgbench(self.port, ["-i", "-q", "-s", str(scale)], 300)
            if init.returncode != 0:
                raise BenchError("pgbench -i failed: " + init.stderr.strip()[-300:])
        except AssertionError as exc:  # what dbpeers raises when a step fails
            self.stop()
            raise BenchError(f"PostgreSQL did not start: {exc}") from None
        except BaseException:
            self.stop()
            raise

    def pgbench(self, port, args, timeout):
        return self.dbpeers.pgbench(port, *args, timeout=timeout)

    def stop(self):
        if self.server is not None:
            self.server.stop()
            self.server = None


def pgbench_figure(pattern, text):
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def timed_client(call):
    """Runs a client command (call() -> CompletedProcess); its result with the
    wall time and the CPU time the command used (children's rusage)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    res = call()
    elapsed = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"res": res, "elapsed": elapsed, "cpu_s": cpu}


def load_pgbench(ctx, proxy, new_connections):
    """pgbench -S (one primary-key SELECT per transaction) through the proxy,
    on persistent connections or with -C (a new connection per transaction)."""
    p = ctx.profile
    args = ["-n", "-S", "-c", str(p["pg_c"]), "-j", "2", "-T", str(p["pg_s"])]
    if new_connections:
        args.append("-C")

    r = measure(proxy, lambda: timed_client(lambda: ctx.pg.pgbench(proxy.port, args, p["pg_s"] + 60)))
    out, err = r["res"].stdout, r["res"].stderr
    xacts = pgbench_figure(r"number of transactions actually processed: (\d+)", out)
    tps = pgbench_figure(r"tps = ([0-9.]+)", out)
    if r["res"].returncode != 0 or not xacts or tps is None:
        raise BenchError(f"pgbench exited {r['res'].returncode}: "
                         + (err.strip() or out.strip())[-300:])
    failed = pgbench_figure(r"number of failed transactions: (\d+)", out) or 0
    return {"rate": tps, "lat_ms": pgbench_figure(r"latency average = ([0-9.]+) ms", out),
            **cost_per(r, xacts, 1e6), "errors": int(failed), "client_busy": client_busy(r),
            "xacts": xacts, "first_error": last_line(err) if failed else ""}


def last_line(text):
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


# --------------------------------------------------------------------------
# MariaDB for the sysbench load: the end-to-end tests' helpers start it
# (tests/e2e/mariadb_peers.py: mariadb-install-db, then mariadbd on a free
# 127.0.0.1 port, stopped by its PID); sysbench prepares its tables once.

SYSBENCH_LOADS = ("sysbench",)


def import_mariadb_peers():
    """(module, None) or (None|module, why the sysbench load cannot run)."""
    dbpeers, _ = import_dbpeers()  # also puts the tests' folders on sys.path
    if dbpeers is None:
        return None, "cannot load tests/e2e/dbpeers.py"
    try:
        import mariadb_peers
    except ImportError as exc:
        return None, f"cannot load tests/e2e/mariadb_peers.py ({exc})"
    if not shutil.which("sysbench"):
        return mariadb_peers, "sysbench not found (Debian package sysbench)"
    return mariadb_peers, mariadb_peers.missing()


class MariaDbServer:
    """A throwaway MariaDB in the benchmark's directory with sysbench's
    oltp tables (small enough to stay in the buffer pool: the proxy is
    measured, not the disk)."""

    def __init__(self, peers, workdir, tables, rows):
        self.server = None
        self.common = [f"--tables={tables}", f"--table-size={rows}"]
        root = Path(workdir) / "mariadb"
        root.mkdir()
        try:
            self.server = peers.MariaDb(peers.install_template(root), root / "server", server_id=1)
            self.port = self.server.port
            self.server.sql("CREATE DATABASE sbtest")
            prep = self.sysbench(self.port, ["prepare"], 300)
            if prep.returncode != 0:
                raise BenchError("sysbench prepare failed: " + (prep.stderr or prep.stdout).strip()[-300:])
        except AssertionError as exc:  # what mariadb_peers raises when a step fails
            self.stop()
            raise BenchError(f"MariaDB did not start: {exc}") from None
        except BaseException:
            self.stop()
            raise

    def sysbench(self, port, args, timeout):
        return subprocess.run(
            ["sysbench", "oltp_read_only", "--db-driver=mysql", "--mysql-host=127.0.0.1",
             f"--mysql-port={port}", "--mysql-user=root", "--mysql-db=sbtest", *self.common, *args],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)

    def stop(self):
        if self.server is not None:
            self.server.stop()
            self.server = None


def load_sysbench(ctx, proxy):
    """sysbench oltp_read_only through the proxy: a transaction is BEGIN, 14
    SELECTs (10 by primary key, 4 over ranges) and COMMIT, on persistent
    connections."""
    p = ctx.profile
    args = [f"--threads={p['sb_c']}", f"--time={p['sb_s']}", "run"]
    r = measure(proxy, lambda: timed_client(lambda: ctx.mariadb.sysbench(proxy.port, args, p["sb_s"] + 60)))
    out, err = r["res"].stdout, r["res"].stderr
    xacts = pgbench_figure(r"transactions:\s+(\d+)", out)
    tps = pgbench_figure(r"transactions:\s+\d+\s+\(([0-9.]+) per sec", out)
    if r["res"].returncode != 0 or not xacts or tps is None:
        raise BenchError(f"sysbench exited {r['res'].returncode}: " + (err.strip() or out.strip())[-300:])
    failed = pgbench_figure(r"ignored errors:\s+(\d+)", out) or 0
    return {"rate": tps, "lat_ms": pgbench_figure(r"avg:\s+([0-9.]+)", out),
            **cost_per(r, xacts, 1e6), "errors": int(failed), "client_busy": client_busy(r),
            "xacts": xacts, "first_error": last_line(err) if failed else ""}


# --------------------------------------------------------------------------
# Many servers: the conn load against an upstream of MANY_SERVERS servers and
# against the same upstream cut to its first server, one proxy after the other.

def load_many(ctx, start, balance):
    p = ctx.profile
    args = ["--concurrency", str(p["conn_c"]), "--payload", str(p["payload"])]
    variants = [(1, ctx.backends.many[:1]), (MANY_SERVERS, ctx.backends.many)]
    if ctx.rep % 2:
        variants.reverse()  # neither size always runs first
    runs = {}
    for size, servers in variants:
        proxy = start(f"{size}", plain=servers, balance=balance)
        try:
            runs[size] = rate_load(ctx, proxy, "conn", args, p["many_s"])
        finally:
            proxy.stop()
    one, many = runs[1], runs[MANY_SERVERS]
    return {**many, "rate_1": one["rate"], "cpu_1": one["cpu_per_op"],
            "scale_rate": many["rate"] / max(one["rate"], 1e-9),
            "scale_cpu": many["cpu_per_op"] / max(one["cpu_per_op"], 1e-9),
            "errors": one["errors"] + many["errors"],
            "first_error": many["first_error"] or one["first_error"]}


# --------------------------------------------------------------------------
# Many servers from DNS: the conn_1000 load with the same MANY_SERVERS
# addresses written in the file (static) and given by dnsmasq under one name
# that sluice asks for again every second (dns), one proxy after the other.

def dnsmasq_binary():
    return shutil.which("dnsmasq") or next(
        (p for p in ("/usr/sbin/dnsmasq", "/sbin/dnsmasq") if os.access(p, os.X_OK)), None)


def free_udp_tcp_port():
    """A 127.0.0.1 port free for both UDP and TCP (a DNS server answers on both)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.bind(("127.0.0.1", 0))
            port = u.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
                try:
                    t.bind(("127.0.0.1", port))
                except OSError:
                    continue
        return port
    raise BenchError("no port free for both UDP and TCP")


class Dnsmasq:
    """dnsmasq on a free 127.0.0.1 port answering DNS_NAME with every address
    of ctx.backends.many, from a hosts file and nothing else. 1000 A records
    do not fit a UDP answer: sluice's resolver asks again over TCP, which
    dnsmasq serves."""

    def __init__(self, procs, binary, workdir, addresses):
        self.procs = procs
        self.port = free_udp_tcp_port()
        hosts = os.path.join(workdir, "dns-hosts")
        with open(hosts, "w") as f:
            f.writelines(f"{a.rsplit(':', 1)[0]} {DNS_NAME}\n" for a in addresses)
        self.log = os.path.join(workdir, "dnsmasq.log")
        argv = [binary, "--no-daemon", f"--port={self.port}", "--listen-address=127.0.0.1",
                "--bind-interfaces", "--no-resolv", "--no-hosts", f"--addn-hosts={hosts}",
                "--local=/bench.test/", "--local-ttl=1", "--pid-file=", "--conf-file=/dev/null"]
        if os.geteuid() == 0:
            argv += ["--user=root", "--group=root"]  # it would drop to nobody, away from the file
        self.proc = procs.start(argv, log_path=self.log)
        if not wait_listening(self.port, self.proc):
            raise BenchError("dnsmasq did not start: " + (tail(self.log) or "not listening"))

    @property
    def nameserver(self):
        return f"127.0.0.1:{self.port}"


def admin_metric(port, name):
    """The sum of a metric's samples from sluice's /metrics (None if absent)."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    vals = [float(l.split()[-1]) for l in text.splitlines()
            if l.startswith(name + " ") or l.startswith(name + "{")]
    return sum(vals) if vals else None


def is_sluice(system):
    return system in ("sluice", "sluice-base") or system in VARIANT_SYSTEMS


def load_many_dns(ctx, start, balance):
    p = ctx.profile
    args = ["--concurrency", str(p["conn_c"]), "--payload", str(p["payload"])]
    variants = ["static", "dns"]
    if ctx.rep % 2:
        variants.reverse()  # neither always runs first
    runs = {}
    for variant in variants:
        if variant == "static":
            proxy = start(variant, plain=ctx.backends.many, balance=balance)
        else:
            admin = free_port()
            port = ctx.backends.many[0].rsplit(":", 1)[1]
            proxy = start(variant, plain=[(f"{DNS_NAME}:{port}", "resolve")], balance=balance,
                          sluice_tail=["", "[resolver]", f'nameservers = ["{ctx.dns.nameserver}"]',
                                       'valid = "1s"', 'timeout = "1s"', "",
                                       "[admin]", f'listen = "127.0.0.1:{admin}"'])
        try:
            if variant == "dns":
                # sluice waits for the first answer before it listens; check that it
                # holds every address (its admin listener may open a moment later).
                deadline = time.monotonic() + 10
                while True:
                    try:
                        if admin_metric(admin, "sluice_dns_entry_servers") == MANY_SERVERS:
                            break
                    except OSError:
                        pass
                    if time.monotonic() > deadline:
                        raise BenchError(f"sluice did not get {MANY_SERVERS} servers from DNS: "
                                         + tail(proxy.log))
                    time.sleep(0.2)
                q0, t0 = admin_metric(admin, "sluice_dns_queries_total"), time.monotonic()
            runs[variant] = rate_load(ctx, proxy, "conn", args, p["many_s"])
            if variant == "dns":
                q1, t1 = admin_metric(admin, "sluice_dns_queries_total"), time.monotonic()
                runs[variant]["queries_per_s"] = (q1 - q0) / (t1 - t0)
                if admin_metric(admin, "sluice_dns_entry_servers") != MANY_SERVERS:
                    raise BenchError("sluice lost servers from DNS during the load: " + tail(proxy.log))
        finally:
            proxy.stop()
    static, dns = runs["static"], runs["dns"]
    return {**dns, "rate_static": static["rate"], "cpu_static": static["cpu_per_op"],
            "dns_static": dns["cpu_per_op"] / max(static["cpu_per_op"], 1e-9),
            "errors": static["errors"] + dns["errors"],
            "first_error": dns["first_error"] or static["first_error"]}


# Loads that run on one proxy: (ctx, proxy) -> figures. The *_sc loads differ
# from their twins only in the backend (it closes first).
LOAD_FUNCS = {"conn": load_conn, "conn_sc": load_conn, "rr": load_rr, "bulk": load_bulk,
              "idle": load_idle, "tls": load_tls, "sys": load_syscalls, "sys_sc": load_syscalls,
              "pgbench": lambda ctx, proxy: load_pgbench(ctx, proxy, False),
              "pgbench_c": lambda ctx, proxy: load_pgbench(ctx, proxy, True),
              "sysbench": load_sysbench}
# Loads that start their own proxies: (ctx, start) -> figures, where
# start(name, **shape) returns a running Proxy (stopped by run_load at the latest).
MULTI_PROXY_FUNCS = {"bulk_fault": load_bulk_fault,
                     "conn_1000": lambda ctx, start: load_many(ctx, start, "least_conn"),
                     "conn_1000_hash": lambda ctx, start: load_many(ctx, start, "hash"),
                     "conn_1000_dns": lambda ctx, start: load_many_dns(ctx, start, "least_conn"),
                     "conn_1000_dns_hash": lambda ctx, start: load_many_dns(ctx, start, "hash")}


def proxy_shape(load, ctx):
    """What the proxy fronts for a single-proxy load (keyword args of Proxy)."""
    if load == "bulk":
        return {"plain": ctx.backends.source}
    if load == "tls":
        return {"tls": ctx.backends.tls}
    if load in PG_LOADS:
        return {"plain": [ctx.pg.port]}
    if load in SYSBENCH_LOADS:
        return {"plain": [ctx.mariadb.port]}
    if load.endswith("_sc"):
        return {"plain": ctx.backends.echo_close}
    return {"plain": ctx.backends.echo}


def run_load(ctx, system, binary, load, tag):
    """One run of `load` on `system`; every proxy it started is stopped."""
    started = []

    def start(suffix, **shape):
        proxy = Proxy(ctx.procs, system, binary, ctx.workdir, f"{tag}-{suffix}", **shape)
        started.append(proxy)
        return proxy

    if not os.access(binary, os.X_OK):
        raise BenchError(f"binary not found: {binary}")
    try:
        if load in MULTI_PROXY_FUNCS:
            return MULTI_PROXY_FUNCS[load](ctx, start)
        return LOAD_FUNCS[load](ctx, start("main", **proxy_shape(load, ctx)))
    finally:
        for proxy in started:
            proxy.stop()


# --------------------------------------------------------------------------
# Reporting

def describe(load, p):
    return {
        "conn": f"short connections: connect, {p['payload']} B echo, close; "
                f"{p['conn_c']} concurrent, {p['conn_s']} s",
        "conn_sc": f"short connections, the server closes first: connect, {p['payload']} B echo, "
                   f"the server closes, then the client; {p['conn_c']} concurrent, {p['conn_s']} s",
        "sys": f"system calls per short connection (strace -c -f over every proxy thread), "
               f"client closes first; one client, {p['sys_s']} s",
        "sys_sc": f"system calls per short connection (strace -c -f over every proxy thread), "
                  f"server closes first; one client, {p['sys_s']} s",
        "rr": f"keep-alive request/response: {p['rr_size']} B each way on "
              f"{p['rr_c']} persistent connections, {p['rr_s']} s",
        "bulk": f"bulk download: {p['bulk_bytes'] / (1 << 30):g} GiB from a streaming backend "
                f"over {p['bulk_c']} connections",
        "bulk_fault": f"the bulk load alone, then while {FAULT_SESSIONS} clients of another listener "
                      f"of the same worker push into a server that never reads; the share is "
                      f"throughput during / alone",
        "idle": f"idle memory: {p['idle_count']} proxied connections held open",
        "tls": f"TLS preread: full handshakes routed by SNI ({len(TLS_NAMES)} names, "
               f"certificate checked), one echo, close; {p['tls_c']} concurrent, {p['tls_s']} s",
        "pgbench": f"pgbench -S (select-only) through the proxy to a local PostgreSQL (scale "
                   f"{p['pg_scale']}) on {p['pg_c']} persistent connections (-j 2), {p['pg_s']} s",
        "pgbench_c": f"pgbench -S -C: as pgbench, but a new connection for every transaction; "
                     f"{p['pg_c']} clients (-j 2), {p['pg_s']} s",
        "sysbench": f"sysbench oltp_read_only (BEGIN, 14 SELECTs, COMMIT per transaction) through the "
                    f"proxy to a local MariaDB ({p['sb_tables']} table(s) of {p['sb_rows']} rows) on "
                    f"{p['sb_c']} persistent connections, {p['sb_s']} s",
        "conn_1000": f"the conn load ({p['conn_c']} concurrent, {p['many_s']} s) with least_conn "
                     f"over {MANY_SERVERS} servers, against the same with 1 server",
        "conn_1000_hash": f"the conn load ({p['conn_c']} concurrent, {p['many_s']} s) with a hash "
                          f"of the client address over {MANY_SERVERS} servers, against the same "
                          f"with 1 server",
        "conn_1000_dns": f"the conn load ({p['conn_c']} concurrent, {p['many_s']} s) with least_conn "
                         f"over the {MANY_SERVERS} servers of conn_1000 given by DNS (one name, "
                         f"{MANY_SERVERS} A records, asked again every second), against the same "
                         f"{MANY_SERVERS} written in the file; sluice only",
        "conn_1000_dns_hash": "as conn_1000_dns with a hash of the client address; sluice only",
    }[load]


# Printed under a load's table.
NOTES = {
    "conn_1000": "All servers are one echo process reached at 127.0.0.1 … 127.0.3.232, so the "
                 "backend's work is the same for 1 and for 1000 servers; only the proxy's "
                 "choice differs.",
    "conn_1000_hash": "Every connection comes from 127.0.0.1, so the hash sends all of them to "
                      "the same server: this measures what one pick over 1000 servers costs, not "
                      "how evenly the hash spreads clients.",
}
NOTES["conn_1000_dns"] = (
    f"dnsmasq answers {DNS_NAME} with the {MANY_SERVERS} addresses of conn_1000 (over TCP: they do "
    "not fit a UDP answer) and sluice asks again every second (valid = \"1s\"); every answer is "
    "the same, so none rebuilds the upstream. \"static\" is the same upstream written in the file, "
    "run beside it. HAProxy and nginx are not run (sluice only).")
NOTES["conn_1000_dns_hash"] = NOTES["conn_1000_dns"]
MANY_TARGET = 0.95  # what sluice aims for: conn/s with 1000 servers / with 1 server


# (key, header, format) per load; the first key is the rate. "machine" is the
# busy time of the whole machine over the same work (see MACHINE_NOTE).
def machine_columns(unit, fmt="{:.1f}"):
    return [("machine_per_op", f"machine CPU {unit}", fmt),
            ("background", "busy before, cores", "{:.2f}")]


COLUMNS = {
    "conn": [("rate", "conn/s", "{:.0f}"), ("p50_us", "p50 µs", "{:.0f}"),
             ("p99_us", "p99 µs", "{:.0f}"), ("cpu_per_op", "CPU µs/conn", "{:.1f}"),
             *machine_columns("µs/conn")],
    "rr": [("rate", "req/s", "{:.0f}"), ("p50_us", "p50 µs", "{:.0f}"),
           ("p99_us", "p99 µs", "{:.0f}"), ("cpu_per_op", "CPU µs/req", "{:.2f}"),
           *machine_columns("µs/req", "{:.2f}")],
    "bulk": [("rate", "GB/s", "{:.2f}"), ("cpu_per_op", "CPU s/GB", "{:.3f}"),
             *machine_columns("s/GB", "{:.3f}")],
    "bulk_fault": [("rate", "GB/s during", "{:.2f}"), ("rate_alone", "GB/s alone", "{:.2f}"),
                   ("share", "share", "{:.2f}"), ("cpu_per_op", "CPU s/GB during", "{:.3f}"),
                   *machine_columns("s/GB", "{:.3f}")],
    "idle": [("bytes_per_conn", "bytes/conn", "{:.0f}"), ("rss_before", "RSS before KiB", "{:.0f}"),
             ("rss_after", "RSS after KiB", "{:.0f}"), ("cpu_per_op", "CPU µs/conn", "{:.1f}")],
    "tls": [("rate", "conn/s", "{:.0f}"), ("p50_us", "p50 µs", "{:.0f}"),
            ("p99_us", "p99 µs", "{:.0f}"), ("cpu_per_op", "CPU µs/conn", "{:.1f}"),
            *machine_columns("µs/conn")],
    "sys": [("calls_per_conn", "syscalls/conn", "{:.2f}"), ("epoll_ctl_per_conn", "epoll_ctl/conn", "{:.2f}"),
            ("conns", "connections", "{:.0f}")],
    "pgbench": [("rate", "tps", "{:.0f}"), ("lat_ms", "latency avg ms", "{:.3f}"),
                ("cpu_per_op", "CPU µs/xact", "{:.1f}"), *machine_columns("µs/xact")],
    "conn_1000": [("rate", "conn/s", "{:.0f}"), ("cpu_per_op", "CPU µs/conn", "{:.1f}"),
                  ("rate_1", "1 server: conn/s", "{:.0f}"), ("cpu_1", "1 server: CPU µs/conn", "{:.1f}"),
                  ("scale_rate", "conn/s 1000/1", "{:.2f}"), ("scale_cpu", "CPU/conn 1000/1", "{:.2f}"),
                  *machine_columns("µs/conn")],
}
COLUMNS["conn_1000_dns"] = [
    ("rate", "conn/s", "{:.0f}"), ("cpu_per_op", "CPU µs/conn", "{:.1f}"),
    ("rate_static", "static: conn/s", "{:.0f}"), ("cpu_static", "static: CPU µs/conn", "{:.1f}"),
    ("dns_static", "CPU/conn dns/static", "{:.2f}"), ("queries_per_s", "DNS queries/s", "{:.1f}"),
    *machine_columns("µs/conn")]
COLUMNS["conn_1000_dns_hash"] = COLUMNS["conn_1000_dns"]
COLUMNS["conn_sc"] = COLUMNS["conn"]
COLUMNS["sys_sc"] = COLUMNS["sys"]
COLUMNS["pgbench_c"] = COLUMNS["pgbench"]
COLUMNS["sysbench"] = COLUMNS["pgbench"]
COLUMNS["conn_1000_hash"] = COLUMNS["conn_1000"]


# Ratios printed under each table: (key, label). A rate ratio above 1 means sluice
# is faster; a cost ratio below 1 means sluice spends less.
RATIOS = {
    "conn": [("rate", "rate"), ("cpu_per_op", "CPU/conn"), ("machine_per_op", "machine CPU/conn")],
    "rr": [("rate", "rate"), ("p99_us", "p99"), ("cpu_per_op", "CPU/req"),
           ("machine_per_op", "machine CPU/req")],
    "bulk": [("rate", "throughput"), ("cpu_per_op", "CPU/GB"), ("machine_per_op", "machine CPU/GB")],
    "bulk_fault": [("rate", "throughput during the fault"), ("share", "share kept")],
    "idle": [("bytes_per_conn", "memory/conn"), ("cpu_per_op", "CPU/conn to open")],
    "tls": [("rate", "rate"), ("cpu_per_op", "CPU/conn"), ("machine_per_op", "machine CPU/conn")],
    "sys": [("calls_per_conn", "syscalls/conn"), ("epoll_ctl_per_conn", "epoll_ctl/conn")],
    "pgbench": [("rate", "tps"), ("cpu_per_op", "CPU/xact"), ("machine_per_op", "machine CPU/xact")],
    "conn_1000": [("rate", "rate"), ("cpu_per_op", "CPU/conn"), ("machine_per_op", "machine CPU/conn")],
}
RATIOS["conn_1000_dns"] = RATIOS["conn_1000"]
RATIOS["conn_1000_dns_hash"] = RATIOS["conn_1000"]
RATIOS["conn_sc"] = RATIOS["conn"]
RATIOS["sys_sc"] = RATIOS["sys"]
RATIOS["pgbench_c"] = RATIOS["pgbench"]
RATIOS["sysbench"] = RATIOS["pgbench"]
RATIOS["conn_1000_hash"] = RATIOS["conn_1000"]

MACHINE_NOTE = (
    "\"machine CPU\" is the busy time of the whole machine while the load ran (/proc/stat: "
    "user + nice + system + irq + softirq + steal, all cores), divided by the work done. It "
    "includes the client, the backends, the kernel's share and any other work on the host; "
    f"\"busy before\" is how many cores were busy in the {BACKGROUND_S} s just before the load, "
    "with the proxy idle, i.e. what others were using. On a machine with other work the figure is an "
    "upper bound; on a saturated one it mostly says how long the load took.")


def median_of(runs, key):
    vals = [r[key] for r in runs if key in r]
    return statistics.median(vals) if vals else None


def summarize(results, systems, load):
    """results[system][load] is a list of run dicts or an error string."""
    out = {}
    for system in systems:
        runs = results[system].get(load)
        if isinstance(runs, str) or not runs:
            out[system] = runs or "not run"
            continue
        summary = {key: median_of(runs, key) for key, _, _ in COLUMNS[load]}
        costs = [r["cpu_per_op"] for r in runs if "cpu_per_op" in r]
        summary["cpu_range"] = (min(costs), max(costs)) if costs else None
        summary["errors"] = sum(r.get("errors", 0) for r in runs)
        summary["client_busy"] = median_of(runs, "client_busy")
        summary["runs"] = len(runs)
        firsts = [r["first_error"] for r in runs if r.get("first_error")]
        summary["first_error"] = firsts[0] if firsts else ""
        out[system] = summary
    return out


def fmt_ratio(a, b):
    if a is None or b is None or b == 0:
        return "–"
    return f"{a / b:.2f}"


def print_table(load, summary, systems, profile):
    cols = COLUMNS[load]
    print(f"\n### {load}: {describe(load, profile)}\n")
    header = ["system"] + [h for _, h, _ in cols] + ["errors", "client CPU %"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for system in systems:
        s = summary[system]
        if isinstance(s, str):
            print(f"| {system} | {s if s == SLUICE_ONLY else 'failed: ' + s[:120]} |")
            continue
        cells = [system]
        for key, _, fmt in cols:
            val = s[key]
            if key.startswith("rss"):
                val = val / 1024 if val is not None else None
            cell = fmt.format(val) if val is not None else "–"
            if key == "cpu_per_op" and s["runs"] > 1 and s["cpu_range"]:
                lo, hi = s["cpu_range"]
                cell += f" ({fmt.format(lo)}–{fmt.format(hi)})"
            cells.append(cell)
        cells.append(str(s["errors"]))
        cells.append(f"{s['client_busy']:.0f}" if s.get("client_busy") is not None else "–")
        print("| " + " | ".join(cells) + " |")
    ratio_rows = []
    for mine in [m for m in systems if m in ("sluice", "sluice-base") or m in VARIANT_SYSTEMS]:
        if isinstance(summary[mine], str):
            continue
        others = list(PEERS)
        if mine == "sluice":
            others.insert(0, "sluice-base")
        elif mine.startswith("sluice-") and not mine.startswith("sluice-base"):
            others.insert(0, mine.replace("sluice-", "sluice-base-", 1))
        for other in others:
            if other in systems and not isinstance(summary[other], str):
                ratio_rows.append((mine, other))
    if ratio_rows:
        print()
        for mine, other in ratio_rows:
            a, b = summary[mine], summary[other]
            parts = [f"{name} {fmt_ratio(a[key], b[key])}×" for key, name in RATIOS[load]]
            print(f"{mine}/{other}: " + ", ".join(parts))
    if load in MANY_LOADS:
        print()
        for system in systems:
            s = summary[system]
            if not isinstance(s, str):
                target = f" (target for sluice: ≥ {MANY_TARGET})" if system == "sluice" else ""
                print(f"{system}: {MANY_SERVERS} servers / 1 server: conn/s "
                      f"{s['scale_rate']:.2f}×{target}, CPU/conn {s['scale_cpu']:.2f}×")
    if load in DNS_LOADS:
        print()
        for system in systems:
            s = summary[system]
            if not isinstance(s, str):
                print(f"{system}: CPU/conn with {MANY_SERVERS} servers from DNS / written: "
                      f"{s['dns_static']:.2f}× ({s['cpu_per_op']:.1f} / {s['cpu_static']:.1f} µs)")
    if load in NOTES:
        print("\n" + NOTES[load])
    for system in systems:
        s = summary[system]
        if not isinstance(s, str) and s["first_error"]:
            print(f"\n{system}: first error: {s['first_error']}")


# One line per headline figure in the closing summary: (load, key, label, format).
HEADLINES = [
    ("conn", "rate", "short connections, conn/s", "{:.0f}"),
    ("conn", "cpu_per_op", "short connections, CPU µs/conn", "{:.1f}"),
    ("conn_sc", "rate", "short, server closes first, conn/s", "{:.0f}"),
    ("conn_sc", "cpu_per_op", "short, server closes first, CPU µs/conn", "{:.1f}"),
    ("sys", "calls_per_conn", "syscalls/conn, client closes first", "{:.2f}"),
    ("sys_sc", "calls_per_conn", "syscalls/conn, server closes first", "{:.2f}"),
    ("rr", "rate", "keep-alive, req/s", "{:.0f}"),
    ("rr", "p99_us", "keep-alive, p99 µs", "{:.0f}"),
    ("rr", "cpu_per_op", "keep-alive, CPU µs/req", "{:.2f}"),
    ("bulk", "rate", "bulk, GB/s", "{:.2f}"),
    ("bulk", "cpu_per_op", "bulk, CPU s/GB", "{:.3f}"),
    ("bulk", "machine_per_op", "bulk, machine CPU s/GB", "{:.3f}"),
    ("bulk_fault", "share", "bulk beside 16 never-read sessions, share kept", "{:.2f}"),
    ("idle", "bytes_per_conn", "idle, bytes/conn", "{:.0f}"),
    ("tls", "rate", "TLS preread, conn/s", "{:.0f}"),
    ("tls", "cpu_per_op", "TLS preread, CPU µs/conn", "{:.1f}"),
    ("pgbench", "rate", "pgbench -S, tps", "{:.0f}"),
    ("pgbench", "cpu_per_op", "pgbench -S, CPU µs/xact", "{:.1f}"),
    ("pgbench_c", "rate", "pgbench -S -C, tps", "{:.0f}"),
    ("pgbench_c", "cpu_per_op", "pgbench -S -C, CPU µs/xact", "{:.1f}"),
    ("sysbench", "rate", "sysbench oltp_read_only, tps", "{:.0f}"),
    ("sysbench", "cpu_per_op", "sysbench oltp_read_only, CPU µs/xact", "{:.1f}"),
    ("conn_1000", "cpu_per_op", "1000 servers least_conn, CPU µs/conn", "{:.1f}"),
    ("conn_1000", "scale_rate", "1000 servers least_conn, conn/s 1000/1", "{:.2f}"),
    ("conn_1000", "scale_cpu", "1000 servers least_conn, CPU/conn 1000/1", "{:.2f}"),
    ("conn_1000_hash", "cpu_per_op", "1000 servers hash, CPU µs/conn", "{:.1f}"),
    ("conn_1000_hash", "scale_rate", "1000 servers hash, conn/s 1000/1", "{:.2f}"),
    ("conn_1000_hash", "scale_cpu", "1000 servers hash, CPU/conn 1000/1", "{:.2f}"),
    ("conn_1000_dns", "cpu_per_op", "1000 servers from DNS, CPU µs/conn", "{:.1f}"),
    ("conn_1000_dns", "cpu_static", "1000 servers written, CPU µs/conn", "{:.1f}"),
    ("conn_1000_dns", "dns_static", "1000 servers, CPU/conn DNS/written", "{:.2f}"),
    ("conn_1000_dns_hash", "cpu_per_op", "1000 servers from DNS hash, CPU µs/conn", "{:.1f}"),
    ("conn_1000_dns_hash", "cpu_static", "1000 servers written hash, CPU µs/conn", "{:.1f}"),
    ("conn_1000_dns_hash", "dns_static", "1000 servers hash, CPU/conn DNS/written", "{:.2f}"),
]


def print_summary(summaries, systems):
    others = [o for o in PEERS if o in systems and "sluice" in systems]
    header = ["figure"] + systems + [f"sluice/{o}" for o in others]
    print("\n### summary (medians)\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for load, key, label, fmt in HEADLINES:
        if load not in summaries:
            continue
        row = summaries[load]
        cells = [label]
        for system in systems:
            v = row[system]
            cells.append(("–" if v == SLUICE_ONLY else "failed") if isinstance(v, str) else
                         (fmt.format(v[key]) if v.get(key) is not None else "–"))
        for other in others:
            a, b = row["sluice"], row[other]
            # A 1000/1 figure is already a ratio within one system.
            ok = not isinstance(a, str) and not isinstance(b, str) and not key.startswith("scale_") \
                and key != "dns_static"
            cells.append(fmt_ratio(a[key], b[key]) if ok else "–")
        print("| " + " | ".join(cells) + " |")


# The chart's panels: per load, the figure to compare and whether lower is
# better. One bar per peer: sluice's figure divided by the peer's.
CHART_FIGURES = [
    ("conn", "cpu_per_op", "short conn\nCPU/conn"),
    ("conn_sc", "cpu_per_op", "short, server first\nCPU/conn"),
    ("sys", "calls_per_conn", "syscalls/conn"),
    ("rr", "cpu_per_op", "keep-alive\nCPU/req"),
    ("rr", "p99_us", "keep-alive\np99"),
    ("bulk", "cpu_per_op", "bulk\nCPU/GB"),
    ("bulk", "rate", "bulk\nGB/s"),
    ("idle", "bytes_per_conn", "idle\nbytes/conn"),
    ("tls", "cpu_per_op", "TLS preread\nCPU/conn"),
    ("pgbench", "cpu_per_op", "pgbench -S\nCPU/xact"),
    ("pgbench_c", "cpu_per_op", "pgbench -S -C\nCPU/xact"),
    ("sysbench", "cpu_per_op", "sysbench oltp_ro\nCPU/xact"),
    ("conn_1000", "cpu_per_op", "1000 servers\nCPU/conn"),
]


def draw_chart(summaries, path, title):
    """Bars of sluice's figure over each peer's, one group per figure; 1.0
    is parity. Below 1 is better except for rates (marked ↑)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib not installed (Debian python3-matplotlib); no chart", file=sys.stderr)
        return
    peers = [p for p in ("haproxy", "nginx") if any(p in s for s in summaries.values())]
    groups = []
    for load, key, label in CHART_FIGURES:
        row = summaries.get(load)
        if not row or isinstance(row.get("sluice"), (str, type(None))):
            continue
        mine = row["sluice"].get(key)
        ratios = []
        for peer in peers:
            other = row.get(peer)
            ok = mine is not None and isinstance(other, dict) and other.get(key)
            ratios.append(mine / other[key] if ok else float("nan"))
        groups.append((label + (" ↑" if key == "rate" else ""), ratios))
    if not groups:
        print("bench: nothing to chart", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(groups)), 4))
    width = 0.8 / max(1, len(peers))
    for i, peer in enumerate(peers):
        xs = [g + (i - (len(peers) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [r[i] for _, r in groups], width, label=f"sluice / {peer}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([g for g, _ in groups], fontsize=7)
    ax.set_ylabel("sluice ÷ peer (below 1: sluice spends less; ↑: more is better)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    print(f"bench: chart written to {path}", file=sys.stderr)


# --------------------------------------------------------------------------

class Context:
    pass


def loads_help():
    """The epilog of --help: every load, described with the full profile's sizes."""
    full = PROFILES["full"]
    lines = ["loads (sizes of the full profile; --profile quick runs each briefly):"]
    for load in ALL_LOADS:
        lines += textwrap.wrap(describe(load, full), width=78, initial_indent=f"  {load:15} ",
                               subsequent_indent=" " * 18)
    lines += ["",
              "The pgbench loads need PostgreSQL (server binaries under /usr/lib/postgresql/*/bin,",
              "pgbench, runuser and the postgres user); without it they are skipped with a message.",
              "They start a throwaway cluster in the benchmark's temporary directory and stop it",
              "at the end. The conn_1000 loads reach one echo backend at 1000 loopback addresses",
              "(127.0.0.1 ... 127.0.3.232). The conn_1000_dns loads get the same addresses from",
              "a dnsmasq the benchmark starts (one name, refreshed every second) and run sluice",
              "only; without dnsmasq (Debian dnsmasq-base) they are skipped with a message.",
              "The sysbench load starts a throwaway MariaDB the same way (Debian mariadb-server",
              "and sysbench; without them it is skipped with a message)."]
    return "\n".join(lines)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=loads_help(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--loadgen", default="build/tools/loadgen")
    ap.add_argument("--sluice-base", metavar="BINARY",
                    help="also run this sluice binary as system sluice-base (an earlier build: "
                         "before/after figures from one run)")
    ap.add_argument("--pin-loadgen", metavar="CPUS",
                    help="run the load generator's client under taskset -c CPUS (e.g. 1)")
    ap.add_argument("--haproxy", default=shutil.which("haproxy") or "/usr/sbin/haproxy")
    ap.add_argument("--nginx", default=shutil.which("nginx") or "/usr/sbin/nginx")
    ap.add_argument("--only", default=",".join(ALL_SYSTEMS),
                    help="comma-separated systems (sluice,haproxy,nginx; also "
                         + ",".join(VARIANT_SYSTEMS) + ": sluice with that listener setting; "
                         + NGINX_HALF_CLOSE + ": nginx with proxy_half_close on; "
                         + ",".join(PEER_VARIANTS) + ": keepalive on, two workers)")
    ap.add_argument("--loads", default=",".join(ALL_LOADS),
                    help="comma-separated loads (" + ",".join(ALL_LOADS) + ")")
    ap.add_argument("--profile", choices=sorted(PROFILES), default="full",
                    help="load sizes: full, or quick (a smoke run of every load, one to two minutes)")
    ap.add_argument("--quick", action="store_true", help="the same as --profile quick")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per load; figures are medians (--latency: rounds per rate; "
                         "--storm: pairs of a steady and a changing segment per change)")
    ap.add_argument("--json", metavar="FILE", help="also write every run's raw figures here")
    ap.add_argument("--chart", metavar="FILE.svg",
                    help="also draw sluice's figures over HAProxy's and nginx's as a bar chart")
    ap.add_argument("--redraw", metavar="FILE.json",
                    help="run nothing: draw --chart from the summary a previous --json wrote")
    ap.add_argument("--latency", action="store_true",
                    help="instead of the loads: open-loop latency at 25/50/75/90 %% of the slowest "
                         "proxy's highest rate, sluice, HAProxy, nginx and direct (tools/openloop.py); "
                         "--chart draws latency against offered load")
    ap.add_argument("--storm", action="store_true",
                    help="instead of the loads: latency, errors and memory under a steady half load "
                         "while the configuration changes every second (tools/openloop.py)")
    ap.add_argument("--capacity", action="store_true",
                    help="instead of the loads: for each system the highest offered rate whose p99 "
                         "stays under 1 ms and under 10 ms, short connections and keep-alive "
                         "(tools/openloop.py)")
    ap.add_argument("--phases", action="store_true",
                    help="instead of the loads: sluice alone with [global] log_phases, short connections "
                         "at 50/75/90 %% of its highest rate; where the slowest 0.1 %% of sessions lose "
                         "their time against the median (tools/openloop.py)")
    ap.add_argument("--realtime", action="store_true",
                    help="--latency/--storm: run proxies, generator and backends under SCHED_RR "
                         "(needs the privilege; for a machine busy with other work)")
    ap.add_argument("--step-seconds", type=float, help="--latency/--capacity: seconds per offered rate")
    ap.add_argument("--storm-seconds", type=float, help="--storm: seconds of changes per run")
    args = ap.parse_args()
    if args.quick:
        args.profile = "quick"
    args.systems = [s for s in args.only.split(",") if s]
    args.load_list = [l for l in args.loads.split(",") if l]
    if args.sluice_base and "sluice-base" not in args.systems:
        args.systems.insert(1, "sluice-base")
    bad = [s for s in args.systems if s not in ALL_SYSTEMS and s not in VARIANT_SYSTEMS
           and s != NGINX_HALF_CLOSE and s not in PEER_VARIANTS
           and not (s == "direct" and (args.latency or args.storm or args.capacity or args.phases))
           and not (s == "sluice-base" and args.sluice_base)] + \
          [l for l in args.load_list if l not in ALL_LOADS]
    if bad:
        ap.error("unknown system or load: " + ", ".join(bad))
    if not args.sluice_base and any(s.startswith("sluice-base") for s in args.systems):
        ap.error("the sluice-base systems need --sluice-base")
    if not 1 <= args.repeat <= 20:
        ap.error("--repeat must be 1..20")
    return args


def skip_unavailable(load_list):
    """Takes out the loads this machine cannot run; returns {load: why}."""
    skipped = {}
    if "tls" in load_list and not shutil.which("openssl"):
        skipped["tls"] = "the openssl command is not installed"
    if any(l in load_list for l in PG_LOADS):
        _, missing = import_dbpeers()
        if missing:
            for load in PG_LOADS:
                if load in load_list:
                    skipped[load] = f"PostgreSQL is not installed here: {missing}"
    if any(l in load_list for l in SYSBENCH_LOADS):
        _, missing = import_mariadb_peers()
        if missing:
            for load in SYSBENCH_LOADS:
                if load in load_list:
                    skipped[load] = f"MariaDB or sysbench is not installed here: {missing}"
    if not dnsmasq_binary():
        for load in DNS_LOADS:
            if load in load_list:
                skipped[load] = "dnsmasq (Debian dnsmasq-base) is not installed"
    for load, why in skipped.items():
        load_list.remove(load)
        print(f"bench: skipping the {load} load: {why}", file=sys.stderr)
    return skipped


def main():
    # SIGTERM unwinds like an exception, so that every process started here
    # is stopped on the way out (by default Python would die at once and
    # leave them running).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    args = parse_args()
    if args.redraw:
        with open(args.redraw) as f:
            saved = json.load(f)
        if not args.chart:
            print("bench: --redraw needs --chart FILE", file=sys.stderr)
            return 2
        if "latency" in saved:
            import openloop
            openloop.redraw(args.redraw, args.chart)
            return 0
        draw_chart(saved["summary"], args.chart, saved.get("title", "sluice beside HAProxy and nginx"))
        return 0
    if not os.access(args.loadgen, os.X_OK):
        print(f"bench: loadgen not found at {args.loadgen} (build it first)", file=sys.stderr)
        return 2
    binaries = {"sluice": args.sluice, "haproxy": args.haproxy, "nginx": args.nginx,
                NGINX_HALF_CLOSE: args.nginx,
                **{name: args.sluice for name in VARIANT_SYSTEMS}, "sluice-base": args.sluice_base,
                **{name: args.sluice_base for name in VARIANT_SYSTEMS if name.startswith("sluice-base")},
                **{name: args.nginx if name.startswith("nginx") else args.haproxy for name in PEER_VARIANTS}}
    if args.pin_loadgen:
        LOADGEN_PREFIX[:] = ["taskset", "-c", args.pin_loadgen]
    if args.latency or args.storm or args.capacity or args.phases:
        import openloop
        return openloop.main(sys.modules[__name__], args, binaries)
    profile = PROFILES[args.profile]
    asked = list(args.load_list)
    skipped = skip_unavailable(args.load_list)

    load_before = loadavg()
    procs = Processes()
    workdir = tempfile.mkdtemp(prefix="sluice-bench-")
    results = {s: {} for s in args.systems}
    started = time.monotonic()
    ctx = Context()
    ctx.procs, ctx.loadgen, ctx.profile, ctx.workdir = procs, args.loadgen, profile, workdir
    ctx.pg = None
    ctx.mariadb = None
    ctx.dns = None
    try:
        ctx.backends = Backends(procs, args.loadgen, workdir, "tls" in args.load_list,
                                want_many=any(l in args.load_list for l in MANY_LOADS + DNS_LOADS))
        if any(l in args.load_list for l in PG_LOADS):
            try:
                ctx.pg = Postgres(import_dbpeers()[0], workdir, profile["pg_scale"])
            except (BenchError, subprocess.TimeoutExpired, OSError) as exc:
                msg = str(exc).replace("\n", " ")
                print(f"bench: pgbench loads: {msg}", file=sys.stderr)
                for system in args.systems:
                    for load in PG_LOADS:
                        if load in args.load_list:
                            results[system][load] = msg
        if any(l in args.load_list for l in SYSBENCH_LOADS):
            try:
                ctx.mariadb = MariaDbServer(import_mariadb_peers()[0], workdir, profile["sb_tables"],
                                            profile["sb_rows"])
            except (BenchError, subprocess.TimeoutExpired, OSError) as exc:
                msg = str(exc).replace("\n", " ")
                print(f"bench: sysbench load: {msg}", file=sys.stderr)
                for system in args.systems:
                    for load in SYSBENCH_LOADS:
                        if load in args.load_list:
                            results[system][load] = msg
        dns_loads = [l for l in DNS_LOADS if l in args.load_list]
        for system in args.systems:
            for load in dns_loads:
                if not is_sluice(system):
                    results[system][load] = SLUICE_ONLY
        if dns_loads:
            try:
                ctx.dns = Dnsmasq(procs, dnsmasq_binary(), workdir, ctx.backends.many)
            except (BenchError, OSError) as exc:
                msg = str(exc).replace("\n", " ")
                print(f"bench: DNS loads: {msg}", file=sys.stderr)
                for system in args.systems:
                    for load in dns_loads:
                        results[system].setdefault(load, msg)
        for rep in range(args.repeat):
            ctx.rep = rep
            # Rotate the order so that no system always runs first or last.
            k = rep % len(args.systems)
            # Every system runs a load before the next load begins: the runs
            # that a ratio compares are a minute apart, not a whole round of
            # loads, so the machine's drift between them stays small.
            order = args.systems[k:] + args.systems[:k]
            for load, system in [(l, s) for l in args.load_list for s in order]:
                if isinstance(results[system].get(load), str):
                    continue  # failed before; do not retry every repeat
                try:
                    run = run_load(ctx, system, binaries[system], load, f"{load}-{rep}")
                    results[system].setdefault(load, []).append(run)
                    print(f"[{time.monotonic() - started:6.1f}s] {system:8} {load:5} run {rep + 1}: "
                          + ", ".join(f"{k}={v:.4g}" for k, v in run.items()
                                      if isinstance(v, (int, float))),
                          file=sys.stderr, flush=True)
                except (BenchError, subprocess.TimeoutExpired, OSError, ValueError) as exc:
                    msg = str(exc).replace("\n", " ")
                    results[system][load] = msg
                    print(f"[{time.monotonic() - started:6.1f}s] {system:8} {load:5} FAILED: {msg}",
                          file=sys.stderr, flush=True)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    finally:
        if ctx.pg is not None:
            ctx.pg.stop()
        if ctx.mariadb is not None:
            ctx.mariadb.stop()
        procs.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"# sluice benchmark ({args.profile} profile, "
          f"{args.repeat} run(s) each, medians; {os.cpu_count()} CPUs; "
          f"load average {load_before} before, {loadavg()} after)")
    if any(key == "machine_per_op" for l in args.load_list for key, _, _ in COLUMNS[l]):
        print("\n" + MACHINE_NOTE)
    for system in args.systems:
        if args.load_list and all(isinstance(results[system].get(l), str) for l in args.load_list) \
                and results[system][args.load_list[0]] != SLUICE_ONLY:
            print(f"\n{system} FAILED: {results[system][args.load_list[0]]}")
    summaries = {}
    for load in asked:
        if load in skipped:
            print(f"\n### {load}: skipped: {skipped[load]}")
            continue
        summaries[load] = summarize(results, args.systems, load)
        print_table(load, summaries[load], args.systems, profile)
    print_summary(summaries, args.systems)
    title = (f"sluice beside HAProxy and nginx, medians of {args.repeat} run(s), "
             f"{args.profile} profile, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"profile": profile, "repeat": args.repeat, "runs": results,
                       "skipped": skipped, "summary": summaries, "title": title}, f, indent=1)
    if args.chart:
        draw_chart(summaries, args.chart, title)
    failed = any(isinstance(results[s].get(l), str) and results[s][l] != SLUICE_ONLY
                 for s in args.systems for l in args.load_list)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
