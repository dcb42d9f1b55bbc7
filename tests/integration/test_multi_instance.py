"""Several sluice instances acting as one service (docs/scale-out.md).

On loopback (always runs):
- `hash` agrees across instances with no coordination, and agrees again
  once every instance's active check has seen a server go down (until then
  they may disagree for about one check interval: measured and printed);
- `least_conn` is per instance: one instance does not see another's load.

In network namespaces the test creates (skipped, with the reason, where
they cannot be made): a client, a router, three instances and the servers,
joined by veth pairs with 10.0.x addresses that exist only inside those
namespaces. Every instance holds the service address and runs BIRD, which
announces it over BGP to the router's BIRD only while the instance's GET
/ready answers 200 (docs/recipes/bgp/sluice-bird-ready toggles a static
route); the router's BIRD installs one multipath route over the instances
that announce it, and the router keeps each flow on the path its first
packet took (docs/recipes/bgp/router-pin-flows.sh). The configuration files
are docs/recipes/bgp/'s, as docs/scale-out.md shows them. Shown, with the
figures printed (time to withdraw, sessions lost):
- hashed keys reach the same server through any instance;
- taking one instance out (POST /healthcheck/fail, or SIGTERM with
  shutdown_delay) withdraws its route before it stops accepting: no client
  refused, no byte lost;
- killing one (sluice alone, or the whole machine, when only BGP's hold
  time can tell) withdraws it within the hold time and loses only its own
  sessions; once back, it takes new clients;
- ExaBGP's healthcheck program, in BIRD's place, announces and withdraws
  alike.

Every loop is bounded, and traffic goes only to addresses inside the
test's namespaces or to loopback."""

from __future__ import annotations

import datetime
import hashlib
import http.client
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import harness
import netns
from fixtures import stop_all_cleanly
from harness import listener, upstream
from test_admin import ADMIN_RX, AdminSluice, admin_sluice, status  # noqa: F401  (fixture)


# --------------------------------------------------------------------------
# on loopback
# --------------------------------------------------------------------------

def banner_from(s, source_ip: str, listener_name: str | None = None) -> str:
    """The banner of the server that a client at `source_ip` reaches through `s`."""
    host, port = s.addr(listener_name)
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.settimeout(harness.EVENT_TIMEOUT)
    try:
        c.bind((source_ip, 0))
        c.connect((host, port))
        return harness.recv_line(c).decode()
    finally:
        c.close()


# 127.0.0.0/8 is all loopback: each of these is a distinct client_ip key.
# Enough of them, over ten servers, that a balancer moving even 0.2 % of the
# other servers' keys when one server goes out fails here in most runs.
LOOPBACK_KEYS = [f"127.0.{i // 200 + 1}.{i % 200 + 2}" for i in range(1000)]


def test_hash_agrees_across_instances_and_again_after_health_converges(admin_sluice, backends):
    names = [chr(ord("A") + i) for i in range(10)]
    servers = [backends(harness.banner_handler, name=n) for n in names]
    interval_s = 1.0
    up = upstream(*servers, balance="hash", hash_key="client_ip")
    health = {"type": "tcp", "interval": f"{interval_s:.0f}s", "timeout": "500ms", "rise": 1, "fall": 1}
    # Each instance lists the servers in its own order: order must not matter.
    insts = []
    for k in range(3):
        order = servers[k:] + servers[:k]
        u = dict(up, servers=[{"address": b.address} for b in order])
        s = admin_sluice([listener()], {"up": u}, start=False, name=f"inst{k}")
        s.config_path.write_text(s.render([listener()], {"up": u}) + "\n[upstream.up.health]\n" +
                                 "\n".join(f"{key} = {harness._toml_value(v)}" for key, v in health.items()) +
                                 "\n")
        insts.append(s.start())

    def table() -> dict[str, list[str]]:
        # A few clients at once: the keys are many, the answers independent.
        with ThreadPoolExecutor(max_workers=8) as pool:
            rows = pool.map(lambda key: [banner_from(s, key) for s in insts], LOOPBACK_KEYS)
            return dict(zip(LOOPBACK_KEYS, rows))

    def wait_all_see(server, up: bool) -> dict[str, float]:
        """Polls every instance until its check sees `server` up (or not up);
        returns the seconds each took."""
        t0 = time.monotonic()
        seen: dict[str, float] = {}
        deadline = t0 + interval_s * 3 + harness.EVENT_TIMEOUT
        while len(seen) < len(insts) and time.monotonic() < deadline:
            for s in insts:
                if s.config_path.name in seen:
                    continue
                srv = [x for x in status(s)["upstreams"][0]["servers"] if x["address"] == server.address][0]
                if (srv["state"] == "up") == up:
                    seen[s.config_path.name] = time.monotonic() - t0
            time.sleep(0.02)
        assert len(seen) == len(insts), f"only {seen} saw {server.name} {'up' if up else 'down'}"
        return seen

    before = table()
    disagree = {k: v for k, v in before.items() if len(set(v)) != 1}
    assert not disagree, f"instances disagree on {len(disagree)} key(s): {disagree}"
    used = {v[0] for v in before.values()}
    assert len(used) >= 3, f"{len(LOOPBACK_KEYS)} keys reached only {used}"

    # A server goes away: each instance notices on its own check schedule.
    gone = servers[names.index(sorted(used)[0])]
    gone.stop()
    seen_down = wait_all_see(gone, up=False)
    spread = max(seen_down.values()) - min(seen_down.values())
    print(f"\n{gone.name} seen down after {sorted(round(v, 2) for v in seen_down.values())} s; "
          f"instances disagreed for {spread:.2f} s (check interval {interval_s:.1f} s)")

    after = table()
    disagree = {k: v for k, v in after.items() if len(set(v)) != 1}
    assert not disagree, f"after the check converged, instances disagree on {disagree}"
    # Exactly the lost server's keys move (and alike everywhere: checked
    # above); every other key stays where it was.
    moved_others = {k: (before[k][0], after[k][0]) for k in LOOPBACK_KEYS
                    if before[k][0] != gone.name and after[k][0] != before[k][0]}
    assert not moved_others, f"{len(moved_others)} key(s) of other servers moved: {moved_others}"
    stuck = [k for k in LOOPBACK_KEYS if after[k][0] == gone.name]
    assert not stuck, f"keys still reach {gone.name}: {stuck}"
    print(f"{gone.name} out: {sum(1 for v in before.values() if v[0] == gone.name)} of "
          f"{len(LOOPBACK_KEYS)} keys moved, all of them its own")

    # It comes back (same address): it takes back exactly its own keys.
    back = backends(harness.banner_handler, name=gone.name, port=gone.port)
    assert back.address == gone.address
    wait_all_see(back, up=True)
    again = table()
    differ = {k: (before[k], again[k]) for k in LOOPBACK_KEYS if again[k] != before[k]}
    assert not differ, f"{gone.name} back: {len(differ)} key(s) not where they were: {differ}"


def test_least_conn_counts_only_its_own_sessions(admin_sluice, backends):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    one = admin_sluice([listener()], {"up": upstream(a, b, balance="least_conn")}, name="one")
    two = admin_sluice([listener()], {"up": upstream(a, b, balance="least_conn")}, name="two")
    held = []
    try:
        c = one.connect()
        first = harness.recv_line(c).decode()
        held.append(c)
        # Within one instance the next session goes to the other server ...
        c = one.connect()
        assert harness.recv_line(c).decode() != first
        held.append(c)
        c.close()
        held.pop()
        # ... but the second instance does not know of the first's session: its
        # own first pick is the same server, which now has two.
        c = two.connect()
        assert harness.recv_line(c).decode() == first
        held.append(c)
        srv = {x["address"]: x["active"] for x in status(two)["upstreams"][0]["servers"]}
        picked = a if first == "A" else b
        assert srv[picked.address] == 1, srv  # its own count only
        assert harness.wait_until(lambda: picked.counts()[1] == 2, what="two sessions on one server")
    finally:
        for c in held:
            c.close()


# --------------------------------------------------------------------------
# in network namespaces, behind ECMP
# --------------------------------------------------------------------------

def _unavailable() -> str | None:
    why = netns.unavailable()
    if why:
        return why
    for tool in ("curl",):
        if not shutil.which(tool):
            return f"{tool} is not installed (tools/setup.sh installs it)"
    return None


def _bird_missing() -> str | None:
    if NETNS_REASON:
        return NETNS_REASON
    for tool in ("bird", "birdc"):
        if not shutil.which(tool):
            return f"{tool} is not installed (tools/setup.sh installs bird2)"
    return None


NETNS_REASON = _unavailable()
BIRD_REASON = _bird_missing()
needs_netns = pytest.mark.skipif(BIRD_REASON is not None, reason=BIRD_REASON or "")

RECIPES = Path(__file__).resolve().parents[2] / "docs" / "recipes" / "bgp"
VIP = "10.0.100.1"          # the service address every instance holds
PORT = 7000                 # the service port (inside the test's own namespaces)
HASH_PORT = 7001
ADMIN_PORT = 9090           # each instance's admin API, on its own namespace's loopback
HOLD_S = 3.0                # the BGP hold time in docs/recipes/bgp/bird-*.conf
WATCH_INTERVAL = "0.5"      # how often sluice-bird-ready asks GET /ready
SERVERS_IP = "10.0.9.2"
CLIENT_IP = "10.0.0.2"
KEY_IPS = [f"10.0.0.{i}" for i in range(10, 40)]   # more client addresses: hash keys
_ids = itertools.count(1)


def instance_ip(k: int) -> str:
    return f"10.0.{k}.2"


class Daemon:
    """A process started inside one of the topology's namespaces, its output
    in `log`; stopped by its PID."""

    def __init__(self, topo: "Topology", role: str, argv: list[str], env: dict[str, str] | None = None,
                 cwd: str | None = None):
        target = f"/var/run/netns/{topo.ns[role]}"

        def enter():
            fd = os.open(target, os.O_RDONLY)
            netns._setns(fd)
            os.close(fd)

        self.argv = argv
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, preexec_fn=enter, cwd=cwd,
                                     env={**os.environ, **(env or {})})
        self.log = harness.LineLog(self.proc.stdout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.log.join()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(harness.EVENT_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.join()


def instance_bird_conf(k: int) -> str:
    """docs/recipes/bgp/bird-instance.conf (written for instance 1) for instance k."""
    text = (RECIPES / "bird-instance.conf").read_text()
    return text.replace("10.0.1.2", instance_ip(k)).replace("10.0.1.1", f"10.0.{k}.1")


class Topology:
    """client -- router ==ECMP (BIRD)==> instance 1..n; router -- servers."""

    def __init__(self, n: int):
        tag = f"{os.getpid()}-{next(_ids)}"
        self.n = n
        self.ns = {role: f"sluice-mi-{tag}-{role}" for role in ["c", "r", "s"] + [f"i{k}" for k in range(1, n + 1)]}
        self.made: list[str] = []
        self.daemons: dict[str, Daemon] = {}
        # BIRD's control sockets: a short path (a socket's path has a limit).
        self.run_dir = tempfile.mkdtemp(prefix="slbgp-")

    def ip(self, role: str, *argv: str) -> None:
        netns.run("ip", "-n", self.ns[role], *argv)

    def sysctl(self, role: str, *settings: str) -> None:
        netns.run("ip", "netns", "exec", self.ns[role], "sysctl", "-q", "-w", *settings)

    def link(self, a: str, a_if: str, a_addr: str, b: str, b_if: str, b_addr: str) -> None:
        self.ip(a, "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", self.ns[b])
        for role, ifname, addr in ((a, a_if, a_addr), (b, b_if, b_addr)):
            self.ip(role, "addr", "add", addr, "dev", ifname)
            self.ip(role, "link", "set", ifname, "up")

    def create(self, pin_flows: bool = True) -> "Topology":
        for role, name in self.ns.items():
            netns.run("ip", "netns", "add", name)
            self.made.append(name)
            self.ip(role, "link", "set", "lo", "up")
            # Replies leave an instance from the service address, which the
            # router reaches by several paths: no reverse-path filtering.
            self.sysctl(role, "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0")
        self.sysctl("r", "net.ipv4.ip_forward=1", "net.ipv4.fib_multipath_hash_policy=1")
        self.link("c", "c0", f"{CLIENT_IP}/24", "r", "rc", "10.0.0.1/24")
        for ip in KEY_IPS:
            self.ip("c", "addr", "add", f"{ip}/24", "dev", "c0")
        self.ip("c", "route", "add", "default", "via", "10.0.0.1")
        self.link("s", "s0", f"{SERVERS_IP}/24", "r", "rs", "10.0.9.1/24")
        self.ip("s", "route", "add", "default", "via", "10.0.9.1")
        for k in range(1, self.n + 1):
            self.link(f"i{k}", "i0", f"{instance_ip(k)}/24", "r", f"ri{k}", f"10.0.{k}.1/24")
            self.ip(f"i{k}", "route", "add", "default", "via", f"10.0.{k}.1")
            self.ip(f"i{k}", "addr", "add", f"{VIP}/32", "dev", "lo")
        if pin_flows:
            # Written for the docs' three instances.
            assert self.n == 3, self.n
            netns.run("ip", "netns", "exec", self.ns["r"], "sh", str(RECIPES / "router-pin-flows.sh"))
        self.start_bird("r", (RECIPES / "bird-router.conf").read_text())
        return self

    def start_bird(self, role: str, conf: str) -> Daemon:
        path = Path(self.run_dir) / f"{role}.conf"
        path.write_text(conf)
        d = Daemon(self, role, ["bird", "-f", "-c", str(path), "-s", self.bird_socket(role),
                                "-P", str(Path(self.run_dir) / f"{role}.pid")])
        self.daemons[f"bird-{role}"] = d
        return d

    def bird_socket(self, role: str) -> str:
        return str(Path(self.run_dir) / f"{role}.ctl")

    def start_bgp(self, k: int) -> None:
        """BIRD and sluice-bird-ready on instance k."""
        role = f"i{k}"
        self.start_bird(role, instance_bird_conf(k))
        self.daemons[f"ready-{role}"] = Daemon(
            self, role, ["sh", str(RECIPES / "sluice-bird-ready")],
            env={"SLUICE_READY_URL": f"http://127.0.0.1:{ADMIN_PORT}/ready", "BIRD_SOCKET": self.bird_socket(role),
                 "INTERVAL": WATCH_INTERVAL})

    def kill_bgp(self, k: int) -> None:
        for name in (f"ready-i{k}", f"bird-i{k}"):
            self.daemons.pop(name).kill()

    def drop_everything(self, role: str) -> None:
        """Every packet into or out of the namespace is lost from now on: a
        machine that lost power sends no FIN, no RST, no BGP notification."""
        netns.run("ip", "netns", "exec", self.ns[role], "nft", "-f", "-", input_text=(
            "table inet fault {\n"
            "  chain in { type filter hook input priority 0; policy drop; }\n"
            "  chain out { type filter hook output priority 0; policy drop; }\n"
            "}\n"))

    def undrop(self, role: str) -> None:
        netns.run("ip", "netns", "exec", self.ns[role], "nft", "delete", "table", "inet", "fault")

    def paths(self) -> set[str]:
        """The next hops of the router's route to the service address."""
        res = subprocess.run(["ip", "-n", self.ns["r"], "-j", "route", "show", f"{VIP}/32"],
                             capture_output=True, text=True, timeout=netns.COMMAND_TIMEOUT)
        assert res.returncode == 0, res.stderr
        hops = set()
        for r in json.loads(res.stdout or "[]"):
            if "gateway" in r:
                hops.add(r["gateway"])
            for h in r.get("nexthops", []):
                hops.add(h["gateway"])
        return hops

    def wait_paths(self, pred, what: str, timeout: float) -> float:
        """Seconds until pred(paths()) holds (polled every 50 ms)."""
        t0 = time.monotonic()
        harness.wait_until(lambda: pred(self.paths()), timeout=timeout, interval=0.05, what=what)
        return time.monotonic() - t0

    def entered(self, role: str):
        ns = netns.Namespace.__new__(netns.Namespace)
        ns.name = self.ns[role]
        return ns.entered()

    def destroy(self) -> list[str]:
        problems = []
        for d in self.daemons.values():
            d.stop()
        self.daemons = {}
        for name in self.made:
            res = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True,
                                 timeout=netns.COMMAND_TIMEOUT)
            if res.returncode != 0:
                problems.append(f"ip netns del {name}: {res.stderr.strip()}")
        self.made = []
        shutil.rmtree(self.run_dir, ignore_errors=True)
        return problems


class NsSluice(AdminSluice):
    """An instance started inside a namespace; its admin API is on that
    namespace's loopback, reached from a thread that enters it."""

    topo: Topology
    role: str

    def start(self) -> "NsSluice":
        target = f"/var/run/netns/{self.topo.ns[self.role]}"

        def enter():
            fd = os.open(target, os.O_RDONLY)
            netns._setns(fd)
            os.close(fd)

        self.proc = subprocess.Popen([str(harness.sluice_bin()), "-c", str(self.config_path)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, cwd=self.workdir, preexec_fn=enter)
        self.log = harness.LineLog(self.proc.stdout)
        for name in self.expected_listeners:
            m = self.log.wait_for(harness.LISTENING_RX.replace('(?P<name>[^"]+)', re.escape(name)),
                                  timeout=harness.START_TIMEOUT)
            self.addrs[name] = harness.split_addr(m.group("addr"))
        m = self.log.wait_for(ADMIN_RX, timeout=harness.START_TIMEOUT)
        self.admin_addr = harness.split_addr(m.group("addr"))
        return self

    def admin(self, method: str, path: str) -> tuple[int, dict]:
        with self.topo.entered(self.role):
            conn = http.client.HTTPConnection(*self.admin_addr, timeout=harness.EVENT_TIMEOUT)
            try:
                conn.request(method, path)
                r = conn.getresponse()
                return r.status, json.loads(r.read() or b"{}")
            finally:
                conn.close()

    def ready(self) -> bool:
        try:
            return self.admin("GET", "/ready")[0] == 200
        except OSError:
            return False  # not answering at all: as good as not ready


@pytest.fixture
def cluster(tmp_path, backends):
    """make(n) -> (Topology, [NsSluice], servers): n instances behind the
    router, each announcing the service address with BIRD while ready."""
    topos: list[Topology] = []
    started: list[NsSluice] = []

    def make(n: int = 3, global_: dict | None = None):
        topo = Topology(n)
        topos.append(topo)
        topo.create()
        with topo.entered("s"):
            echo = backends(peer_echo_handler, name="echo", host=SERVERS_IP)
            named = [backends(harness.banner_handler, name=x, host=SERVERS_IP) for x in "ABCD"]
        ups = {"echo": upstream(echo, balance="least_conn"),
               "hashed": upstream(*named, balance="hash", hash_key="client_ip")}
        lst = [listener("svc", "echo", listen=f"0.0.0.0:{PORT}"),
               listener("hash", "hashed", listen=f"0.0.0.0:{HASH_PORT}")]
        insts = []
        for k in range(1, n + 1):
            workdir = tmp_path / f"i{k}-{len(started)}"
            workdir.mkdir()
            s = NsSluice(workdir, "", [l["name"] for l in lst], name=f"i{k}", access_log=workdir / "access.log")
            s.topo, s.role = topo, f"i{k}"
            s.admin_table = {"listen": f"127.0.0.1:{ADMIN_PORT}"}
            s.global_ = dict({"shutdown_timeout": "3s"}, **(global_ or {}))
            s.config_path.write_text(s.render(lst, ups))
            started.append(s)
            insts.append(s.start())
            topo.start_bgp(k)
        want = {instance_ip(k) for k in range(1, n + 1)}
        took = topo.wait_paths(lambda p: p == want, f"the router's route through all {n} instances", timeout=60)
        print(f"\nBGP: the router has a path through each of the {n} instances {took:.1f} s after the last start")
        return topo, insts, named

    yield make
    try:
        stop_instances(started)
    finally:
        problems = [p for t in topos for p in t.destroy()]
        assert not problems, problems


def stop_instances(started: list[NsSluice]) -> None:
    """Stops every instance not killed on purpose; fails when one did not
    exit 0. One in a shutdown_delay gets the second SIGTERM that ends it."""
    try:
        for s in started:
            if s.running() and "shutdown_delay" in s.global_ and not s.log.matches(r"received SIGTERM"):
                s.signal(signal.SIGTERM)
                s.log.wait_for(r"received SIGTERM: not ready", timeout=5)
        stop_all_cleanly([s for s in started if s.proc is not None and s.proc.returncode != -signal.SIGKILL])
    finally:
        for s in started:
            if s.running():
                s.proc.kill()
                s.proc.wait(5)


def peer_echo_handler(backend: harness.Backend, conn: socket.socket):
    """Sends the address the connection came from (the instance), then echoes."""
    conn.sendall(conn.getpeername()[0].encode() + b"\n")
    harness.echo_handler(backend, conn)


class Client:
    """One session through the service address: learns which instance it
    went through, then moves `total` bytes in `chunk`s, each echoed back
    before the next, with a pause between them; reports whether every byte
    came back whole."""

    def __init__(self, topo, total: int, chunk: int = 16384, pause: float = 0.0,
                 source: str = CLIENT_IP, to: tuple[str, int] = (VIP, PORT)):
        self.total, self.chunk, self.pause, self.to = total, chunk, pause, to
        self.instance: str | None = None
        self.refused = False
        self.error: BaseException | None = None
        self.whole = False
        self.started = threading.Event()
        self.go = threading.Event()
        self.go.set()
        with topo.entered("c"):
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.settimeout(harness.EVENT_TIMEOUT)
        self.sock.bind((source, 0))
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        try:
            try:
                self.sock.connect(self.to)
            except ConnectionRefusedError:
                self.refused = True
                raise
            self.instance = harness.recv_line(self.sock).decode()
            self.started.set()
            rng = random.Random(self.sock.getsockname()[1])
            sent = hashlib.sha256()
            got = hashlib.sha256()
            left = self.total
            while left > 0:
                self.go.wait(harness.EVENT_TIMEOUT)
                block = rng.randbytes(min(self.chunk, left))
                self.sock.sendall(block)
                sent.update(block)
                got.update(harness.recv_exact(self.sock, len(block)))
                left -= len(block)
                if self.pause:
                    time.sleep(self.pause)
            self.sock.shutdown(socket.SHUT_WR)
            rest = harness.recv_all(self.sock, limit=1 << 20)
            self.whole = rest == b"" and sent.digest() == got.digest()
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            self.started.set()
            self.sock.close()

    def start(self) -> "Client":
        self.thread.start()
        return self

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "a client did not finish"


class Load:
    """Short sessions one after another from a few threads, each counted as
    whole or failed, until stopped (or a bound on their number)."""

    def __init__(self, topo, threads: int = 2, limit: int = 5000, **client):
        self.topo, self.limit, self.client = topo, limit, client
        self.ok = 0
        self.failures: list[str] = []
        self.refused = 0
        self.per_instance: dict[str, int] = {}
        self.lock = threading.Lock()
        self.stop_ev = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(threads)]

    def run(self):
        while not self.stop_ev.is_set():
            with self.lock:
                if self.ok + len(self.failures) >= self.limit:
                    return
            c = Client(self.topo, total=4096, chunk=4096, **self.client)
            c.run()
            with self.lock:
                self.refused += c.refused
                if c.whole:
                    self.ok += 1
                    self.per_instance[c.instance] = self.per_instance.get(c.instance, 0) + 1
                else:
                    self.failures.append(f"via {c.instance}: {c.error!r}")
            time.sleep(0.03)

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        for t in self.threads:
            t.join(harness.EVENT_TIMEOUT * 2)
        assert not any(t.is_alive() for t in self.threads), "load threads did not finish"

    def count(self) -> int:
        with self.lock:
            return self.ok + len(self.failures)


def wait_sessions(load: Load, more: int, timeout: float = 30.0) -> None:
    want = load.count() + more
    harness.wait_until(lambda: load.count() >= want, timeout=timeout, what=f"{more} more client sessions")


@needs_netns
def test_hashed_keys_reach_the_same_server_through_any_instance(cluster):
    topo, insts, _ = cluster(3)
    table: dict[str, set[str]] = {}
    with topo.entered("c"):
        for key in KEY_IPS:
            got = set()
            # Straight to each instance's own address ...
            for k in range(1, len(insts) + 1):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.settimeout(harness.EVENT_TIMEOUT)
                s.bind((key, 0))
                s.connect((instance_ip(k), HASH_PORT))
                got.add(harness.recv_line(s).decode())
                s.close()
            # ... and through the service address, from several source ports.
            for _ in range(4):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.settimeout(harness.EVENT_TIMEOUT)
                s.bind((key, 0))
                s.connect((VIP, HASH_PORT))
                got.add(harness.recv_line(s).decode())
                s.close()
            table[key] = got
    disagree = {k: v for k, v in table.items() if len(v) != 1}
    assert not disagree, f"a key reached different servers: {disagree}"
    assert len({next(iter(v)) for v in table.values()}) >= 3, table
    # ECMP spread the service address's sessions over every instance.
    for s in insts:
        accepted = [l for l in status_in(s)["listeners"] if l["name"] == "hash"][0]["accepted"]
        assert accepted > len(KEY_IPS), (s.role, accepted)


def status_in(s: NsSluice) -> dict:
    code, doc = s.admin("GET", "/status")
    assert code == 200, doc
    return doc


@needs_netns
@pytest.mark.parametrize("how", ["healthcheck_fail", "sigterm_shutdown_delay"])
def test_taking_an_instance_out_refuses_no_client(cluster, how):
    # With shutdown_delay the instance stops accepting on its own once the
    # delay is over: its route must be gone by then. Its live sessions then
    # get shutdown_timeout, long enough here for the long ones to finish.
    global_ = {"shutdown_delay": "4s", "shutdown_timeout": "60s"} if how == "sigterm_shutdown_delay" else {}
    topo, insts, _ = cluster(3, global_=global_)
    out = insts[1]
    # Long sessions through every instance, moving bytes all along.
    long = []
    for _ in range(12):
        # About ten seconds each: under way while the instance is taken out.
        c = Client(topo, total=4 << 20, chunk=16384, pause=0.03).start()
        assert c.started.wait(harness.EVENT_TIMEOUT)
        long.append(c)
    with Load(topo) as load:
        wait_sessions(load, 30)
        assert set(load.per_instance) == {instance_ip(k) for k in (1, 2, 3)}, load.per_instance
        t0 = time.monotonic()
        if how == "healthcheck_fail":
            code, doc = out.admin("POST", "/healthcheck/fail")
            assert code == 200, doc
        else:
            out.signal(signal.SIGTERM)
            out.log.wait_for(r"received SIGTERM: not ready", timeout=5)
        topo.wait_paths(lambda p: instance_ip(2) not in p, "the router to withdraw i2's route", timeout=30)
        withdrawn = time.monotonic() - t0
        # Withdrawn while the instance still accepts.
        assert not out.log.matches(r"shutdown_delay over: graceful stop begins"), "withdrawn only after the delay"
        assert out.running()
        wait_sessions(load, 4)  # the sessions under way while it left have ended
        before = dict(load.per_instance)
        wait_sessions(load, 30)
        # Nothing new reaches the instance taken out.
        assert load.per_instance.get(instance_ip(2)) == before.get(instance_ip(2)), load.per_instance
        # Its own long sessions keep their path (the router pins each flow)
        # and end on their own; then it stops.
        for c in long:
            c.join(120)
        if how == "healthcheck_fail":
            out.signal(signal.SIGTERM)
        assert out.wait_exit(timeout=harness.EVENT_TIMEOUT * 2) == 0
        wait_sessions(load, 20)
    assert load.refused == 0, f"{load.refused} client(s) refused"
    assert not load.failures, f"{len(load.failures)} of {load.count()} sessions failed: {load.failures[:5]}"
    bad = [(c.instance, repr(c.error)) for c in long if not c.whole]
    assert not bad, f"long sessions lost bytes: {bad}"
    via_out = sum(1 for c in long if c.instance == instance_ip(2))
    print(f"\n{how}: i2's route withdrawn {withdrawn:.2f} s after it turned not ready (checked every "
          f"{WATCH_INTERVAL} s); {load.ok} short sessions and {len(long)} long ones ({via_out} through i2), "
          f"none refused, none short of a byte; per instance: {load.per_instance}")


@needs_netns
@pytest.mark.parametrize("what", ["sluice", "machine"])
def test_killing_an_instance_loses_only_its_own_sessions(cluster, what):
    """`sluice`: the process is killed and its machine goes on: the watcher's
    next GET /ready gets no answer and BIRD withdraws the route. `machine`:
    sluice, BIRD and the watcher are killed and the machine sends nothing
    more (no FIN, no RST, no notification): the router withdraws the route
    when the BGP hold time runs out."""
    topo, insts, _ = cluster(3)
    victim = insts[2]
    long: list[Client] = []

    def through(k: int) -> int:
        return sum(1 for c in long if c.instance == instance_ip(k))

    # At least 18 sessions, and more (within a bound) until the victim and
    # the others each carry a few: ECMP decides where each one goes.
    while len(long) < 18 or (len(long) < 60 and (through(3) < 3 or len(long) - through(3) < 3)):
        c = Client(topo, total=1 << 20, chunk=16384, pause=0.02)
        c.go.clear()  # each moves its first block only once all are open
        c.start()
        assert c.started.wait(harness.EVENT_TIMEOUT) and c.instance, c.error
        long.append(c)
    assert through(3) >= 3 and len(long) - through(3) >= 3, [c.instance for c in long]
    for c in long:
        c.go.set()
    t0, wall0 = time.monotonic(), time.time()
    if what == "machine":
        topo.drop_everything("i3")
        topo.kill_bgp(3)
    victim.proc.kill()
    victim.proc.wait(5)
    topo.wait_paths(lambda p: instance_ip(3) not in p, "the router to withdraw i3's route", timeout=HOLD_S * 4 + 10)
    withdrawn = time.monotonic() - t0
    expiry = ""
    if what == "machine":
        # When the router's BIRD gave up on i3, by its own log's clock: the
        # hold time after the last keepalive it had, so at most the hold
        # time after the machine went silent (a busy machine may run
        # BIRD's timer a little late).
        m = topo.daemons["bird-r"].log.wait_for(
            r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) <RMT> i3: Error: Hold timer expired", timeout=5)
        at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp() - wall0
        assert at <= HOLD_S + 1.0, f"the router's hold timer expired {at:.2f} s after i3 went silent"
        expiry = f"the router's hold timer expired {at:.2f} s after the machine went silent; "
    # Within the hold time (the watcher is faster when the machine lives);
    # the kernel's route follows BIRD's decision at once.
    assert withdrawn <= HOLD_S * 2, f"withdrawn after {withdrawn:.1f} s, hold time {HOLD_S:.0f} s"
    for c in long:
        c.join(120)
    own = [c for c in long if c.instance == instance_ip(3)]
    others = [c for c in long if c.instance != instance_ip(3)]
    assert own and all(not c.whole for c in own), [(c.instance, c.whole) for c in own]
    bad = [(c.instance, repr(c.error)) for c in others if not c.whole]
    assert not bad, f"sessions through the surviving instances lost bytes: {bad}"
    # New clients are all served by the survivors.
    with Load(topo) as load:
        wait_sessions(load, 30)
    assert not load.failures, load.failures[:5]
    assert set(load.per_instance) == {instance_ip(1), instance_ip(2)}, load.per_instance

    # It comes back, and takes new clients.
    t1 = time.monotonic()
    if what == "machine":
        topo.undrop("i3")
        topo.start_bgp(3)
    victim.start()
    back = topo.wait_paths(lambda p: instance_ip(3) in p, "i3's route to come back", timeout=60)
    back = time.monotonic() - t1
    with Load(topo) as load:
        wait_sessions(load, 30)
        harness.wait_until(lambda: instance_ip(3) in load.per_instance, timeout=60,
                           what="a new client through i3")
    assert not load.failures, load.failures[:5]
    print(f"\nkilled i3 ({what}): {expiry}route gone from the router's table after {withdrawn:.2f} s (hold time "
          f"{HOLD_S:.0f} s); lost its "
          f"own {len(own)} session(s), 0 of the {len(others)} on the others; back {back:.1f} s after its "
          f"restart, new clients per instance: {load.per_instance}")


@pytest.mark.skipif(BIRD_REASON is not None or shutil.which("exabgp") is None,
                    reason=BIRD_REASON or "exabgp is not installed (tools/setup.sh installs it)")
def test_exabgp_healthcheck_announces_while_ready(tmp_path, backends):
    """docs/recipes/bgp/exabgp.conf on one instance, the router's BIRD as
    in the other tests: the route follows GET /ready."""
    topo = Topology(1)
    inst: NsSluice | None = None
    try:
        topo.create(pin_flows=False)
        with topo.entered("s"):
            echo = backends(peer_echo_handler, name="echo", host=SERVERS_IP)
        lst = [listener("svc", "echo", listen=f"0.0.0.0:{PORT}")]
        inst = NsSluice(tmp_path, "", ["svc"], name="i1", access_log=tmp_path / "access.log")
        inst.topo, inst.role = topo, "i1"
        inst.admin_table = {"listen": f"127.0.0.1:{ADMIN_PORT}"}
        inst.global_ = {"shutdown_timeout": "3s"}
        inst.config_path.write_text(inst.render(lst, {"echo": upstream(echo)}))
        inst.start()
        conf = Path(topo.run_dir) / "exabgp.conf"
        conf.write_text((RECIPES / "exabgp.conf").read_text())
        # No command pipes for its CLI; the rest as installed.
        topo.daemons["exabgp"] = Daemon(topo, "i1", ["exabgp", str(conf)],
                                        env={"exabgp.api.cli": "false", "exabgp.log.destination": "stdout",
                                             "exabgp.daemon.user": "root"},
                                        cwd=topo.run_dir)
        topo.wait_paths(lambda p: p == {instance_ip(1)}, "ExaBGP's announcement", timeout=60)
        c = Client(topo, total=4096, chunk=4096)
        c.run()
        assert c.whole and c.instance == instance_ip(1), c.error

        t0 = time.monotonic()
        code, doc = inst.admin("POST", "/healthcheck/fail")
        assert code == 200, doc
        topo.wait_paths(lambda p: not p, "ExaBGP's withdrawal", timeout=30)
        withdrawn = time.monotonic() - t0
        t1 = time.monotonic()
        code, doc = inst.admin("POST", "/healthcheck/ok")
        assert code == 200, doc
        topo.wait_paths(lambda p: p == {instance_ip(1)}, "ExaBGP's announcement again", timeout=30)
        back = time.monotonic() - t1
        c = Client(topo, total=4096, chunk=4096)
        c.run()
        assert c.whole, c.error
        print(f"\nExaBGP healthcheck: withdrawn {withdrawn:.2f} s after POST /healthcheck/fail, announced "
              f"{back:.2f} s after POST /healthcheck/ok (checks every second)")
    finally:
        try:
            if inst is not None:
                stop_instances([inst])
        finally:
            problems = topo.destroy()
            assert not problems, problems


# --------------------------------------------------------------------------
# a keepalived VRRP pair, with track_script on /ready
# --------------------------------------------------------------------------

LAN_VIP = "10.0.50.100"
LAN_CLIENT = "10.0.50.2"


def _keepalived_missing() -> str | None:
    if NETNS_REASON:
        return NETNS_REASON
    for tool in ("keepalived", "curl"):
        if not shutil.which(tool):
            return f"{tool} is not installed (tools/setup.sh installs it)"
    return None


KEEPALIVED_REASON = _keepalived_missing()


def lan_ip(k: int) -> str:
    return f"10.0.50.{10 + k}"


class VrrpPair(Topology):
    """client (and servers) -- bridge -- instance 1, instance 2: one
    Ethernet segment on which keepalived moves the service address."""

    def __init__(self):
        super().__init__(2)
        self.ns = {role: name for role, name in self.ns.items() if role != "r"}
        self.ns["lan"] = self.ns.pop("s").replace("-s", "-lan")

    def create(self) -> "VrrpPair":
        for role, name in self.ns.items():
            netns.run("ip", "netns", "add", name)
            self.made.append(name)
            self.ip(role, "link", "set", "lo", "up")
        self.ip("lan", "link", "add", "br0", "type", "bridge")
        self.ip("lan", "link", "set", "br0", "up")
        for role, addr in [("c", LAN_CLIENT)] + [(f"i{k}", lan_ip(k)) for k in (1, 2)]:
            port = f"p-{role}"
            self.ip(role, "link", "add", "e0", "type", "veth", "peer", "name", port, "netns", self.ns["lan"])
            self.ip(role, "addr", "add", f"{addr}/24", "dev", "e0")
            self.ip(role, "link", "set", "e0", "up")
            self.ip("lan", "link", "set", port, "master", "br0")
            self.ip("lan", "link", "set", port, "up")
        return self

    def holder(self) -> str | None:
        """The instance that holds the service address now, if one does."""
        held = []
        for k in (1, 2):
            res = subprocess.run(["ip", "-n", self.ns[f"i{k}"], "-j", "addr", "show", "dev", "e0"],
                                 capture_output=True, text=True, timeout=netns.COMMAND_TIMEOUT)
            addrs = [a["local"] for i in json.loads(res.stdout or "[]") for a in i.get("addr_info", [])]
            if LAN_VIP in addrs:
                held.append(f"i{k}")
        return held[0] if len(held) == 1 else None


class Keepalived(Daemon):
    """keepalived (VRRP only) in an instance's namespace; its track_script
    asks that instance's GET /ready with curl."""

    def __init__(self, topo: VrrpPair, k: int, inst: NsSluice, workdir):
        self.workdir = workdir
        conf = workdir / "keepalived.conf"
        conf.write_text(f"""global_defs {{
    router_id sluice_i{k}
    script_user root
}}
vrrp_script sluice_ready {{
    script "{shutil.which('curl')} -fsS -o /dev/null --max-time 1 http://127.0.0.1:{inst.admin_addr[1]}/ready"
    interval 1
    fall 1
    rise 1
}}
vrrp_instance sluice {{
    state {'MASTER' if k == 1 else 'BACKUP'}
    interface e0
    virtual_router_id 51
    priority {150 if k == 1 else 100}
    advert_int 1
    virtual_ipaddress {{
        {LAN_VIP}/24
    }}
    track_script {{
        sluice_ready
    }}
}}
""")
        super().__init__(topo, f"i{k}",
                         ["keepalived", "--dont-fork", "--log-console", "--vrrp", "-f", str(conf),
                          "-p", str(workdir / "keepalived.pid"), "-r", str(workdir / "vrrp.pid")],
                         cwd=str(workdir))


@pytest.mark.skipif(KEEPALIVED_REASON is not None, reason=KEEPALIVED_REASON or "")
@pytest.mark.parametrize("how", ["healthcheck_fail", "sigterm_shutdown_delay"])
def test_keepalived_pair_moves_the_address_on_ready_and_refuses_no_client(tmp_path, backends, how):
    topo = VrrpPair()
    started: list[NsSluice] = []
    keepers: list[Keepalived] = []
    try:
        topo.create()
        with topo.entered("c"):
            echo = backends(peer_echo_handler, name="echo", host=LAN_CLIENT)
        lst = [listener("svc", "echo", listen=f"0.0.0.0:{PORT}")]
        # A session whose client was reset by the backup never hears of it
        # on the old master: shutdown_timeout ends it there.
        global_ = {"shutdown_timeout": "3s"}
        if how == "sigterm_shutdown_delay":
            # Longer than the track script needs to notice (interval 1 s x
            # fall 1) and the backup to take over (about one advertisement).
            global_["shutdown_delay"] = "6s"
        for k in (1, 2):
            workdir = tmp_path / f"i{k}"
            workdir.mkdir()
            s = NsSluice(workdir, "", ["svc"], name=f"i{k}", access_log=workdir / "access.log")
            s.topo, s.role = topo, f"i{k}"
            s.admin_table = {"listen": "127.0.0.1:0"}
            s.global_ = global_
            s.config_path.write_text(s.render(lst, {"echo": upstream(echo)}))
            started.append(s)
            s.start()
            keepers.append(Keepalived(topo, k, s, workdir))
        harness.wait_until(lambda: topo.holder() == "i1", timeout=30, interval=0.2,
                           what="instance 1 to hold the service address")
        first, second = started
        with Load(topo, to=(LAN_VIP, PORT), source=LAN_CLIENT) as load:
            wait_sessions(load, 20)
            assert set(load.per_instance) == {lan_ip(1)}, load.per_instance
            if how == "healthcheck_fail":
                code, doc = first.admin("POST", "/healthcheck/fail")
                assert code == 200, doc
            else:
                first.signal(signal.SIGTERM)
            harness.wait_until(lambda: topo.holder() == "i2", timeout=30, interval=0.1,
                               what="the backup to take the service address")
            wait_sessions(load, 4)  # the sessions under way meanwhile have ended
            before = load.per_instance.get(lan_ip(2), 0)
            wait_sessions(load, 20)
            assert load.per_instance.get(lan_ip(2), 0) >= before + 20, load.per_instance
            if how == "sigterm_shutdown_delay":
                first.log.wait_for(r"shutdown_delay over: graceful stop begins", timeout=30)
                assert first.wait_exit(timeout=harness.EVENT_TIMEOUT) == 0
            wait_sessions(load, 10)
        assert load.refused == 0, f"{load.refused} client(s) refused: {load.failures[:5]}"
        # A session under way at the moment the address moved has its
        # packets arrive at the backup, which resets it (docs/scale-out.md):
        # VRRP moves an address, not connections. Short sessions make that rare.
        print(f"\nVRRP {how}: {load.ok} sessions whole, {load.refused} refused, "
              f"{len(load.failures)} reset in flight; per instance: {load.per_instance}")
        assert not [f for f in load.failures if f.startswith(f"via {lan_ip(2)}:")], load.failures
    finally:
        for kp in keepers:
            kp.stop()
        try:
            stop_instances(started)
        finally:
            problems = topo.destroy()
            assert not problems, problems
