"""Active health checks through sluice: a dead or demoted server is taken
out before a client is hurt, within the bounds docs/health.md gives, and the
role checks follow a failover."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time

import pytest

import dbpeers
import harness
from harness import banner_of, listener, upstream
from test_admin import admin_sluice, status  # noqa: F401  (fixture)
from test_probes import CHECKER_PASSWORD, pg_primary_standby, redis_pair, silent_handler  # noqa: F401  (fixtures)

# Every check here runs with jitter = "0%", so the bounds of docs/health.md
# are exact. SLACK is what a loaded 2-core machine may add on top: a check's
# timer firing late, the log line reaching the test late.
SLACK = 0.5
# Timers may fire a little early by the wall clock (libuv's loop time is
# cached per iteration): the allowance under a lower bound.
EARLY = 0.05


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def seconds(text: str) -> float:
    """A duration as the config and the logs write it: "250ms", "1.5s", "2m"."""
    m = re.fullmatch(r"([0-9.]+)(ms|s|m|h)", text)
    assert m, f"not a duration: {text!r}"
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[m.group(2)]


def fast_down_bound(h: dict) -> float:
    """docs/health.md: a failing check that ends at once (refused, HTTP 503)
    is marked down within fall x interval + timeout."""
    return h["fall"] * seconds(h["interval"]) + seconds(h["timeout"])


def hanging_down_bound(h: dict) -> float:
    """docs/health.md: a server that hangs, every check running to its
    timeout, is marked down within fall x (interval + timeout)."""
    return h["fall"] * (seconds(h["interval"]) + seconds(h["timeout"]))


def up_bound(h: dict) -> float:
    """docs/health.md: up within rise x interval (plus the passing checks'
    own durations, a few ms here: inside SLACK)."""
    return h["rise"] * seconds(h["interval"])


def down_rx(addr: str, reason: str = r".*") -> str:
    return (rf'upstream "up" server {re.escape(addr)} marked down \(active check\): '
            rf"(?P<reason>{reason}) \(detected in (?P<detect>\S+)\)$")


def standby_rx(addr: str, reason: str = r".*") -> str:
    return rf'upstream "up" server {re.escape(addr)} is standby \(active check\): (?P<reason>{reason})$'


def up_rx(addr: str, reason: str = r".*") -> str:
    return (rf'upstream "up" server {re.escape(addr)} is up \(active check\): '
            rf"(?P<reason>{reason}) \(detected in (?P<detect>\S+)\)$")


def timed_wait(s: harness.Sluice, pattern: str, since: float, start: int) -> tuple[float, re.Match]:
    """Waits for a log line matching `pattern` (among lines from index
    `start`); returns the seconds since `since` and the match."""
    m = s.log.wait_for(pattern, timeout=harness.EVENT_TIMEOUT, start=start)
    return time.monotonic() - since, m


def assert_within(took: float, bound: float, floor: float, what: str):
    assert took <= bound + SLACK, f"{what} after {took:.3f}s, bound {bound:.3f}s + slack {SLACK}s"
    assert took >= floor - EARLY, f"{what} after {took:.3f}s, sooner than the checks allow ({floor:.3f}s)"


def down_within_bound(s: harness.Sluice, h: dict, addr: str, reason: str, change):
    """change() makes every later check of `addr` fail at once: the mark-down
    comes within fast_down_bound(h), and no sooner than fall failing checks
    an interval apart allow."""
    start, t0 = len(s.log.lines), time.monotonic()
    change()
    took, _ = timed_wait(s, down_rx(addr, reason), t0, start)
    assert_within(took, fast_down_bound(h), (h["fall"] - 1) * seconds(h["interval"]), "marked down")


def up_within_bound(s: harness.Sluice, h: dict, addr: str, reason: str, change):
    """change() makes every later check of `addr` pass: up within
    up_bound(h), and no sooner than rise passing checks allow."""
    start, t0 = len(s.log.lines), time.monotonic()
    change()
    took, _ = timed_wait(s, up_rx(addr, reason), t0, start)
    assert_within(took, up_bound(h), (h["rise"] - 1) * seconds(h["interval"]), "up")


def web_or_banner(answer: dict):
    """The proxied protocol and an HTTP health endpoint on one port. A
    request for /health gets answer["code"] with answer.get("body", b"ok");
    anything else is a client: it gets the backend's name as a line, then an
    echo until it closes (so the session stays open as long as it wants)."""
    def handle(backend, conn):
        first = conn.recv(4096)
        if first.startswith(b"GET /health "):
            body = answer.get("body", b"ok")
            conn.sendall(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                         % (answer["code"], len(body), body))
            return
        if not first:
            return
        conn.sendall(backend.name.encode() + b"\n")
        harness.echo_handler(backend, conn)
    return handle


def hello(s: harness.Sluice) -> tuple[socket.socket, bytes]:
    """A client of web_or_banner through sluice: returns the open session and
    the name of the backend that answered."""
    c = s.connect()
    try:
        c.sendall(b"hello\n")
        return c, harness.recv_line(c)
    except BaseException:
        c.close()
        raise


def name_of(s: harness.Sluice) -> bytes:
    c, name = hello(s)
    c.close()
    return name


def refused_no_server(s: harness.Sluice, count: int):
    """`count` clients, each closed by sluice without a server."""
    before = len(s.access_records())
    for _ in range(count):
        c = s.connect()
        try:
            assert harness.wait_closed(c) in ("eof", "reset")
        finally:
            c.close()
    recs = s.wait_records(before + count)[before:]
    assert [r["cause"] for r in recs] == ["no_server"] * count, recs
    assert all(r["tries"] == "0" for r in recs), recs


# --------------------------------------------------------------------------
# detection bounds
# --------------------------------------------------------------------------

TCP = {"type": "tcp", "interval": "300ms", "timeout": "300ms", "fall": 3, "rise": 2, "jitter": "0%"}


def test_tcp_check_detects_down_and_up_within_the_bounds(sluice, backends):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    # Passive health off: only the active check may take B out.
    s = sluice([listener()], {"up": upstream(a, b, health=TCP, max_fails=0)})
    assert {banner_of(s) for _ in range(6)} == {b"A", b"B"}
    # B's port refuses: each failing check ends at once.
    down_within_bound(s, TCP, b.address, "connect refused", b.stop)
    before = len(s.access_records())
    for _ in range(10):
        assert banner_of(s) == b"A"
    recs = s.wait_records(before + 10)[before:]
    assert all(r["tries"] == "1" for r in recs), "a client still paid for the dead server"

    # B listens again on the same port.
    up_within_bound(s, TCP, b.address, "connected",
                    lambda: backends(harness.banner_handler, name="B", port=b.port))
    assert {banner_of(s) for _ in range(6)} == {b"A", b"B"}


HTTP = {"type": "http", "path": "/health", "interval": "300ms", "timeout": "300ms", "fall": 3, "rise": 2,
        "jitter": "0%"}


def test_http_check_detects_down_and_up_within_the_bounds(sluice, backends):
    answer = {"code": 200}
    a = backends(web_or_banner({"code": 200}), name="A")
    b = backends(web_or_banner(answer), name="B")
    s = sluice([listener()], {"up": upstream(a, b, health=HTTP, max_fails=0)})
    assert {name_of(s) for _ in range(6)} == {b"A", b"B"}
    down_within_bound(s, HTTP, b.address, "HTTP 503", lambda: answer.update(code=503))
    assert {name_of(s) for _ in range(6)} == {b"A"}
    up_within_bound(s, HTTP, b.address, "HTTP 200", lambda: answer.update(code=200))
    assert {name_of(s) for _ in range(6)} == {b"A", b"B"}


HANG = {"type": "http", "path": "/health", "interval": "300ms", "timeout": "400ms", "fall": 2, "rise": 2,
        "jitter": "0%"}


def test_a_check_that_hangs_is_cut_at_its_timeout(sluice, backends):
    a = backends(web_or_banner({"code": 200}), name="A")
    s = sluice([listener()], {"up": upstream(a, health=HANG, max_fails=0)})
    assert name_of(s) == b"A"
    release = threading.Event()
    start, t0 = len(s.log.lines), time.monotonic()
    a.handler = silent_handler(release)  # accepts, reads, never answers
    try:
        took, m = timed_wait(s, down_rx(a.address, re.escape("timeout after 400ms")), t0, start)
    finally:
        release.set()
    # Each failing check ran to its timeout, no shorter (the floor) and no
    # longer (the bound): fall timeouts with an interval between them.
    timeout, interval = seconds(HANG["timeout"]), seconds(HANG["interval"])
    floor = HANG["fall"] * timeout + (HANG["fall"] - 1) * interval
    assert_within(took, hanging_down_bound(HANG), floor, "marked down")
    # The log's own figure counts from the start of the first failing check.
    detected = seconds(m.group("detect"))
    assert floor - EARLY <= detected <= took + EARLY, m.group(0)


@pytest.mark.parametrize("keys, good, good_reason, bad, bad_reason", [
    pytest.param({}, {"code": 399}, "HTTP 399", {"code": 400}, "HTTP 400", id="default-200-399"),
    pytest.param({"expect_status": ["500-503"]}, {"code": 503}, "HTTP 503", {"code": 200}, "HTTP 200",
                 id="range"),
    pytest.param({"expect_status": [204, "300-302"]}, {"code": 302}, "HTTP 302", {"code": 303}, "HTTP 303",
                 id="codes-and-ranges"),
    pytest.param({"expect_body": '"role": "master"'},
                 {"code": 200, "body": b'{"role": "master", "state": "running"}'}, "HTTP 200, body matched",
                 {"code": 200, "body": b'{"role": "replica", "state": "running"}'},
                 "HTTP 200 but the body lacks ", id="expect_body"),
    pytest.param({"expect_body": '"role": "master"'},
                 {"code": 200, "body": b'{"role": "master"}'}, "HTTP 200, body matched",
                 {"code": 503, "body": b'{"role": "master"}'}, "HTTP 503", id="expect_body-and-status"),
])
def test_http_expect_status_and_body_decide_through_sluice(sluice, backends, keys, good, good_reason, bad,
                                                           bad_reason):
    answer = dict(good)
    a = backends(web_or_banner(answer), name="A")
    health = {"type": "http", "path": "/health", "interval": "100ms", "timeout": "500ms", "rise": 1, "fall": 1,
              "jitter": "0%", "initial": "down", **keys}
    s = sluice([listener()], {"up": upstream(a, health=health)})
    s.log.wait_for(up_rx(a.address, re.escape(good_reason)))
    assert name_of(s) == b"A"
    start = len(s.log.lines)
    answer.update(bad)  # key by key: any mix of good and bad is one or the other
    s.log.wait_for(down_rx(a.address, re.escape(bad_reason) + ".*"), start=start)
    refused_no_server(s, 2)


@pytest.mark.parametrize("all_down, served", [(None, False), ("fail_closed", False), ("fail_open", True)])
def test_all_down_fail_open_or_closed(sluice, backends, all_down, served):
    # Both servers fail their checks but still serve the proxied protocol.
    a = backends(web_or_banner({"code": 503}), name="A")
    b = backends(web_or_banner({"code": 503}), name="B")
    health = {"type": "http", "path": "/health", "interval": "100ms", "timeout": "500ms", "rise": 1, "fall": 1,
              "jitter": "0%"}
    extra = {} if all_down is None else {"all_down": all_down}
    s = sluice([listener()], {"up": upstream(a, b, health=health, **extra)})
    s.log.wait_for(down_rx(a.address, "HTTP 503"))
    s.log.wait_for(down_rx(b.address, "HTTP 503"))
    if not served:
        refused_no_server(s, 4)
        return
    assert {name_of(s) for _ in range(6)} == {b"A", b"B"}
    recs = s.wait_records(6)
    assert all(r["cause"] != "no_server" and r["server"] in (a.address, b.address) for r in recs), recs


# --------------------------------------------------------------------------
# sessions, start-up state, slow start
# --------------------------------------------------------------------------

def test_on_down_close_sessions(sluice, backends):
    a = backends(harness.echo_handler, name="A")
    health = {"type": "send_expect", "send": "PING\n", "expect": "PING", "interval": "200ms", "timeout": "300ms",
              "fall": 1, "on_down": "close_sessions"}
    s = sluice([listener()], {"up": upstream(a, health=health)})
    c = s.connect()
    try:
        c.sendall(b"hi")
        assert harness.recv_exact(c, 2) == b"hi"
        # The server stops answering checks (it closes new connections) while
        # our session is still open.
        a.handler = lambda backend, conn: conn.close()
        assert harness.wait_closed(c, timeout=5) in ("eof", "reset")
    finally:
        c.close()
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "server_down"


def test_initial_down_is_decided_by_the_first_check_before_accepting(sluice, backends):
    a = backends(harness.banner_handler, name="A")
    health = {"type": "tcp", "interval": "30s", "timeout": "2s", "rise": 2, "initial": "down"}
    s = sluice([listener()], {"up": upstream(a, health=health)})
    # The first check ran before the listener accepted, and its pass was
    # enough (nothing had failed): the very first client is served, long
    # before a second check.
    assert banner_of(s) == b"A"
    s.log.wait_for(r"is up \(active check\): connected")
    s.log.wait_for(r"first checks answered in \S+; accepting")


# fall = 3: a check that times out once on a busy machine must not take A
# down (and make it ramp up again when it returns).
SLOW = {"type": "http", "path": "/health", "interval": "100ms", "timeout": "500ms", "rise": 1, "fall": 3,
        "jitter": "0%", "slow_start": "3s"}
# The first quarter of the ramp: the returning server's weight goes from 10%
# to 32.5% of its own, so its fair share of new sessions is at most
# 0.325 / 1.325 = 25% (about 17% on average for round_robin).
RAMP_WINDOW = 0.75
EARLY_SHARE_MAX = 0.35


def server_status(s, addr: str) -> dict:
    (up,) = [u for u in status(s)["upstreams"] if u["name"] == "up"]
    (sv,) = [x for x in up["servers"] if x["address"] == addr]
    return sv


@pytest.mark.parametrize("balance", ["round_robin", "least_conn"])
def test_slow_start_limits_a_returning_servers_share(admin_sluice, backends, balance):  # noqa: F811
    answer = {"code": 503}
    a = backends(web_or_banner({"code": 200}), name="A")
    b = backends(web_or_banner(answer), name="B")
    s = admin_sluice([listener()], {"up": upstream(a, b, balance=balance, health=SLOW)})
    s.log.wait_for(down_rx(b.address, "HTTP 503"))
    # A never was down: no ramp at start-up, it takes its full weight at once.
    ramp = seconds(SLOW["slow_start"])
    assert server_status(s, a.address)["effective_weight"] == 1.0

    start = len(s.log.lines)
    answer["code"] = 200
    s.log.wait_for(up_rx(b.address, "HTTP 200"), start=start)
    t_up = time.monotonic()
    # Sessions stay open, so least_conn's counts include them all.
    held: list[socket.socket] = []
    names: list[bytes] = []
    try:
        while time.monotonic() - t_up < RAMP_WINDOW:
            c, name = hello(s)
            held.append(c)
            names.append(name)
        assert server_status(s, b.address)["effective_weight"] < 1.0, "the ramp is over already"
    finally:
        for c in held:
            c.close()
    assert len(names) >= 10, f"only {len(names)} sessions in {RAMP_WINDOW}s"
    early = names.count(b"B") / len(names)
    assert early < EARLY_SHARE_MAX, f"B took {names.count(b'B')} of {len(names)} sessions early in its ramp"
    assert b"B" in names, "B got nothing at 10% of its weight"

    # Once B's ramp is over, and the sessions above are gone, the split is even.
    def settled():
        sa, sb = server_status(s, a.address), server_status(s, b.address)
        return (sa["effective_weight"] == 1.0 and sb["effective_weight"] == 1.0
                and sa["active"] == 0 and sb["active"] == 0)
    harness.wait_until(settled, timeout=ramp + harness.EVENT_TIMEOUT, interval=0.1,
                       what="B's slow start to end and the early sessions to close")
    held, names = [], []
    try:
        for _ in range(20):
            c, name = hello(s)
            held.append(c)
            names.append(name)
    finally:
        for c in held:
            c.close()
    assert 8 <= names.count(b"B") <= 12, names


# --------------------------------------------------------------------------
# database roles and failovers
# --------------------------------------------------------------------------

def test_redis_role_check_follows_a_failover(sluice, redis_pair):  # noqa: F811
    master, replica = redis_pair
    health = {"type": "redis", "role": "master", "interval": "200ms", "timeout": "500ms", "rise": 1, "fall": 1}
    s = sluice([listener()], {"up": upstream(master.address, replica.address, health=health)},
               )
    # A role check starts down: the replica is standby after its first check.
    harness.wait_until(lambda: s.log.matches(rf"server {re.escape(replica.address)} is standby"), timeout=5)
    for i in range(5):
        with dbpeers.RespConn(*s.addr()) as c:
            assert c.call("SET", f"k{i}", "v") == "OK"  # a replica would refuse writes
    # Failover: promote the replica, demote the master.
    with dbpeers.RespConn("127.0.0.1", replica.port) as c:
        assert c.call("REPLICAOF", "NO", "ONE") == "OK"
    with dbpeers.RespConn("127.0.0.1", master.port) as c:
        assert c.call("REPLICAOF", "127.0.0.1", str(replica.port)) == "OK"
    s.log.wait_for(rf"server {re.escape(master.address)} is standby \(active check\)", timeout=5)
    s.log.wait_for(rf"server {re.escape(replica.address)} is up \(active check\)", timeout=5)
    with dbpeers.RespConn(*s.addr()) as c:
        assert c.call("SET", "after", "failover") == "OK"
        role = c.call("ROLE")[0]
        assert role in (b"master", "master"), role


REDIS = {"type": "redis", "role": "master", "interval": "200ms", "timeout": "500ms", "rise": 1, "fall": 1,
         "jitter": "0%", "initial": "down", "on_down": "close_sessions"}


def redis_port(c: dbpeers.RespConn) -> int:
    """The port of the Redis server that answers on `c`."""
    key, value = c.call("CONFIG", "GET", "port")
    assert key == b"port", key
    return int(value)


def test_redis_failover_closes_sessions_held_on_the_old_master(sluice, redis_pair):  # noqa: F811
    master, replica = redis_pair
    s = sluice([listener()], {"up": upstream(master.address, replica.address, health=REDIS)})
    s.log.wait_for(up_rx(master.address, "role is master"))
    held = dbpeers.RespConn(*s.addr())
    try:
        assert redis_port(held) == master.port
        assert held.call("SET", "before", "failover") == "OK"
        # Failover: promote the replica, demote the master.
        start, t0 = len(s.log.lines), time.monotonic()
        with dbpeers.RespConn("127.0.0.1", replica.port) as c:
            assert c.call("REPLICAOF", "NO", "ONE") == "OK"
        with dbpeers.RespConn("127.0.0.1", master.port) as c:
            assert c.call("REPLICAOF", "127.0.0.1", str(replica.port)) == "OK"
        assert harness.wait_closed(held.sock) in ("eof", "reset")
        closed_after = time.monotonic() - t0
    finally:
        held.close()
    down_after, _ = timed_wait(s, standby_rx(master.address, "role changed: role is replica, want master"), t0, start)
    up_after, _ = timed_wait(s, up_rx(replica.address, "role is master"), t0, start)
    assert closed_after <= fast_down_bound(REDIS) + SLACK, f"held session closed after {closed_after:.3f}s"
    assert down_after <= fast_down_bound(REDIS) + SLACK, f"old master marked down after {down_after:.3f}s"
    assert up_after <= up_bound(REDIS) + SLACK, f"new master up after {up_after:.3f}s"
    (rec,) = s.wait_records(1)
    # fenced when a check saw both nodes say master between the two
    # REPLICAOF commands (one writer), server_down otherwise.
    assert rec["cause"] in ("server_down", "fenced") and rec["server"] == master.address, rec
    for i in range(4):
        with dbpeers.RespConn(*s.addr()) as c:
            assert redis_port(c) == replica.port
            assert c.call("SET", f"after{i}", "failover") == "OK"


def test_a_check_replaced_by_a_reload_still_closes_sessions_on_a_demoted_master(sluice, redis_pair):  # noqa: F811
    """A reload that changes the check's settings starts a new check that
    keeps the server's state. Its first answer from a master demoted
    meanwhile is a role change, not a standby found at start: the sessions
    held there end, as on_role_change says, although on_down keeps them."""
    master, replica = redis_pair
    slow = dict(REDIS, interval="30s", on_down="keep")
    s = sluice([listener()], {"up": upstream(master.address, health=slow)})
    held = dbpeers.RespConn(*s.addr())
    try:
        assert redis_port(held) == master.port
        s.log.wait_for(up_rx(master.address, "role is master"))
        # Demoted while the 30 s interval runs: only the new check can see it.
        with dbpeers.RespConn("127.0.0.1", master.port) as c:
            assert c.call("REPLICAOF", "127.0.0.1", str(replica.port)) == "OK"
        start = len(s.log.lines)
        s.reload(s.config_path.read_text().replace('interval = "30s"', 'interval = "200ms"'))
        s.log.wait_for(standby_rx(master.address, "role changed: role is replica, want master"), start=start)
        assert harness.wait_closed(held.sock) in ("eof", "reset")
    finally:
        held.close()
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "server_down" and rec["server"] == master.address, rec


def test_postgres_role_check_routes_to_the_primary_and_follows_a_failover(sluice, pg_primary_standby,  # noqa: F811
                                                                         tmp_path):
    primary, standby = pg_primary_standby
    pw = tmp_path / "pgpass"
    pw.write_text(CHECKER_PASSWORD + "\n")
    health = {"type": "postgres", "role": "primary", "user": "checker", "database": "postgres",
              "password_file": str(pw), "sslmode": "disable", "interval": "300ms", "timeout": "2s",
              "rise": 1, "fall": 1, "jitter": "0%"}
    s = sluice([listener()], {"up": upstream(primary.address, standby.address, health=health)})
    s.log.wait_for(rf"server {re.escape(standby.address)} is standby \(active check\): .*standby", timeout=10)
    for _ in range(4):
        r = dbpeers.psql(s.port(), "select pg_is_in_recovery(), current_setting('port')")
        assert r.stdout.strip() == f"f|{primary.port}"
    # Writes go through sluice to the primary (a standby would refuse them).
    r = dbpeers.psql(s.port(), "create table failover_writes (n int, port text)")
    assert r.returncode == 0, r.stderr
    for i in range(4):
        r = dbpeers.psql(s.port(), f"insert into failover_writes values ({i}, current_setting('port'))")
        assert r.returncode == 0, r.stderr
    # Replication is asynchronous: let the standby replay them first.
    harness.wait_until(lambda: dbpeers.psql(standby.port, "select count(*) from failover_writes",
                                            check=False).stdout.strip() == "4", timeout=20)

    # Failover: promote the standby, then stop the old primary.
    start = len(s.log.lines)
    r = subprocess.run([dbpeers.RUNUSER, "-u", dbpeers.PG_USER, "--", str(dbpeers.PG_BIN / "pg_ctl"),
                        "promote", "-w", "-D", str(standby.cluster.datadir)],
                       env=dbpeers.clean_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    # pg_ctl -w has returned: the standby is out of recovery; the old primary stops now.
    t0 = time.monotonic()
    primary.stop()
    # The promoted node is up within rise x interval of its promotion; the old
    # primary (refusing, or "shutting down") is down within fall x interval +
    # timeout of its stop.
    deadline = t0 + max(up_bound(health), fast_down_bound(health)) + SLACK
    s.log.wait_for(up_rx(standby.address, "role is primary"), start=start)
    s.log.wait_for(down_rx(primary.address), start=start)
    seen = time.monotonic()
    assert seen <= deadline, f"the failover was followed {seen - deadline:.3f}s after the bound"
    for _ in range(4):
        r = dbpeers.psql(s.port(), "select pg_is_in_recovery(), current_setting('port')")
        assert r.stdout.strip() == f"f|{standby.port}"
    # New writes reach the promoted node, which has the old ones too.
    for i in range(4, 8):
        r = dbpeers.psql(s.port(), f"insert into failover_writes values ({i}, current_setting('port'))")
        assert r.returncode == 0, r.stderr
    r = dbpeers.psql(s.port(), "select count(*), count(*) filter (where port = current_setting('port')) "
                               "from failover_writes")
    assert r.stdout.strip() == "8|4", r.stdout
