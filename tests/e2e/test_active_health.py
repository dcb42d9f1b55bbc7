"""Active health checks through sluice: a dead or demoted server is taken
out before a client is hurt, and the role checks follow a failover."""

from __future__ import annotations

import re
import socket
import threading
import time

import pytest

import dbpeers
import harness
from harness import banner_of, listener, upstream
from test_probes import CHECKER_PASSWORD, pg_primary_standby, redis_pair  # noqa: F401  (fixtures)


def test_tcp_check_takes_a_dead_server_out_before_clients_notice(sluice, backends):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    health = {"type": "tcp", "interval": "200ms", "timeout": "200ms", "fall": 2, "rise": 2}
    s = sluice([listener()], {"up": upstream(a, b, health=health, max_fails=0)})
    assert {banner_of(s) for _ in range(6)} == {b"A", b"B"}
    t0 = time.monotonic()
    b.stop()
    m = s.log.wait_for(rf"server {re.escape(b.address)} marked down \(active check\): (.*) \(detected in",
                       timeout=5)
    took = time.monotonic() - t0
    # fall = 2 checks 200 ms apart, each failing at once or within 200 ms.
    assert took < 2.0, f"detected after {took:.2f}s"
    before = len(s.access_records())
    for _ in range(10):
        assert banner_of(s) == b"A"
    recs = s.wait_records(before + 10)[before:]
    assert all(r["tries"] == "1" for r in recs), "a client still paid for the dead server"


def test_http_check_follows_status_and_rise(sluice, backends):
    status = {"code": 200}

    def web_or_banner(backend, conn):
        conn.settimeout(5)
        head = conn.recv(4096)
        if head.startswith(b"GET /health"):
            code = status["code"]
            conn.sendall(f"HTTP/1.1 {code} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok".encode())
        else:
            conn.sendall(b"B\n")

    a = backends(harness.banner_handler, name="A")
    b = backends(web_or_banner, name="B")
    health = {"type": "http", "path": "/health", "interval": "200ms", "timeout": "500ms", "fall": 1, "rise": 2}
    s = sluice([listener()], {"up": upstream(a, b, health=health)})
    status["code"] = 503
    s.log.wait_for(rf"server {re.escape(b.address)} marked down \(active check\): .*503", timeout=5)
    # A also gets HTTP probes; it answers "A\n" which is not HTTP: it is down too,
    # unless its probes pass. Only B's state matters here.
    status["code"] = 200
    s.log.wait_for(rf"server {re.escape(b.address)} is up \(active check\)", timeout=5)


def test_on_down_close_sessions(sluice, backends):
    alive = threading.Event()
    alive.set()

    def echo_or_refuse(backend, conn):
        harness.echo_handler(backend, conn)

    a = backends(echo_or_refuse, name="A")
    health = {"type": "send_expect", "send": "PING\n", "expect": "PING", "interval": "200ms", "timeout": "300ms",
              "fall": 1, "on_down": "close_sessions"}
    s = sluice([listener()], {"up": upstream(a, health=health)})
    time.sleep(0.5)  # a few passing checks first
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


def test_initial_down_waits_for_rise(sluice, backends):
    a = backends(harness.banner_handler, name="A")
    health = {"type": "tcp", "interval": "300ms", "timeout": "300ms", "rise": 2, "initial": "down"}
    s = sluice([listener()], {"up": upstream(a, health=health)})
    # Before the second pass, nothing is eligible.
    c = s.connect()
    try:
        first = harness.wait_closed(c)
    finally:
        c.close()
    assert first in ("eof", "reset")
    s.log.wait_for(r"is up \(active check\)", timeout=5)
    assert banner_of(s) == b"A"


def test_redis_role_check_follows_a_failover(sluice, redis_pair):  # noqa: F811
    master, replica = redis_pair
    health = {"type": "redis", "role": "master", "interval": "200ms", "timeout": "500ms", "rise": 1, "fall": 1}
    s = sluice([listener()], {"up": upstream(master.address, replica.address, health=health)},
               )
    harness.wait_until(lambda: s.log.matches(rf"server {re.escape(replica.address)} marked down"), timeout=5)
    for i in range(5):
        with dbpeers.RespConn(*s.addr()) as c:
            assert c.call("SET", f"k{i}", "v") == "OK"  # a replica would refuse writes
    # Failover: promote the replica, demote the master.
    with dbpeers.RespConn("127.0.0.1", replica.port) as c:
        assert c.call("REPLICAOF", "NO", "ONE") == "OK"
    with dbpeers.RespConn("127.0.0.1", master.port) as c:
        assert c.call("REPLICAOF", "127.0.0.1", str(replica.port)) == "OK"
    s.log.wait_for(rf"server {re.escape(master.address)} marked down \(active check\)", timeout=5)
    s.log.wait_for(rf"server {re.escape(replica.address)} is up \(active check\)", timeout=5)
    with dbpeers.RespConn(*s.addr()) as c:
        assert c.call("SET", "after", "failover") == "OK"
        role = c.call("ROLE")[0]
        assert role in (b"master", "master"), role


def test_postgres_role_check_routes_to_the_primary(sluice, pg_primary_standby, tmp_path):  # noqa: F811
    primary, standby = pg_primary_standby
    pw = tmp_path / "pgpass"
    pw.write_text(CHECKER_PASSWORD + "\n")
    health = {"type": "postgres", "role": "primary", "user": "checker", "database": "postgres",
              "password_file": str(pw), "sslmode": "disable", "interval": "300ms", "timeout": "2s",
              "rise": 1, "fall": 1}
    s = sluice([listener()], {"up": upstream(primary.address, standby.address, health=health)})
    s.log.wait_for(rf"server {re.escape(standby.address)} marked down \(active check\): .*standby", timeout=10)
    for _ in range(4):
        r = dbpeers.psql(s.port(), "select pg_is_in_recovery(), current_setting('port')")
        assert r.stdout.strip() == f"f|{primary.port}"
