"""Several sluice instances acting as one service (docs/scale-out.md).

On loopback (always runs):
- `hash` agrees across instances with no coordination, and agrees again
  once every instance's active check has seen a server go down (until then
  they may disagree for about one check interval: measured and printed);
- `least_conn` is per instance: one instance does not see another's load.

In network namespaces the test creates (skipped, with the reason, where
they cannot be made): a client, a router, three instances and the servers,
joined by veth pairs with 10.0.x addresses that exist only inside those
namespaces. The router sends the service address (held by every instance)
through the kernel's ECMP with a resilient nexthop group, as a BGP or
anycast front tier would; the test plays that front tier's controller,
acting on each instance's GET /ready. Shown:
- hashed keys reach the same server through any instance;
- taking one instance out (POST /healthcheck/fail, or SIGTERM with
  shutdown_delay) refuses no client and loses no byte;
- killing one loses only its own sessions: the others' bytes arrive whole.

Every loop is bounded, and traffic goes only to addresses inside the
test's namespaces or to loopback."""

from __future__ import annotations

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
import threading
import time
from concurrent.futures import ThreadPoolExecutor

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
    # A resilient nexthop group (Linux 5.13) on a veth pair between two namespaces.
    tag = f"slmi-probe-{os.getpid()}"
    made = []
    try:
        for n in ("a", "b"):
            netns.run("ip", "netns", "add", f"{tag}{n}")
            made.append(f"{tag}{n}")
        netns.run("ip", "-n", f"{tag}a", "link", "add", "p0", "type", "veth", "peer", "name", "p1",
                  "netns", f"{tag}b")
        netns.run("ip", "-n", f"{tag}a", "link", "set", "p0", "up")
        netns.run("ip", "-n", f"{tag}b", "link", "set", "p1", "up")
        netns.run("ip", "-n", f"{tag}a", "addr", "add", "10.0.1.1/24", "dev", "p0")
        netns.run("ip", "-n", f"{tag}a", "nexthop", "add", "id", "1", "via", "10.0.1.2", "dev", "p0")
        netns.run("ip", "-n", f"{tag}a", "nexthop", "add", "id", "2", "group", "1", "type", "resilient",
                  "buckets", "8")
    except (netns.NetnsError, OSError, subprocess.TimeoutExpired) as e:
        return f"resilient nexthop groups (ip nexthop ... type resilient) do not work here: {e}"
    finally:
        for n in made:
            subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=netns.COMMAND_TIMEOUT)
    return None


NETNS_REASON = _unavailable()
needs_netns = pytest.mark.skipif(NETNS_REASON is not None, reason=NETNS_REASON or "")

VIP = "10.0.100.1"          # the service address every instance holds
PORT = 7000                 # the service port (inside the test's own namespaces)
HASH_PORT = 7001
GROUP = 100                 # the router's resilient nexthop group
BUCKETS = 32
SERVERS_IP = "10.0.9.2"
CLIENT_IP = "10.0.0.2"
KEY_IPS = [f"10.0.0.{i}" for i in range(10, 40)]   # more client addresses: hash keys
_ids = itertools.count(1)


def instance_ip(k: int) -> str:
    return f"10.0.{k}.2"


class Topology:
    """client -- router ==ECMP==> instance 1..n; router -- servers."""

    def __init__(self, n: int):
        tag = f"{os.getpid()}-{next(_ids)}"
        self.n = n
        self.ns = {role: f"sluice-mi-{tag}-{role}" for role in ["c", "r", "s"] + [f"i{k}" for k in range(1, n + 1)]}
        self.made: list[str] = []
        self.in_group = list(range(1, n + 1))

    def ip(self, role: str, *argv: str) -> None:
        netns.run("ip", "-n", self.ns[role], *argv)

    def sysctl(self, role: str, *settings: str) -> None:
        netns.run("ip", "netns", "exec", self.ns[role], "sysctl", "-q", "-w", *settings)

    def link(self, a: str, a_if: str, a_addr: str, b: str, b_if: str, b_addr: str) -> None:
        self.ip(a, "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", self.ns[b])
        for role, ifname, addr in ((a, a_if, a_addr), (b, b_if, b_addr)):
            self.ip(role, "addr", "add", addr, "dev", ifname)
            self.ip(role, "link", "set", ifname, "up")

    def create(self) -> "Topology":
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
            self.ip("r", "nexthop", "add", "id", str(k), "via", instance_ip(k), "dev", f"ri{k}")
        self.set_group({k: 1 for k in self.in_group}, add=True)
        self.ip("r", "route", "add", f"{VIP}/32", "nhid", str(GROUP))
        return self

    def set_group(self, weights: dict[int, int], add: bool = False) -> None:
        """The group's members and weights. A member whose weight drops keeps
        the buckets that carry traffic until they are idle for a second; a
        member taken out loses its buckets at once; either way the others
        keep theirs (that is what `resilient` buys)."""
        group = "/".join(f"{k},{w}" for k, w in sorted(weights.items()))
        self.ip("r", "nexthop", "add" if add else "replace", "id", str(GROUP), "group", group,
                "type", "resilient", "buckets", str(BUCKETS), "idle_timer", "1", "unbalanced_timer", "0")
        self.in_group = sorted(weights)

    def buckets_of(self, k: int) -> int:
        res = subprocess.run(["ip", "-n", self.ns["r"], "-j", "nexthop", "bucket", "show", "id", str(GROUP)],
                             capture_output=True, text=True, timeout=netns.COMMAND_TIMEOUT)
        assert res.returncode == 0, res.stderr
        return sum(1 for b in json.loads(res.stdout or "[]") if b["bucket"]["nhid"] == k)

    def entered(self, role: str):
        ns = netns.Namespace.__new__(netns.Namespace)
        ns.name = self.ns[role]
        return ns.entered()

    def destroy(self) -> list[str]:
        problems = []
        for name in self.made:
            res = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True,
                                 timeout=netns.COMMAND_TIMEOUT)
            if res.returncode != 0:
                problems.append(f"ip netns del {name}: {res.stderr.strip()}")
        self.made = []
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
    """make(n) -> (Topology, [NsSluice], servers): n instances behind ECMP."""
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
            s.admin_table = {"listen": "127.0.0.1:0"}
            s.global_ = dict({"shutdown_timeout": "3s"}, **(global_ or {}))
            s.config_path.write_text(s.render(lst, ups))
            started.append(s)
            insts.append(s.start())
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


def take_out(topo: Topology, inst: NsSluice, k: int) -> None:
    """What the front tier does once an instance's /ready says 503: lower its
    weight so that its buckets move as they go idle (sessions in flight keep
    theirs), then, once none is left, take it out of the group."""
    harness.wait_until(lambda: not inst.ready(), what=f"i{k} not ready")
    weights = {m: (1 if m == k else 255) for m in topo.in_group}
    topo.set_group(weights)
    harness.wait_until(lambda: topo.buckets_of(k) == 0, timeout=60, interval=0.2,
                       what=f"the router's buckets to move off i{k}")
    topo.set_group({m: 1 for m in topo.in_group if m != k})


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
    global_ = {"shutdown_delay": "5m"} if how == "sigterm_shutdown_delay" else {}
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
        if how == "healthcheck_fail":
            code, doc = out.admin("POST", "/healthcheck/fail")
            assert code == 200, doc
        else:
            out.signal(signal.SIGTERM)
            out.log.wait_for(r"received SIGTERM: not ready", timeout=5)
        take_out(topo, out, 2)
        wait_sessions(load, 4)  # the sessions under way while it left have ended
        before = dict(load.per_instance)
        wait_sessions(load, 30)
        # Nothing new reaches the instance taken out.
        assert load.per_instance.get(instance_ip(2)) == before.get(instance_ip(2)), load.per_instance
        # Its own long sessions, if any kept their buckets, end on their own;
        # then it stops.
        for c in long:
            c.join(120)
        # With shutdown_delay this is the second SIGTERM: no need to wait out the delay.
        out.signal(signal.SIGTERM)
        assert out.wait_exit(timeout=harness.EVENT_TIMEOUT) == 0
        wait_sessions(load, 20)
    assert not load.failures, f"{len(load.failures)} of {load.count()} sessions failed: {load.failures[:5]}"
    bad = [(c.instance, repr(c.error)) for c in long if not c.whole]
    assert not bad, f"long sessions lost bytes: {bad}"
    print(f"\n{load.ok} short sessions and {len(long)} long ones, all whole; per instance: {load.per_instance}")


@needs_netns
def test_killing_an_instance_loses_only_its_own_sessions(cluster):
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
    victim.proc.kill()
    victim.proc.wait(5)
    # The front tier notices (its probe of /ready gets no answer) and takes
    # the instance out; with a resilient group the others' buckets stay.
    topo.set_group({m: 1 for m in topo.in_group if m != 3})
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
    print(f"\nkilled i3: lost its {len(own)} session(s); {len(others)} on the others arrived whole")


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


class Keepalived:
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
        target = f"/var/run/netns/{topo.ns[f'i{k}']}"

        def enter():
            fd = os.open(target, os.O_RDONLY)
            netns._setns(fd)
            os.close(fd)

        self.proc = subprocess.Popen(
            ["keepalived", "--dont-fork", "--log-console", "--vrrp", "-f", str(conf),
             "-p", str(workdir / "keepalived.pid"), "-r", str(workdir / "vrrp.pid")],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            cwd=workdir, preexec_fn=enter)
        self.log = harness.LineLog(self.proc.stdout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(harness.EVENT_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.join()


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
