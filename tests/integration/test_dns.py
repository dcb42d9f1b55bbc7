"""Servers from DNS (docs/discovery.md), against a real DNS server.

dnsmasq, started by each test on a free loopback port, answers for the
"test" domain from a hosts directory it re-reads as files change, and
from --srv-host records (changed by restarting it on the same port). A
small responder written here answers what dnsmasq will not on demand:
SERVFAIL, REFUSED, truncated UDP answers, and the same addresses in
another order each time.

Every case holds a session open through the change and checks that its
bytes still flow, and that sluice's descriptors do not grow with queries.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

import harness
from harness import listener

pytestmark = pytest.mark.skipif(shutil.which("dnsmasq") is None, reason="dnsmasq (dnsmasq-base) is not installed")



# --------------------------------------------------------------------------
# peers
# --------------------------------------------------------------------------

def free_udp_tcp_port(host: str = "127.0.0.1") -> int:
    """A port free for both UDP and TCP on `host` (a DNS server needs both)."""
    for _ in range(50):
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.bind((host, 0))
        port = u.getsockname()[1]
        t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            t.bind((host, port))
        except OSError:
            continue
        finally:
            t.close()
            u.close()
        return port
    raise AssertionError("no port free for both UDP and TCP")


class Dnsmasq:
    """dnsmasq answering for *.test from a hosts directory and --srv-host records."""

    def __init__(self, workdir: Path, srv: list[str] | None = None, local: bool = True):
        self.workdir = workdir
        # Without --local=/test/, dnsmasq (with no upstream server) answers
        # REFUSED for what its hosts do not have: AAAA of an IPv4-only name.
        self.local = local
        self.hostsdir = workdir / "dns-hosts"
        self.hostsdir.mkdir(exist_ok=True)
        self.port = free_udp_tcp_port()
        self.srv = list(srv or [])
        self.proc: subprocess.Popen | None = None
        self.log: harness.LineLog | None = None
        self.serial = 0

    def start(self) -> "Dnsmasq":
        args = ["dnsmasq", "--no-daemon", f"--port={self.port}", "--listen-address=127.0.0.1",
                "--bind-interfaces", "--no-resolv", "--no-hosts", f"--hostsdir={self.hostsdir}",
                *(["--local=/test/"] if self.local else []), "--local-ttl=1", "--log-queries", "--log-facility=-",
                "--pid-file=", "--conf-file=/dev/null", "--user=root", "--group=root", "--cache-size=0"]
        args += [f"--srv-host={s}" for s in self.srv]
        # A restart needs the same port, and while it was free another
        # process may have bound it for a moment (a resolver's query from a
        # random UDP port, in a test running beside this one): try again
        # for a bounded time.
        deadline = time.monotonic() + harness.START_TIMEOUT
        while True:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT)
            self.log = harness.LineLog(self.proc.stdout)
            try:
                self.log.wait_for(r"started, version", timeout=harness.START_TIMEOUT)
                return self
            except harness.Timeout as e:
                if "Address already in use" not in str(e) or time.monotonic() > deadline:
                    raise
            self.proc.wait(timeout=5)
            self.log.join()
            time.sleep(0.2)

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.log:
            self.log.join()
        self.proc = None

    def restart(self, srv: list[str] | None = None):
        """dnsmasq reads --srv-host only at start: a new SRV set is a restart."""
        if srv is not None:
            self.srv = list(srv)
        self.stop()
        self.start()

    def set_hosts(self, lines: list[str]):
        """Replaces the hosts file; dnsmasq sees the rename into its directory."""
        self.serial += 1
        tmp = self.workdir / f"hosts.{self.serial}"
        tmp.write_text("".join(l + "\n" for l in lines))
        os.replace(tmp, self.hostsdir / "names")
        self.log.wait_for(r"read .*names", count=self.serial, timeout=harness.EVENT_TIMEOUT)

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"


def _qname(msg: bytes, off: int) -> tuple[str, int]:
    labels = []
    while msg[off] != 0:
        n = msg[off]
        labels.append(msg[off + 1:off + 1 + n].decode())
        off += 1 + n
    return ".".join(labels).lower(), off + 1


class TinyDns:
    """A DNS responder on UDP and TCP: A answers from `names`, or a fixed rcode.

    mode "ok": answers; "servfail" / "refused": that rcode; "truncate": UDP
    answers carry TC and no records (TCP ones are whole). shuffle: another
    order of the same addresses in every answer.
    """

    def __init__(self):
        self.port = free_udp_tcp_port()
        self.names: dict[str, list[str]] = {}
        self.mode = "ok"
        self.shuffle = False
        self.ttl = 1
        self.udp_queries = 0
        self.tcp_queries = 0
        self.orders: list[tuple[str, ...]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", self.port))
        self.udp.settimeout(0.1)
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind(("127.0.0.1", self.port))
        self.tcp.listen(16)
        self.tcp.settimeout(0.1)
        self.threads = [threading.Thread(target=self._serve_udp, daemon=True),
                        threading.Thread(target=self._serve_tcp, daemon=True)]
        for t in self.threads:
            t.start()

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"

    def answer(self, query: bytes, tcp: bool) -> bytes:
        qid, flags = struct.unpack(">HH", query[:4])
        name, off = _qname(query, 12)
        qtype, = struct.unpack(">H", query[off:off + 2])
        question = query[12:off + 4]
        with self._lock:
            mode = self.mode
            ips = list(self.names.get(name, []))
            if self.shuffle:
                random.shuffle(ips)
            if tcp:
                self.tcp_queries += 1
            else:
                self.udp_queries += 1
        rflags = 0x8000 | (flags & 0x0100) | 0x0080 | 0x0400  # QR, RD copied, RA, AA
        if mode in ("servfail", "refused"):
            rcode = 2 if mode == "servfail" else 5
            return struct.pack(">HHHHHH", qid, rflags | rcode, 1, 0, 0, 0) + question
        if name not in self.names:
            return struct.pack(">HHHHHH", qid, rflags | 3, 1, 0, 0, 0) + question
        if qtype != 1:
            return struct.pack(">HHHHHH", qid, rflags, 1, 0, 0, 0) + question
        if mode == "truncate" and not tcp:
            return struct.pack(">HHHHHH", qid, rflags | 0x0200, 1, 0, 0, 0) + question
        with self._lock:
            if qtype == 1:
                self.orders.append(tuple(ips))
        records = b"".join(struct.pack(">HHHIH", 0xc00c, 1, 1, self.ttl, 4) + socket.inet_aton(ip) for ip in ips)
        return struct.pack(">HHHHHH", qid, rflags, 1, len(ips), 0, 0) + question + records

    def _serve_udp(self):
        while not self._stop.is_set():
            try:
                data, peer = self.udp.recvfrom(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                self.udp.sendto(self.answer(data, tcp=False), peer)
            except OSError:
                pass

    def _serve_tcp(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.tcp.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve_tcp_conn, args=(conn,), daemon=True).start()

    def _serve_tcp_conn(self, conn: socket.socket):
        conn.settimeout(5)
        try:
            while True:
                head = harness.recv_exact(conn, 2)
                n, = struct.unpack(">H", head)
                reply = self.answer(harness.recv_exact(conn, n), tcp=True)
                conn.sendall(struct.pack(">H", len(reply)) + reply)
        except (OSError, AssertionError, EOFError):
            pass
        finally:
            conn.close()

    def stop(self):
        self._stop.set()
        for t in self.threads:
            t.join(2)
        self.udp.close()
        self.tcp.close()


@pytest.fixture
def dnsmasq(tmp_path):
    started: list[Dnsmasq] = []

    def make(hosts: list[str] | None = None, srv: list[str] | None = None, local: bool = True) -> Dnsmasq:
        d = Dnsmasq(tmp_path, srv=srv, local=local)
        (d.hostsdir / "names").write_text("".join(l + "\n" for l in (hosts or [])))
        d.start()
        started.append(d)
        return d

    yield make
    for d in started:
        d.stop()


@pytest.fixture
def tinydns():
    started: list[TinyDns] = []

    def make() -> TinyDns:
        t = TinyDns()
        started.append(t)
        return t

    yield make
    for t in started:
        t.stop()


# --------------------------------------------------------------------------
# sluice with [resolver] and [admin]
# --------------------------------------------------------------------------

class DnsSluice(harness.AdminClient):
    def metrics(self) -> str:
        return self.get("/metrics")

    def metric(self, name: str, **labels) -> float:
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        rx = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "") + r" (\S+)$"
        for line in self.metrics().splitlines():
            m = re.match(rx, line)
            if m:
                return float(m.group(1))
        raise AssertionError(f"no sample {name}{{{want}}}")

    def servers(self, upstream: str = "up") -> list[dict]:
        for u in self.status()["upstreams"]:
            if u["name"] == upstream:
                return u["servers"]
        raise AssertionError(f"no upstream {upstream}")

    def addresses(self, upstream: str = "up") -> list[str]:
        return [s["address"] for s in self.servers(upstream)]

    def entry(self, name: str) -> dict:
        for e in self.status()["discovery"]["entries"]:
            if e["name"] == name:
                return e
        raise AssertionError(f"no discovery entry for {name}")

    def wait_addresses(self, want: list[str], upstream: str = "up", timeout: float = 15.0) -> None:
        try:
            harness.wait_until(lambda: sorted(self.addresses(upstream)) == sorted(want), timeout=timeout,
                               what=f"servers {want}")
        except harness.Timeout as e:
            raise harness.Timeout(f"{e}; have {self.addresses(upstream)}\n{self.s.log.text()}") from None

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.s.pid}/fd"))


def render(nameserver: str, servers: list[dict], resolver: dict | None = None, balance: str | None = None,
           global_: dict | None = None, access_log: Path | None = None) -> str:
    g = {"workers": 1, "shutdown_timeout": "2s", "access_log": str(access_log) if access_log else "off"}
    g.update(global_ or {})
    up = {"servers": servers}
    if balance:
        up["balance"] = balance
    text = harness.render_config(g, [listener(tries=1)], {"up": up})
    r = {"nameservers": [nameserver], "valid": "1s", "hold": "1s", "timeout": "500ms", "attempts": 2}
    r.update(resolver or {})
    text += "\n[resolver]\n" + "".join(f"{k} = {harness._toml_value(v)}\n" for k, v in r.items())
    text += '\n[admin]\nlisten = "127.0.0.1:0"\n'
    return text


@pytest.fixture
def dns_sluice(tmp_path):
    started: list[harness.Sluice] = []

    def make(text: str, name: str = "sluice") -> DnsSluice:
        s = harness.Sluice(tmp_path, text, ["main"], name=name, access_log=tmp_path / f"{name}.access.log")
        started.append(s)
        s.start()
        return DnsSluice(s)

    yield make
    from fixtures import stop_all_cleanly
    stop_all_cleanly(started)


def two_backends(backends, hosts: list[str]):
    """Banner backends on the same port of each loopback address in `hosts`."""
    for _ in range(20):
        first = backends(harness.banner_handler, name=f"{hosts[0]}", host=hosts[0])
        out = [first]
        try:
            for h in hosts[1:]:
                out.append(backends(harness.banner_handler, name=h, host=h, port=first.port))
        except OSError:
            continue
        return first.port, out
    raise AssertionError("no port free on every address")


def held_session(d: DnsSluice, expect_prefix: str | None = None) -> tuple[socket.socket, str]:
    """A session through sluice; returns it and the backend that answered."""
    c = d.s.connect()
    name = harness.recv_line(c).decode().strip()
    if expect_prefix is not None:
        assert name.startswith(expect_prefix), name
    c.sendall(b"before")
    assert harness.recv_exact(c, 6) == b"before"
    return c, name


def still_flows(c: socket.socket, payload: bytes = b"after the change") -> None:
    c.sendall(payload)
    assert harness.recv_exact(c, len(payload)) == payload
    c.close()


def backend_of_new_session(d: DnsSluice) -> str:
    c = d.s.connect()
    try:
        return harness.recv_line(c).decode().strip()
    finally:
        c.close()


# --------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------

def test_a_record_that_changes(dnsmasq, dns_sluice, backends):
    port, _ = two_backends(backends, ["127.0.0.2", "127.0.0.3"])
    dns = dnsmasq(hosts=["127.0.0.2 db.test"])
    d = dns_sluice(render(dns.nameserver, [{"address": f"db.test:{port}", "resolve": True, "weight": 3}]))
    # The first answer is in the first Snapshot: sluice waited for it.
    assert d.addresses() == [f"127.0.0.2:{port}"]
    server = d.servers()[0]
    assert server["from"] == "db.test" and server["weight"] == 3
    session, name = held_session(d)
    assert name == "127.0.0.2"
    fds = d.fds()

    dns.set_hosts(["127.0.0.3 db.test"])
    d.wait_addresses([f"127.0.0.3:{port}"])
    assert backend_of_new_session(d) == "127.0.0.3"
    still_flows(session)
    entry = d.entry("db.test")
    assert entry["addresses"] == [f"127.0.0.3:{port}"] and entry["type"] == "A/AAAA"
    assert entry["last_error"] == "" and entry["next_refresh_ms"] > entry["last_answer_ms"] > 0
    assert d.metric("sluice_dns_changes_total") >= 1
    assert d.metric("sluice_upstream_servers", upstream="up") == 1
    # Refreshes every second: no descriptor more after several of them.
    queries = d.metric("sluice_dns_queries_total")
    harness.wait_until(lambda: d.metric("sluice_dns_queries_total") >= queries + 6, timeout=15)
    assert d.fds() <= fds


def test_several_addresses(dnsmasq, dns_sluice, backends):
    hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    port, _ = two_backends(backends, hosts)
    dns = dnsmasq(hosts=[f"{h} db.test" for h in hosts])
    d = dns_sluice(render(dns.nameserver, [{"address": f"db.test:{port}", "resolve": True}], balance="round_robin"))
    assert d.addresses() == [f"{h}:{port}" for h in hosts]
    session, first = held_session(d)
    seen = {backend_of_new_session(d) for _ in range(6)}
    assert seen == set(hosts)
    # One address leaves: the others stay as they were (same state objects).
    before = {s["address"]: s["total_sessions"] for s in d.servers()}
    dns.set_hosts([f"{h} db.test" for h in hosts if h != first])
    d.wait_addresses([f"{h}:{port}" for h in hosts if h != first])
    after = {s["address"]: s["total_sessions"] for s in d.servers()}
    for a, n in after.items():
        assert n >= before[a]
    still_flows(session)


def test_srv_set_that_changes(dnsmasq, dns_sluice, backends):
    a = backends(harness.banner_handler, name="a", host="127.0.0.2")
    b = backends(harness.banner_handler, name="b", host="127.0.0.3")
    c = backends(harness.banner_handler, name="c", host="127.0.0.4")
    hosts = ["127.0.0.2 a.test", "127.0.0.3 b.test", "127.0.0.4 c.test"]
    srv = "_pg._tcp.svc.test"
    dns = dnsmasq(hosts=hosts, srv=[f"{srv},a.test,{a.port},0,5", f"{srv},b.test,{b.port},0,0",
                                    f"{srv},c.test,{c.port},1,2000"])
    d = dns_sluice(render(dns.nameserver, [{"service": srv}]))
    servers = {s["address"]: s for s in d.servers()}
    assert sorted(servers) == sorted([f"127.0.0.2:{a.port}", f"127.0.0.3:{b.port}", f"127.0.0.4:{c.port}"])
    assert servers[f"127.0.0.2:{a.port}"]["weight"] == 5 and not servers[f"127.0.0.2:{a.port}"]["backup"]
    assert servers[f"127.0.0.3:{b.port}"]["weight"] == 1  # SRV weight 0
    assert servers[f"127.0.0.4:{c.port}"]["backup"] and servers[f"127.0.0.4:{c.port}"]["weight"] == 1000
    assert all(s["from"] == srv for s in servers.values())
    session, name = held_session(d)
    assert name in ("a", "b")
    gone = a if name == "a" else b
    stays = b if name == "a" else a
    stays_name = "b" if name == "a" else "a"
    # The server in use leaves the SRV set; c becomes a primary.
    dns.restart(srv=[f"{srv},{stays_name}.test,{stays.port},0,7", f"{srv},c.test,{c.port},0,1"])
    d.wait_addresses([f"{stays.host}:{stays.port}", f"127.0.0.4:{c.port}"])
    servers = {s["address"]: s for s in d.servers()}
    assert servers[f"{stays.host}:{stays.port}"]["weight"] == 7
    assert not servers[f"127.0.0.4:{c.port}"]["backup"]
    assert gone.counts()[1] == 1  # the removed server's session is still open
    still_flows(session)


def test_dns_server_gone_keeps_the_last_answer(dnsmasq, dns_sluice, backends):
    port, _ = two_backends(backends, ["127.0.0.2"])
    dns = dnsmasq(hosts=["127.0.0.2 db.test"])
    d = dns_sluice(render(dns.nameserver, [{"address": f"db.test:{port}", "resolve": True}]))
    session, _ = held_session(d)
    dns.stop()
    harness.wait_until(lambda: d.entry("db.test")["last_error"] != "", timeout=15, what="a failed query")
    errors_before = d.status()["discovery"]["errors"]
    harness.wait_until(lambda: sum(d.status()["discovery"]["errors"].values()) >= sum(errors_before.values()) + 4,
                       timeout=20, what="more failed queries")
    # Still the same server, still reachable; one warning per name for the whole episode.
    assert d.addresses() == [f"127.0.0.2:{port}"]
    assert backend_of_new_session(d) == "127.0.0.2"
    assert len(d.s.log.matches(r"query for A db\.test failed")) == 1
    still_flows(session)
    dns.start()
    d.s.log.wait_for(r"DNS: A db\.test answers again", timeout=15)
    assert d.addresses() == [f"127.0.0.2:{port}"]


@pytest.mark.parametrize("mode,kind", [("servfail", "servfail"), ("refused", "refused")])
def test_servfail_and_refused_keep_the_last_answer(tinydns, dns_sluice, backends, mode, kind):
    port, _ = two_backends(backends, ["127.0.0.2"])
    dns = tinydns()
    dns.names["db.test"] = ["127.0.0.2"]
    d = dns_sluice(render(dns.nameserver, [{"address": f"db.test:{port}", "resolve": True}]))
    assert d.addresses() == [f"127.0.0.2:{port}"]
    session, _ = held_session(d)
    dns.mode = mode
    harness.wait_until(lambda: d.metric("sluice_dns_errors_total", kind=kind) >= 3, timeout=20,
                       what=f"{kind} counted")
    assert d.addresses() == [f"127.0.0.2:{port}"]
    assert kind in d.entry("db.test")["last_error"]
    assert backend_of_new_session(d) == "127.0.0.2"
    still_flows(session)


def test_nxdomain_holds_then_removes(dnsmasq, dns_sluice, backends):
    port, _ = two_backends(backends, ["127.0.0.2", "127.0.0.3"])
    dns = dnsmasq(hosts=["127.0.0.2 db.test", "127.0.0.3 other.test"])
    d = dns_sluice(render(dns.nameserver, [{"address": f"db.test:{port}", "resolve": True},
                                           {"address": f"other.test:{port}", "resolve": True}],
                          resolver={"hold": "4s"}))
    session, name = held_session(d)
    assert d.addresses() == [f"127.0.0.2:{port}", f"127.0.0.3:{port}"]
    removed_at = time.monotonic()
    dns.set_hosts(["127.0.0.3 other.test"])
    # Held first: NXDOMAIN seen, the server still there.
    harness.wait_until(lambda: d.entry("db.test")["held"] == [f"127.0.0.2:{port}"], timeout=10, what="held")
    assert d.entry("db.test")["last_error"].endswith("NXDOMAIN")
    assert f"127.0.0.2:{port}" in d.addresses()
    d.wait_addresses([f"127.0.0.3:{port}"])
    assert time.monotonic() - removed_at >= 3.5  # not before hold
    assert d.metric("sluice_dns_errors_total", kind="nxdomain") >= 1
    still_flows(session)
    # Back in DNS: back as a server.
    dns.set_hosts(["127.0.0.2 db.test", "127.0.0.3 other.test"])
    d.wait_addresses([f"127.0.0.2:{port}", f"127.0.0.3:{port}"])


def test_truncated_answer_falls_back_to_tcp(tinydns, dns_sluice, backends):
    port, _ = two_backends(backends, ["127.0.0.2"])
    dns = tinydns()
    dns.mode = "truncate"
    dns.names["db.test"] = ["127.0.0.2", "127.0.0.5"]
    d = dns_sluice(render(dns.nameserver, [{"address": f"db.test:{port}", "resolve": True}]))
    assert d.addresses() == [f"127.0.0.2:{port}", f"127.0.0.5:{port}"]
    assert dns.udp_queries >= 1 and dns.tcp_queries >= 1


def test_many_addresses_from_dnsmasq_come_over_tcp(dnsmasq, dns_sluice, backends):
    """100 A records do not fit a 512-byte UDP answer: dnsmasq truncates it."""
    port, _ = two_backends(backends, ["127.0.0.2"])
    ips = [f"127.0.1.{i}" for i in range(1, 101)]
    dns = dnsmasq(hosts=[f"{ip} many.test" for ip in ips])
    d = dns_sluice(render(dns.nameserver, [{"address": f"many.test:{port}", "resolve": True}]))
    assert len(d.addresses()) == 100


def test_thousand_addresses(dnsmasq, dns_sluice, backends):
    primary = backends(harness.banner_handler, name="primary", host="127.0.0.1")
    ips = [f"127.0.{2 + i // 250}.{1 + i % 250}" for i in range(1000)]
    dns = dnsmasq(hosts=[f"{ip} big.test" for ip in ips])
    d = dns_sluice(render(dns.nameserver, [{"address": primary.address},
                                           {"address": "big.test:9", "resolve": True, "backup": True}]))
    assert len(d.addresses()) == 1001
    assert d.metric("sluice_upstream_servers", upstream="up") == 1001
    session, name = held_session(d)
    assert name == "primary"
    fds = d.fds()
    dns.set_hosts([f"{ip} big.test" for ip in ips[:500]])
    harness.wait_until(lambda: len(d.addresses()) == 501, timeout=20, what="500 addresses left")
    dns.set_hosts([f"{ip} big.test" for ip in ips])
    harness.wait_until(lambda: len(d.addresses()) == 1001, timeout=20, what="1000 addresses back")
    still_flows(session)
    assert d.fds() <= fds + 1


def test_answer_order_never_matters(tinydns, dns_sluice, backends):
    port, _ = two_backends(backends, ["127.0.0.2"])
    dns = tinydns()
    dns.shuffle = True
    dns.names["db.test"] = [f"127.0.0.{i}" for i in range(2, 12)]
    d = dns_sluice(render(dns.nameserver, [{"address": f"db.test:{port}", "resolve": True}]))
    want = sorted(f"127.0.0.{i}:{port}" for i in range(2, 12))
    assert d.addresses() == want  # sorted, whatever the order of the answer
    changes = d.metric("sluice_dns_changes_total")
    harness.wait_until(lambda: len(set(dns.orders)) >= 4, timeout=20, what="answers in several orders")
    assert d.addresses() == want
    assert d.metric("sluice_dns_changes_total") == changes  # nothing rebuilt


def test_name_that_does_not_resolve_at_start(dnsmasq, dns_sluice, backends, tmp_path):
    port, _ = two_backends(backends, ["127.0.0.2"])
    dns = dnsmasq(hosts=[])
    text = render(dns.nameserver, [{"address": f"late.test:{port}", "resolve": True}])
    cfg = tmp_path / "check.toml"
    cfg.write_text(text)
    r = harness.run_check(cfg)
    assert r.returncode == 0, r.stderr
    assert b"warning" in r.stderr and b"late.test" in r.stderr and b"NXDOMAIN" in r.stderr
    d = dns_sluice(text)
    assert d.addresses() == []
    c = d.s.connect()
    assert harness.wait_closed(c) in ("eof", "reset")
    dns.set_hosts(["127.0.0.2 late.test"])
    d.wait_addresses([f"127.0.0.2:{port}"])
    session, name = held_session(d)
    assert name == "127.0.0.2"
    still_flows(session)


def test_reload_keeps_discovered_servers_and_their_state(dnsmasq, dns_sluice, backends):
    port, _ = two_backends(backends, ["127.0.0.2"])
    dns = dnsmasq(hosts=["127.0.0.2 db.test"])
    text = render(dns.nameserver, [{"address": f"db.test:{port}", "resolve": True}])
    d = dns_sluice(text)
    session, _ = held_session(d)
    assert d.servers()[0]["active"] == 1
    d.s.reload(text.replace('hold = "1s"', 'hold = "2s"'))
    # The same server (same state object: its live session still counted).
    assert d.addresses() == [f"127.0.0.2:{port}"]
    assert d.servers()[0]["active"] == 1
    still_flows(session)


# --------------------------------------------------------------------------
# address families, answers that change, and what one answer may bring
# --------------------------------------------------------------------------

def queries(dns: Dnsmasq, qtype: str, name: str) -> int:
    return len(dns.log.matches(rf"query\[{qtype}\] {re.escape(name)} from"))


def test_refused_aaaa_while_a_answers_is_no_alarm(dnsmasq, dns_sluice, backends):
    """dnsmasq with IPv4 names and no upstream answers AAAA with REFUSED:
    the servers come from A, the log says so once at info, and the error is
    counted once for the episode, not at every retry."""
    port, _ = two_backends(backends, ["127.0.0.2", "127.0.0.3"])
    dns = dnsmasq(hosts=["127.0.0.2 db.test", "127.0.0.3 db.test"], local=False)
    d = dns_sluice(render(dns.nameserver, [{"address": f"db.test:{port}", "resolve": True}]))
    assert d.addresses() == [f"127.0.0.2:{port}", f"127.0.0.3:{port}"]
    # Several refused AAAA queries (retries), then look.
    harness.wait_until(lambda: queries(dns, "AAAA", "db.test") >= 4, timeout=20, what="AAAA asked again")
    assert d.metric("sluice_dns_errors_total", kind="refused") == 1
    log = d.s.log
    assert log.matches(r"\[info\].*query for AAAA db\.test failed \(refused\) while A db\.test answers"), log.text()
    assert not log.matches(r"\[warn.*DNS"), log.text()
    assert not log.matches(r"no server from it"), log.text()
    assert "AAAA db.test: refused" in d.entry("db.test")["last_error"]
    assert backend_of_new_session(d) in ("127.0.0.2", "127.0.0.3")


@pytest.mark.parametrize("where", ["entry", "resolver"])
def test_family_ipv4_sends_no_aaaa_query(dnsmasq, dns_sluice, backends, where):
    port, _ = two_backends(backends, ["127.0.0.2"])
    dns = dnsmasq(hosts=["127.0.0.2 db.test"], srv=[f"_pg._tcp.svc.test,db.test,{port},0,1"], local=False)
    entries = [{"address": f"db.test:{port}", "resolve": True}, {"service": "_pg._tcp.svc.test"}]
    resolver = {}
    if where == "entry":
        for e in entries:
            e["family"] = "ipv4"
    else:
        resolver["family"] = "ipv4"
    d = dns_sluice(render(dns.nameserver, entries, resolver=resolver))
    assert d.addresses() == [f"127.0.0.2:{port}"]
    # Asked again and again (valid = 1s), A only.
    harness.wait_until(lambda: queries(dns, "A", "db.test") >= 4, timeout=20, what="A asked again")
    assert queries(dns, "SRV", "_pg._tcp.svc.test") >= 2
    assert queries(dns, "AAAA", "db.test") == 0
    assert d.status()["discovery"]["errors"].get("refused", 0) == 0
    assert d.entry("db.test")["type"] == "A" and d.entry("db.test")["last_error"] == ""


def test_family_ipv6_takes_only_aaaa(tinydns, dns_sluice, backends):
    port, _ = two_backends(backends, ["127.0.0.2"])
    dns = tinydns()
    dns.names["db.test"] = ["127.0.0.2"]
    d = dns_sluice(render(dns.nameserver, [{"address": f"db.test:{port}", "resolve": True, "family": "ipv6"}]))
    # TinyDns has no AAAA for it: no server, and no A query made.
    assert d.addresses() == []
    assert dns.orders == []  # A answers are recorded: none was asked
    assert d.entry("db.test")["type"] == "AAAA"


def test_a_changed_srv_answer_logs_what_changed(dnsmasq, dns_sluice, backends):
    a = backends(harness.banner_handler, name="a", host="127.0.0.12")
    b = backends(harness.banner_handler, name="b", host="127.0.0.13")
    hosts = ["127.0.0.12 a.test", "127.0.0.13 b.test"]
    dns = dnsmasq(hosts=hosts, srv=[f"web.test,a.test,{a.port},0,5", f"web.test,b.test,{b.port},0,1"])
    d = dns_sluice(render(dns.nameserver, [{"service": "web.test"}]))
    assert sorted(d.addresses()) == sorted([f"127.0.0.12:{a.port}", f"127.0.0.13:{b.port}"])
    log = d.s.log
    assert log.matches(rf'DNS: upstream "up" web\.test: 127\.0\.0\.12:{a.port} added \(weight 5, priority 0\)')
    session, _ = held_session(d)
    dns.restart(srv=[f"web.test,a.test,{a.port},0,30", f"web.test,b.test,{b.port},1,1"])
    log.wait_for(rf"web\.test: 127\.0\.0\.12:{a.port} weight 5 -> 30", timeout=15)
    log.wait_for(rf"web\.test: 127\.0\.0\.13:{b.port} priority 0 -> 1 \(now a backup\)", timeout=15)
    servers = {x["address"]: x for x in d.servers()}
    assert servers[f"127.0.0.12:{a.port}"]["weight"] == 30 and servers[f"127.0.0.13:{b.port}"]["backup"]
    # A server leaving SRV is held, then removed, and the log says both.
    dns.restart(srv=[f"web.test,a.test,{a.port},0,30"])
    log.wait_for(rf"web\.test: 127\.0\.0\.13:{b.port} no longer in DNS: kept for hold 1s", timeout=15)
    log.wait_for(rf"web\.test: 127\.0\.0\.13:{b.port} removed", timeout=15)
    d.wait_addresses([f"127.0.0.12:{a.port}"])
    still_flows(session)


def test_max_targets_and_max_addresses_bound_an_answer(dnsmasq, dns_sluice, backends):
    be = backends(harness.banner_handler, name="t", host="127.0.0.2")
    hosts = [f"127.0.0.2 t{i}.test" for i in range(6)] + [f"127.0.3.{i} many.test" for i in range(1, 11)]
    srv = [f"_big._tcp.test,t{i}.test,{be.port},0,{10 - i}" for i in range(6)]
    dns = dnsmasq(hosts=hosts, srv=srv)
    d = dns_sluice(render(dns.nameserver, [{"service": "_big._tcp.test"},
                                           {"address": f"many.test:{be.port}", "resolve": True}],
                          resolver={"max_targets": 3, "max_addresses": 4}))
    log = d.s.log
    log.wait_for(r"\[warn.*DNS: SRV _big\._tcp\.test gives 6 records, more than max_targets = 3: 3 dropped",
                 timeout=15)
    log.wait_for(r"\[warn.*DNS: A many\.test gives 10 addresses, more than max_addresses = 4: 6 dropped",
                 timeout=15)
    # The SRV targets all resolve to one address: one server from them.
    assert d.entry("_big._tcp.test")["addresses"] == [f"127.0.0.2:{be.port}"]
    # The first four in sorted order (as text), whatever the order of the answer.
    assert sorted(d.entry("many.test")["addresses"]) == sorted(f"127.0.3.{i}:{be.port}" for i in (1, 10, 2, 3))
    # The three targets kept are those of the largest weights; the others are not even asked for.
    assert queries(dns, "A", "t0.test") >= 1 and queries(dns, "A", "t2.test") >= 1
    assert queries(dns, "A", "t3.test") == 0 and queries(dns, "A", "t5.test") == 0
    # Warned once, however often the names are asked again.
    harness.wait_until(lambda: queries(dns, "A", "many.test") >= 3, timeout=20, what="many.test asked again")
    assert len(log.matches(r"more than max_addresses")) == 1
    assert len(log.matches(r"more than max_targets")) == 1
