"""Redis Sentinel: an upstream whose server is the master three real
redis-sentinel processes name, with a real master and replica behind them.

Every port is picked at run time (bound to 0 and released, since redis needs
it written). Waits have generous deadlines; the failover time is measured
and printed, not asserted."""

from __future__ import annotations

import re
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

import dbpeers
import harness
from dbpeers import RespConn
from harness import listener

REDIS_SENTINEL = shutil.which("redis-sentinel")
MASTER = "mymaster"
FAILOVER_DEADLINE = 60.0  # generous: the sentinels' own work is in it


# --------------------------------------------------------------------------
# redis peers
# --------------------------------------------------------------------------

class SentinelNode(dbpeers.RedisServer):
    """redis-sentinel watching `master_port` as MASTER (quorum 2)."""

    READY = r"\+monitor master " + MASTER

    def __init__(self, workdir: Path, master_port: int):
        self.master_port = master_port
        super().__init__(workdir)

    def _start(self) -> bool:
        conf = self.workdir / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndaemonize no\nlogfile \"\"\ndir {self.workdir}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {self.master_port} 2\n"
            f"sentinel down-after-milliseconds {MASTER} 2000\n"
            f"sentinel failover-timeout {MASTER} 10000\n"
            f"sentinel parallel-syncs {MASTER} 1\n")
        return self._spawn([REDIS_SENTINEL, str(conf)])


def call(port: int, *args: str):
    with RespConn("127.0.0.1", port) as c:
        return c.call(*args)


def info_field(port: int, section: str, field: str) -> str | None:
    text = call(port, "INFO", section).decode()
    m = re.search(rf"^{field}:(\S*)", text, re.M)
    return m.group(1) if m else None


class Cluster:
    """A master, a replica of it, and three sentinels."""

    def __init__(self, root: Path):
        self.master = dbpeers.RedisServer(root / "master")
        self.replica = dbpeers.RedisServer(root / "replica", ["--replicaof", "127.0.0.1", str(self.master.port)])
        self.sentinels = [SentinelNode(root / f"sentinel{i}", self.master.port) for i in range(3)]

    def nodes(self):
        return [self.master, self.replica, *self.sentinels]

    def wait_ready(self):
        """Replication runs and every sentinel knows the replica and the
        other sentinels (so a failover can be done at once)."""
        harness.wait_until(lambda: info_field(self.replica.port, "replication", "master_link_status") == "up",
                           timeout=30, what="replication link up")

        def known() -> bool:
            for s in self.sentinels:
                replicas = call(s.port, "SENTINEL", "REPLICAS", MASTER) or []
                if not any(b"slave" in r and b"s_down" not in b" ".join(r) for r in replicas):
                    return False
                master = call(s.port, "SENTINEL", "MASTER", MASTER)
                fields = dict(zip(master[::2], master[1::2]))
                if int(fields[b"num-other-sentinels"]) < 2:
                    return False
            return True
        harness.wait_until(known, timeout=45, interval=0.2, what="sentinels know the replica and each other")

    def master_port_per(self, sentinel: SentinelNode) -> int:
        return int(call(sentinel.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)[1])

    def stop(self):
        for n in self.nodes():
            n.stop()


@pytest.fixture
def cluster(tmp_path):
    why = dbpeers.redis_missing()
    if why:
        pytest.skip(why)
    if REDIS_SENTINEL is None:
        pytest.skip("redis-sentinel not found")
    c = None
    try:
        c = Cluster(tmp_path / "redis")
        c.wait_ready()
        yield c
    finally:
        if c is not None:
            c.stop()


# --------------------------------------------------------------------------
# sluice
# --------------------------------------------------------------------------

class SentinelSluice(harness.AdminClient):
    def servers(self) -> list[dict]:
        return next(u for u in self.status()["upstreams"] if u["name"] == "up")["servers"]


def render(sentinel: dict, health: dict | None = None, access_log: Path | None = None) -> str:
    g = {"workers": 1, "shutdown_timeout": "2s", "access_log": str(access_log) if access_log else "off"}
    up = {"sentinel": sentinel}
    text = harness.render_config(g, [listener(tries=1)], {"up": up})
    if health:
        text += "\n[upstream.up.health]\n" + "".join(f"{k} = {harness._toml_value(v)}\n" for k, v in health.items())
    text += '\n[admin]\nlisten = "127.0.0.1:0"\n'
    return text


@pytest.fixture
def sentinel_sluice(tmp_path):
    started: list[harness.Sluice] = []

    def make(sentinel: dict, name: str = "sluice") -> SentinelSluice:
        access_log = tmp_path / f"{name}.access.log"
        s = harness.Sluice(tmp_path, render(sentinel, access_log=access_log), ["main"], name=name,
                           access_log=access_log)
        started.append(s)
        s.start()
        return SentinelSluice(s)

    yield make
    from fixtures import stop_all_cleanly
    stop_all_cleanly(started)


def port_through(ss: SentinelSluice) -> int | None:
    """The port of the redis-server a new session through sluice reaches, or
    None when the session is refused or closed."""
    try:
        with RespConn(*ss.s.addr("main"), timeout=2.0) as c:
            return int(c.call("CONFIG", "GET", "port")[1])
    except (AssertionError, OSError):
        return None


class SwitchWatcher:
    """Our own subscription to +switch-master, to time the sentinels' switch."""

    def __init__(self, sentinel_port: int):
        self.conn = RespConn("127.0.0.1", sentinel_port, timeout=FAILOVER_DEADLINE)
        self.conn.call("SUBSCRIBE", "+switch-master")

    def wait(self) -> tuple[float, list[str]]:
        while True:
            msg = self.conn.reply()
            if msg[0] == b"message" and msg[1] == b"+switch-master":
                fields = msg[2].decode().split()
                if fields[0] == MASTER:
                    return time.monotonic(), fields

    def close(self):
        self.conn.close()


def fail_over(cluster: Cluster, ss: SentinelSluice, via: int) -> tuple[float, int]:
    """SENTINEL FAILOVER at sentinel `via`; returns the seconds from the
    sentinels' +switch-master to the first session on the new master, and
    the new master's port."""
    old = cluster.master.port
    watcher = SwitchWatcher(cluster.sentinels[via].port)
    try:
        asked_at = time.monotonic()
        assert call(cluster.sentinels[via].port, "SENTINEL", "FAILOVER", MASTER) == "OK"
        switched_at, fields = watcher.wait()
        print(f"\nthe sentinels announced +switch-master {(switched_at - asked_at) * 1000:.0f} ms after "
              "SENTINEL FAILOVER", end="")
    finally:
        watcher.close()
    new = int(fields[4])
    assert new != old and int(fields[2]) == old, fields
    deadline = time.monotonic() + FAILOVER_DEADLINE
    while True:
        got = port_through(ss)
        if got == new:
            return time.monotonic() - switched_at, new
        assert time.monotonic() < deadline, f"no session reached the new master {new}:\n{ss.s.log.text()}"
        time.sleep(0.01)


def fake_sentinel(reply: bytes):
    """A Backend handler standing in for a sentinel: once asked for the
    master, it sends `reply` (raw RESP bytes)."""
    def handler(backend: harness.Backend, conn: socket.socket):
        got = b""
        while b"get-master-addr-by-name" not in got:
            chunk = conn.recv(4096)
            if not chunk:
                return
            got += chunk
        conn.sendall(reply)
        harness.recv_all(conn)  # until sluice closes it
    return handler


def resp_address(host: str, port: int) -> bytes:
    return b"*2\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(x), x) for x in (host.encode(), str(port).encode()))


# --------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------

def test_failover_is_followed_and_old_master_sessions_close(cluster, sentinel_sluice):
    ss = sentinel_sluice({"addresses": [s.address for s in cluster.sentinels], "master": MASTER})
    old = cluster.master.port
    assert port_through(ss) == old
    servers = ss.servers()
    assert [s["address"] for s in servers] == [cluster.master.address]
    assert servers[0]["from"] == f"sentinel {MASTER}"
    entry = next(e for e in ss.status()["discovery"]["entries"] if e["type"] == "sentinel")
    assert entry["addresses"] == [cluster.master.address] and entry["name"] == MASTER
    assert f'sluice_dns_entry_servers{{upstream="up",name="{MASTER}"}} 1' in ss.get("/metrics").splitlines()
    # Every listed sentinel is followed, not one at a time.
    for sentinel in cluster.sentinels:
        ss.s.log.wait_for(rf"follows the failovers announced at sentinel {re.escape(sentinel.address)}",
                          timeout=harness.EVENT_TIMEOUT)

    # A session on the master, open across the failover.
    held = harness.connect(*ss.s.addr("main"))
    held.sendall(dbpeers.resp_command("PING"))
    assert harness.recv_exact(held, 7) == b"+PONG\r\n"

    took, new = fail_over(cluster, ss, via=0)
    print(f"\nsentinel failover: first session on the new master {took * 1000:.0f} ms after +switch-master")
    assert new == cluster.replica.port

    # The session on the old master is closed, not left writing to a replica.
    harness.wait_closed(held, timeout=FAILOVER_DEADLINE)
    held.close()
    harness.wait_until(lambda: [r for r in ss.s.access_records() if r.get("cause") == "fenced"],
                       what="the old master's session logged as fenced")
    assert [s["address"] for s in ss.servers()] == [cluster.replica.address]
    # Every new session goes to the new master from now on.
    for _ in range(5):
        assert port_through(ss) == new


def test_dead_first_sentinel_is_skipped(cluster, sentinel_sluice):
    dead = f"127.0.0.1:{harness.dead_port()}"
    addresses = [dead] + [s.address for s in cluster.sentinels]
    ss = sentinel_sluice({"addresses": addresses, "master": MASTER})
    assert port_through(ss) == cluster.master.port
    ss.s.log.wait_for(rf"follows the failovers announced at sentinel {re.escape(cluster.sentinels[0].address)}",
                      timeout=harness.EVENT_TIMEOUT)
    # The dead one was tried, counted, and skipped.
    assert ss.status()["discovery"]["errors"].get("sentinel", 0) >= 1
    took, new = fail_over(cluster, ss, via=0)
    print(f"\nsentinel failover (first sentinel dead): first session on the new master {took * 1000:.0f} ms "
          "after +switch-master")
    assert new == cluster.replica.port


def test_subscription_comes_back_after_its_sentinel_restarts(cluster, sentinel_sluice):
    ss = sentinel_sluice({"addresses": [s.address for s in cluster.sentinels], "master": MASTER})
    first = cluster.sentinels[0]
    ss.s.log.wait_for(rf"follows the failovers announced at sentinel {re.escape(first.address)}",
                      timeout=harness.EVENT_TIMEOUT)
    first.stop()
    ss.s.log.wait_for(rf"subscription at sentinel {re.escape(first.address)} ended", timeout=harness.EVENT_TIMEOUT)
    # The other two are a majority of the three: a failover they lead is followed.
    took, new = fail_over(cluster, ss, via=1)
    assert new == cluster.replica.port
    # Its subscription is tried again meanwhile, with backoff.
    assert ss.status()["discovery"]["errors"].get("sentinel", 0) >= 1


def test_a_health_table_must_be_a_redis_primary_check(tmp_path):
    # A [health] table that is not a redis primary check is refused.
    for health, rx in (({"type": "tcp"}, r"needs type = \"redis\""),
                       ({"type": "redis", "role": "replica"}, r"needs role = \"primary\"")):
        cfg = tmp_path / "bad.toml"
        cfg.write_text(render({"addresses": ["127.0.0.1:26379"], "master": MASTER}, health))
        r = harness.run_check(cfg)
        assert r.returncode != 0, r.stdout.decode()
        assert re.search(r"bad\.toml:\d+:\d+: .*" + rx, (r.stdout + r.stderr).decode()), (r.stdout + r.stderr).decode()


@pytest.mark.parametrize("sentinel,rx", [
    ({"addresses": [], "master": MASTER}, r"addresses must list at least one sentinel"),
    ({"master": MASTER}, r"missing required key \"addresses\""),
    ({"addresses": ["127.0.0.1:26379"]}, r"missing required key \"master\""),
    ({"addresses": ["127.0.0.1:26379"], "master": "my master"}, r"master must be the name"),
    ({"addresses": ["127.0.0.1"], "master": MASTER}, r"addresses entry"),
    ({"addresses": ["127.0.0.1:26379", "127.0.0.1:26379"], "master": MASTER}, r"twice"),
    ({"addresses": ["127.0.0.1:26379"], "master": MASTER, "port": 1}, r"port"),
    ({"addresses": ["127.0.0.1:26379"], "master": MASTER, "password_file": "/nonexistent/pw"}, r"password_file"),
])
def test_bad_sentinel_tables(tmp_path, sentinel, rx):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(render(sentinel))
    r = harness.run_check(cfg)
    assert r.returncode != 0, r.stdout.decode()
    assert re.search(r"bad\.toml:\d+:\d+: .*" + rx, (r.stdout + r.stderr).decode()), (r.stdout + r.stderr).decode()


def test_sentinel_and_servers_both_or_neither(tmp_path):
    both = harness.render_config({"workers": 1}, [listener()], {"up": {
        "sentinel": {"addresses": ["127.0.0.1:26379"], "master": MASTER},
        "servers": [{"address": "127.0.0.1:6379"}]}})
    neither = harness.render_config({"workers": 1}, [listener()], {"up": {"balance": "round_robin"}})
    for text, rx in ((both, r"sentinel and servers are both set"), (neither, r"needs servers = .* or sentinel = ")):
        cfg = tmp_path / "bad.toml"
        cfg.write_text(text)
        r = harness.run_check(cfg)
        assert r.returncode != 0, r.stdout.decode()
        assert re.search(r"bad\.toml:\d+:\d+: .*" + rx, (r.stdout + r.stderr).decode()), (r.stdout + r.stderr).decode()


def test_a_sentinel_naming_a_replica_sends_no_one_there(cluster, sentinel_sluice, backends):
    # A wrong (or stale) sentinel names the replica: sluice's own role check
    # keeps every session away from it.
    wrong = backends(fake_sentinel(resp_address("127.0.0.1", cluster.replica.port)))
    ss = sentinel_sluice({"addresses": [wrong.address], "master": MASTER})
    assert [s["address"] for s in ss.servers()] == [cluster.replica.address]
    harness.wait_until(lambda: "role is replica" in (ss.servers()[0]["last_check"] or {}).get("reason", ""),
                       what="the role check's verdict")
    assert ss.servers()[0]["active_check"] == "standby"
    assert ss.servers()[0]["state"] == "standby" and ss.servers()[0]["role"] == "replica"
    for _ in range(5):
        assert port_through(ss) is None


def test_a_reply_over_the_cap_skips_that_sentinel(cluster, sentinel_sluice, backends):
    huge = backends(fake_sentinel(b"*2\r\n$100000000\r\n" + b"x" * 70000))
    ss = sentinel_sluice({"addresses": [huge.address] + [s.address for s in cluster.sentinels], "master": MASTER})
    assert port_through(ss) == cluster.master.port
    entry = next(e for e in ss.status()["discovery"]["entries"] if e["type"] == "sentinel")
    assert entry["addresses"] == [cluster.master.address]
    assert ss.status()["discovery"]["errors"].get("sentinel", 0) >= 1
    assert ss.s.running()


def test_a_reload_keeps_the_master_and_its_sessions(cluster, sentinel_sluice):
    ss = sentinel_sluice({"addresses": [s.address for s in cluster.sentinels], "master": MASTER})
    held = harness.connect(*ss.s.addr("main"))
    held.sendall(dbpeers.resp_command("PING"))
    assert harness.recv_exact(held, 7) == b"+PONG\r\n"
    # The same sentinels, in another order: the master stays known.
    text = ss.s.config_path.read_text()
    reordered = text.replace(", ".join(f'"{s.address}"' for s in cluster.sentinels),
                             ", ".join(f'"{s.address}"' for s in reversed(cluster.sentinels)))
    assert reordered != text
    ss.s.reload(reordered)
    assert [s["address"] for s in ss.servers()] == [cluster.master.address]
    held.sendall(dbpeers.resp_command("PING"))
    assert harness.recv_exact(held, 7) == b"+PONG\r\n"
    held.close()
    assert port_through(ss) == cluster.master.port


def test_password_file_is_sent_with_auth(cluster, sentinel_sluice, backends, tmp_path):
    pw = tmp_path / "sentinel.pw"
    pw.write_text("s3cret\n")
    seen: list[bytes] = []

    def handler(backend: harness.Backend, conn: socket.socket):
        got = b""
        while b"get-master-addr-by-name" not in got:
            chunk = conn.recv(4096)
            if not chunk:
                return
            got += chunk
        seen.append(got)
        ok = got.startswith(dbpeers.resp_command("AUTH", "s3cret"))
        conn.sendall(b"+OK\r\n" + resp_address("127.0.0.1", cluster.master.port) if ok
                     else b"-WRONGPASS invalid username-password pair\r\n")
        harness.recv_all(conn)

    sentinel = backends(handler)
    ss = sentinel_sluice({"addresses": [sentinel.address], "master": MASTER, "password_file": str(pw)})
    assert port_through(ss) == cluster.master.port
    assert seen and all(s.startswith(dbpeers.resp_command("AUTH", "s3cret")) for s in seen)

    # A wrong password: that sentinel names nothing, and /status says why.
    pw.write_text("wrong\n")
    ss2 = sentinel_sluice({"addresses": [sentinel.address], "master": MASTER, "password_file": str(pw)},
                          name="sluice2")
    entry = next(e for e in ss2.status()["discovery"]["entries"] if e["type"] == "sentinel")
    assert entry["addresses"] == []
    assert 'AUTH failed: "WRONGPASS' in entry["last_error"], entry
    assert port_through(ss2) is None


def resp_push(*items: bytes) -> bytes:
    return b"*%d\r\n" % len(items) + b"".join(b"$%d\r\n%s\r\n" % (len(x), x) for x in items)


class LyingSentinel:
    """A sentinel that names the real master, and, once `lie` is set, tells
    its subscribers that a failover to `candidate` has begun (and that the
    master has switched), though none has."""

    def __init__(self, master_port: int, candidate_port: int):
        self.master_port = master_port
        self.candidate_port = candidate_port
        self.lie = threading.Event()

    def handler(self, backend: harness.Backend, conn: socket.socket):
        got = b""
        while b"get-master-addr-by-name" not in got:
            chunk = conn.recv(4096)
            if not chunk:
                return
            got += chunk
        conn.sendall(resp_address("127.0.0.1", self.master_port))
        conn.settimeout(0.2)
        while b"SUBSCRIBE" not in got:
            try:
                chunk = conn.recv(4096)
            except socket.timeout:
                continue
            if not chunk:
                return
            got += chunk
        for channel in (b"+switch-master", b"+failover-state-send-slaveof-noone", b"+promoted-slave"):
            conn.sendall(b"*3\r\n$9\r\nsubscribe\r\n$%d\r\n%s\r\n:1\r\n" % (len(channel), channel))
        self.lie.wait(timeout=60)
        m, c = self.master_port, self.candidate_port
        details = f"slave 127.0.0.1:{c} 127.0.0.1 {c} @ {MASTER} 127.0.0.1 {m}".encode()
        for _ in range(3):  # said again and again: the same lie fences once
            conn.sendall(resp_push(b"message", b"+failover-state-send-slaveof-noone", details))
            conn.sendall(resp_push(b"message", b"+switch-master", f"{MASTER} 127.0.0.1 {m} 127.0.0.1 {c}".encode()))
            time.sleep(0.5)
        harness.recv_all(conn)


def test_a_lying_sentinel_cannot_fence_a_healthy_master_for_long(cluster, sentinel_sluice, backends):
    liar = LyingSentinel(cluster.master.port, cluster.replica.port)
    fake = backends(liar.handler)
    addresses = [s.address for s in cluster.sentinels[:2]] + [fake.address]
    ss = sentinel_sluice({"addresses": addresses, "master": MASTER})
    ss.s.log.wait_for(rf"follows the failovers announced at sentinel {re.escape(fake.address)}",
                      timeout=harness.EVENT_TIMEOUT)
    assert port_through(ss) == cluster.master.port
    start = len(ss.s.log.lines)
    t0 = time.monotonic()
    liar.lie.set()
    # One sentinel's word is enough to fence the master at once...
    ss.s.log.wait_for(rf"began \(\+failover-state-send-slaveof-noone from sentinel {re.escape(fake.address)}\)",
                      start=start)
    # ...but the candidate never took over: the fence is lifted within
    # kPromotionWait (3 s), and the master is never moved.
    ss.s.log.wait_for(r"is not happening \(it did not take over\)", timeout=10, start=start)
    lifted = time.monotonic() - t0
    assert lifted <= 3.0 + 2.0, f"fenced for {lifted:.2f}s"
    harness.wait_until(lambda: port_through(ss) == cluster.master.port, what="the master serves again")
    assert [s["address"] for s in ss.servers()] == [cluster.master.address]
    assert ss.servers()[0]["state"] == "up"
    # The same lie said again fences nothing.
    time.sleep(1.5)
    assert len(ss.s.log.matches(r"sentinel: upstream .* began \(\+failover-state-send-slaveof-noone")) == 1
    assert not ss.s.log.matches(r"moved from")
    for _ in range(3):
        assert port_through(ss) == cluster.master.port
