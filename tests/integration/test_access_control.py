"""allow/deny, per-listener max_connections, client_max_connections and
client_rate_limit: checked right after accept, exact, never stalling."""

from __future__ import annotations

import socket
import time

import harness
from harness import listener, upstream


def connect_from(src: str, addr, timeout: float = 5.0) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((src, 0))
    s.connect(addr)
    return s


def served(sock: socket.socket) -> bool:
    """True when the banner arrives, False when sluice closed the connection."""
    try:
        return harness.recv_line(sock) == b"A"
    except (AssertionError, OSError):
        return False


def test_allow_and_deny(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener(allow=["127.0.0.0/24", "::1"], deny=["127.0.0.3"])], {"up": upstream(be)})
    for src, ok in [("127.0.0.1", True), ("127.0.0.2", True), ("127.0.0.3", False), ("127.0.1.1", False)]:
        c = connect_from(src, s.addr())
        try:
            assert served(c) == ok, src
        finally:
            c.close()
    # Refused before any server was contacted; no access record each, one
    # rate-limited warning.
    assert be.counts()[0] == 2
    s.log.wait_for(r'listener "main": connection from 127\.0\.(0\.3|1\.1):\d+ refused \(acl_denied\)')
    recs = s.wait_records(2)
    assert all(r["cause"] != "acl_denied" for r in recs)


def test_deny_only_lets_everyone_else_in(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener(deny=["127.0.0.5/32"])], {"up": upstream(be)})
    c = connect_from("127.0.0.4", s.addr())
    d = connect_from("127.0.0.5", s.addr())
    try:
        assert served(c)
        assert not served(d)
    finally:
        c.close()
        d.close()


def test_client_max_connections_is_per_address(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener(client_max_connections=2)], {"up": upstream(be)}, global_={"workers": 2})
    held = []
    try:
        for _ in range(2):
            c = connect_from("127.0.0.7", s.addr())
            held.append(c)
            assert served(c)
        extra = connect_from("127.0.0.7", s.addr())
        held.append(extra)
        assert not served(extra), "a third connection from the same address got in"
        other = connect_from("127.0.0.8", s.addr())
        held.append(other)
        assert served(other)
        # One leaves: the next one from that address is served again.
        held[0].close()
        s.wait_records(1)
        again = connect_from("127.0.0.7", s.addr())
        held.append(again)
        assert served(again)
    finally:
        for c in held:
            c.close()
    s.log.wait_for(r"refused \(client_limit\)")


def test_client_rate_limit_token_bucket(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener(client_rate_limit="5/s")], {"up": upstream(be)}, global_={"workers": 2})
    ok = 0
    t0 = time.monotonic()
    for _ in range(12):
        c = connect_from("127.0.0.9", s.addr())
        try:
            ok += served(c)
        finally:
            c.close()
    took = time.monotonic() - t0
    # A burst of one second's worth (5), plus what refilled while we tried.
    assert 5 <= ok <= 5 + int(took * 5) + 1, (ok, took)
    assert ok < 12
    c = connect_from("127.0.0.10", s.addr())  # another address has its own bucket
    try:
        assert served(c)
    finally:
        c.close()
    s.log.wait_for(r"refused \(rate_limited\)")


def test_listener_max_connections(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener(max_connections=2)], {"up": upstream(be)})
    held = [s.connect(), s.connect()]
    try:
        for c in held:
            assert served(c)
        extra = s.connect()
        held.append(extra)
        assert not served(extra)
    finally:
        for c in held:
            c.close()
    recs = s.wait_records(3)
    assert [r["cause"] for r in recs].count("limit_reached") == 1


def test_a_connect_storm_over_the_limit_never_stalls_accepting(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener(client_rate_limit="1/s")], {"up": upstream(be)})
    t0 = time.monotonic()
    for _ in range(300):
        c = connect_from("127.0.0.11", s.addr())
        c.close()
    assert time.monotonic() - t0 < 30
    c = connect_from("127.0.0.12", s.addr())
    try:
        assert served(c), "accepting stalled after a storm"
    finally:
        c.close()
