"""Byte counters move at each interim record (log_interval), not only when
a session ends (docs/operations.md): a long session that moved bytes shows
them in /metrics and /status while it is still open."""

from __future__ import annotations

import harness
from harness import listener, upstream
from test_admin import admin_sluice, metric, metrics, status  # noqa: F401  (admin_sluice is a fixture)

KiB = 1 << 10


def test_a_long_session_shows_its_bytes_before_it_ends(admin_sluice, backends):  # noqa: F811
    be = backends(harness.echo_handler)
    s = admin_sluice([listener()], {"up": upstream(be)}, global_={"log_interval": "1s"})
    payload = b"q" * (100 * KiB)
    c = s.connect()
    try:
        c.sendall(payload)
        assert harness.recv_exact(c, len(payload)) == payload
        n = str(len(payload))
        # An interim record written after the exchange: the counters were
        # brought up to date with it.
        s.wait_records(1, pred=lambda r: r["cause"] == "interim" and r["bytes_in"] == n and r["bytes_out"] == n)

        _, samples = metrics(s)
        assert metric(samples, "sluice_server_bytes_in_total", upstream="up", server=be.address) == len(payload)
        assert metric(samples, "sluice_server_bytes_out_total", upstream="up", server=be.address) == len(payload)
        assert metric(samples, "sluice_listener_bytes_in_total", listener="main") == len(payload)
        assert metric(samples, "sluice_listener_bytes_out_total", listener="main") == len(payload)
        doc = status(s)
        (sv,) = [x for u in doc["upstreams"] for x in u["servers"]]
        assert (sv["bytes_in"], sv["bytes_out"]) == (len(payload), len(payload)), sv

        # More bytes, then the end: each byte is counted once.
        c.sendall(b"tail")
        assert harness.recv_exact(c, 4) == b"tail"
    finally:
        c.close()
    (rec,) = s.wait_records(1, pred=lambda r: r["cause"] != "interim")
    assert rec["bytes_in"] == str(len(payload) + 4)

    def final():
        _, samples = metrics(s)
        return metric(samples, "sluice_server_bytes_in_total", upstream="up", server=be.address)
    assert harness.wait_until(lambda: final() == len(payload) + 4, what="the final count")


def test_without_log_interval_a_live_session_shows_its_bytes_within_seconds(admin_sluice, backends):  # noqa: F811
    """log_interval unset: the worker adds live sessions' bytes every 5 s, so
    a long session does not read 0 B until it ends."""
    be = backends(harness.echo_handler)
    s = admin_sluice([listener()], {"up": upstream(be)})
    payload = b"l" * (64 * KiB)
    c = s.connect()
    try:
        c.sendall(payload)
        assert harness.recv_exact(c, len(payload)) == payload

        def server_bytes():
            (sv,) = [x for u in status(s)["upstreams"] for x in u["servers"]]
            return sv["bytes_in"], sv["bytes_out"]
        harness.wait_until(lambda: server_bytes() == (len(payload), len(payload)), timeout=15,
                           what="the live session's bytes in /status")
        _, samples = metrics(s)
        assert metric(samples, "sluice_listener_bytes_out_total", listener="main") == len(payload)
        assert s.access_records() == []  # no interim record without log_interval
        c.sendall(b"tail")
        assert harness.recv_exact(c, 4) == b"tail"
    finally:
        c.close()
    (rec,) = s.wait_records(1)
    assert rec["bytes_in"] == str(len(payload) + 4)

    def final():
        _, samples = metrics(s)
        return metric(samples, "sluice_server_bytes_in_total", upstream="up", server=be.address)
    assert harness.wait_until(lambda: final() == len(payload) + 4, what="each byte counted once")
