"""Graceful stop, idle timeout, IPv6, several listeners, several workers."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

import harness
from harness import listener, upstream


def test_sigterm_closes_open_session_after_shutdown_timeout(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener()], {"up": upstream(be)}, global_={"shutdown_timeout": "1s"})
    c = s.connect()
    try:
        assert harness.recv_line(c) == b"A"
        t0 = time.monotonic()
        s.signal(signal.SIGTERM)

        # During the grace period the session still works.
        c.sendall(b"still here")
        assert harness.recv_exact(c, 10) == b"still here"

        assert harness.wait_closed(c, timeout=10) in ("eof", "reset")
        rc = s.wait_exit(timeout=10)
        elapsed = time.monotonic() - t0
    finally:
        c.close()
    assert rc == 0
    assert 0.8 <= elapsed < 5, f"exited {elapsed:.2f}s after SIGTERM with shutdown_timeout=1s"
    (rec,) = s.access_records()
    assert rec["cause"] == "shutdown"
    assert rec["bytes_in"] == "10"


def test_sigterm_stops_accepting(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener()], {"up": upstream(be)}, global_={"shutdown_timeout": "3s"})
    held = s.connect()
    try:
        assert harness.recv_line(held) == b"A"
        s.signal(signal.SIGTERM)
        # The listener goes away while the held session keeps sluice running.
        refused = False
        deadline = time.monotonic() + 2.5
        while not refused and time.monotonic() < deadline and s.running():
            try:
                c = s.connect(timeout=1)
            except (ConnectionRefusedError, ConnectionResetError):
                # Reset: it reached the backlog of a listener that then closed.
                refused = True
                break
            c.close()
            time.sleep(0.02)
        assert refused, "new connections were still accepted after SIGTERM"
        assert s.running(), "exited before the held session's grace period ended"
    finally:
        held.close()
    assert s.wait_exit(timeout=10) == 0


def test_sigterm_waits_only_for_sessions_to_finish(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener()], {"up": upstream(be)}, global_={"shutdown_timeout": "20s"})
    c = s.connect()
    assert harness.recv_line(c) == b"A"
    s.signal(signal.SIGTERM)
    c.sendall(b"ok")
    assert harness.recv_exact(c, 2) == b"ok"
    t0 = time.monotonic()
    c.shutdown(socket.SHUT_WR)
    assert harness.recv_all(c) == b""
    c.close()
    assert s.wait_exit(timeout=10) == 0
    assert time.monotonic() - t0 < 5, "waited for shutdown_timeout although no session was left"
    (rec,) = s.access_records()
    assert rec["cause"] == "client_closed"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stop_without_sessions_is_prompt(sluice, backends, sig):
    be = backends(harness.echo_handler)
    s = sluice([listener()], {"up": upstream(be)}, global_={"shutdown_timeout": "30s"})
    assert harness.exchange(*s.addr(), b"x") == b"x"
    s.wait_records(1)
    t0 = time.monotonic()
    s.signal(sig)
    assert s.wait_exit(timeout=10) == 0
    assert time.monotonic() - t0 < 3


def test_idle_session_is_closed_with_idle_timeout(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener(idle_timeout="500ms")], {"up": upstream(be)})
    with s.connect() as c:
        assert harness.recv_line(c) == b"A"
        elapsed = harness.seconds_until_closed(c, timeout=10)
    assert 0.4 <= elapsed < 3, f"closed after {elapsed:.2f}s with idle_timeout=500ms"
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "idle_timeout"
    harness.wait_until(lambda: be.counts()[1] == 0, what="server side to be closed")


def test_traffic_keeps_session_alive_past_idle_timeout(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener(idle_timeout="500ms")], {"up": upstream(be)})
    c = s.connect()
    try:
        assert harness.recv_line(c) == b"A"
        t0 = time.monotonic()
        # Bytes every 150 ms for 1.5 s: three idle_timeouts in total, never idle.
        while time.monotonic() - t0 < 1.5:
            c.sendall(b".")
            assert harness.recv_exact(c, 1) == b"."
            time.sleep(0.15)
        assert s.access_records() == [], "session ended while traffic was flowing"
    finally:
        c.close()
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "client_closed"


def test_no_idle_timeout_by_default(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener(idle_timeout="2s"), listener("noidle")],
               {"up": upstream(be)})
    idle = s.connect("main")
    quiet = s.connect("noidle")
    try:
        assert harness.recv_line(idle) == b"A"
        assert harness.recv_line(quiet) == b"A"
        # When the listener with idle_timeout closes its session, the other
        # (silent for just as long) is still open.
        harness.wait_closed(idle, timeout=10)
        quiet.sendall(b"q")
        assert harness.recv_exact(quiet, 1) == b"q"
    finally:
        idle.close()
        quiet.close()


@pytest.mark.skipif(not harness.ipv6_available(), reason="::1 not available")
def test_ipv6_listener_and_server(sluice, backends):
    v6 = backends(harness.banner_handler, name="six", host="::1")
    s = sluice([listener(listen="[::1]:0")], {"up": upstream(v6)})
    host, port = s.addr()
    assert host == "::1"
    c = harness.connect("::1", port)
    try:
        assert harness.recv_line(c) == b"six"
        c.sendall(b"v6 data")
        assert harness.recv_exact(c, 7) == b"v6 data"
    finally:
        c.close()
    (rec,) = s.wait_records(1)
    assert rec["client"].startswith("[::1]:")
    assert rec["server"] == f"[::1]:{v6.port}"


def test_two_listeners_in_one_process(sluice, backends):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = sluice([listener("one", upstream="ua"), listener("two", upstream="ub")],
               {"ua": upstream(a), "ub": upstream(b)})
    assert s.port("one") != s.port("two")
    for name, want in [("one", b"A"), ("two", b"B"), ("one", b"A"), ("two", b"B")]:
        assert harness.banner_of(s, name) == want
    recs = s.wait_records(4)
    assert sorted(r["listener"] for r in recs) == ["one", "one", "two", "two"]
    for r in recs:
        assert r["server"] == (a.address if r["listener"] == "one" else b.address)


def test_several_workers_share_the_load_correctly(sluice, backends):
    echo = backends(harness.echo_handler)
    s = sluice([listener()], {"up": upstream(echo)}, global_={"workers": 2})
    n = 40
    payloads = [os.urandom(10_000 + i) for i in range(n)]
    results = harness.exchange_concurrently(*s.addr(), payloads, timeout=30)
    assert results == payloads
    assert len(s.wait_records(n)) == n
