"""allow/deny, per-listener max_connections, client_max_connections and
client_rate_limit: checked right after accept, exact, never stalling."""

from __future__ import annotations

import socket
import time

import pytest

import harness
from harness import listener, upstream
from test_admin import admin_sluice, metrics, poll  # noqa: F401  (admin_sluice is a fixture)


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


def closed_by_cause(samples: dict) -> dict[str, dict[str, float]]:
    """listener -> {cause: count} for the causes that happened."""
    out: dict[str, dict[str, float]] = {}
    for (name, labels), value in samples.items():
        if name == "sluice_listener_closed_total" and value:
            lbl = dict(labels)
            out.setdefault(lbl["listener"], {})[lbl["cause"]] = value
    return out


@pytest.mark.skipif(not harness.ipv6_available(), reason="::1 is not available")
def test_ipv6_clients_are_checked_and_every_refusal_is_counted(admin_sluice, backends):
    """allow/deny with IPv6 networks, and the per-client limits for an IPv6
    client, on two workers; the admin API's counters by cause equal what the
    clients saw, connection for connection."""
    be = backends(harness.banner_handler, name="A")
    v6 = "[::1]:0"
    s = admin_sluice([listener("allowed", listen=v6, allow=["::1/128"], deny=["2001:db8::/32"]),
                      listener("not_allowed", listen=v6, allow=["2001:db8::/32", "127.0.0.0/8"]),
                      listener("denied", listen=v6, allow=["::/0"], deny=["::1/128"]),
                      listener("per_client", listen=v6, client_max_connections=2),
                      listener("rate", listen=v6, client_rate_limit="3/s")],
                     {"up": upstream(be)}, global_={"workers": 2})

    def attempt(name: str) -> tuple[socket.socket, bool]:
        host, port = s.addr(name)
        assert host == "::1"
        c = harness.connect(host, port, timeout=5)
        return c, served(c)

    def attempts(name: str, n: int) -> int:
        """n connections one after another; how many were served."""
        ok = 0
        for _ in range(n):
            c, got_in = attempt(name)
            c.close()
            ok += got_in
        return ok

    assert attempts("allowed", 3) == 3
    assert attempts("not_allowed", 4) == 0, "an address outside allow got in"
    assert attempts("denied", 4) == 0, "deny did not win over allow"
    held = []
    try:
        for _ in range(2):
            c, got_in = attempt("per_client")
            held.append(c)
            assert got_in
        for _ in range(3):
            c, got_in = attempt("per_client")
            held.append(c)
            assert not got_in, "a third connection from ::1 got in"
    finally:
        for c in held:
            c.close()
    n_rate = 8
    rate_ok = attempts("rate", n_rate)
    assert 3 <= rate_ok < n_rate, rate_ok
    s.log.wait_for(r"connection from \[::1\]:\d+ refused \(acl_denied\)")

    want = {
        "allowed": {"client_closed": 3},
        "not_allowed": {"acl_denied": 4},
        "denied": {"acl_denied": 4},
        "per_client": {"client_closed": 2, "client_limit": 3},
        "rate": {"client_closed": rate_ok, "rate_limited": n_rate - rate_ok},
    }
    _, samples = poll(lambda: metrics(s), lambda m: closed_by_cause(m[1]) == want)
    assert closed_by_cause(samples) == want
