"""Bytes go through unchanged, half-close works, slow readers cost bounded memory."""

from __future__ import annotations

import hashlib
import os
import random
import socket
import time

import pytest

import harness
from harness import listener, upstream

MiB = 1 << 20


@pytest.mark.parametrize("size", [1, 1024, MiB, 64 * MiB], ids=["1B", "1KiB", "1MiB", "64MiB"])
def test_echo_is_byte_exact_both_ways(sluice, backends, size):
    echo = backends(harness.echo_handler)
    s = sluice([listener()], {"up": upstream(echo)})
    payload = os.urandom(size)
    want = hashlib.sha256(payload).hexdigest()

    got = harness.exchange(*s.addr(), payload, timeout=120)

    assert len(got) == size
    assert hashlib.sha256(got).hexdigest() == want, "client received different bytes"
    harness.wait_until(lambda: echo.received_sha, what="backend to see EOF")
    assert echo.received_sha == [want], "backend received different bytes"
    (rec,) = s.wait_records(1)
    assert rec["listener"] == "main"
    assert rec["server"] == echo.address
    assert int(rec["bytes_in"]) == size
    assert int(rec["bytes_out"]) == size
    assert rec["tries"] == "1"
    assert rec["cause"] == "client_closed"


def test_many_concurrent_sessions_keep_their_own_bytes(sluice, backends):
    echo = backends(harness.echo_handler)
    s = sluice([listener()], {"up": upstream(echo)})
    n = 50
    rng = random.Random(1234)
    payloads = [os.urandom(rng.randint(1, 256 * 1024)) for _ in range(n)]
    results = harness.exchange_concurrently(*s.addr(), payloads, timeout=60, together=True)

    for i, (p, r) in enumerate(zip(payloads, results)):
        assert not isinstance(r, BaseException), f"session {i}: {r!r}"
        assert r is not None and len(r) == len(p), f"session {i}: length differs"
        assert r == p, f"session {i}: bytes differ"

    recs = s.wait_records(n)
    assert len(recs) == n
    assert sorted(int(r["bytes_in"]) for r in recs) == sorted(len(p) for p in payloads)
    assert all(r["bytes_in"] == r["bytes_out"] for r in recs)
    assert len({r["client"] for r in recs}) == n, "each session has its own client address"
    assert all(r["cause"] == "client_closed" for r in recs)
    assert echo.counts() == (n, 0)


def test_half_close_client_still_receives_full_reply(sluice, backends):
    be = backends(harness.reply_after_eof_handler)
    s = sluice([listener()], {"up": upstream(be)})
    data = os.urandom(300 * 1024)
    expected = harness.reply_after_eof(data)

    c = s.connect()
    try:
        c.sendall(data)
        c.shutdown(socket.SHUT_WR)
        # The backend only answers after it has seen our FIN through sluice.
        got = harness.recv_all(c)
    finally:
        c.close()

    assert got == expected
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "client_closed"
    assert int(rec["bytes_in"]) == len(data)
    assert int(rec["bytes_out"]) == len(expected)


def test_server_close_first_is_server_closed(sluice, backends):
    def hello_then_close(backend, conn):
        conn.sendall(b"bye\n")

    be = backends(hello_then_close)
    s = sluice([listener()], {"up": upstream(be)})
    c = s.connect()
    try:
        assert harness.recv_all(c) == b"bye\n"
        c.shutdown(socket.SHUT_WR)
    finally:
        c.close()
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "server_closed"
    assert rec["bytes_out"] == "4"


def test_slow_reader_keeps_memory_bounded(sluice, backends):
    total = 512 * MiB
    source = harness.StreamSource(total, os.urandom(MiB))
    be = backends(source)
    echo = backends(harness.echo_handler)
    s = sluice([listener("main"), listener("warm", upstream="echo")],
               {"up": upstream(be), "echo": upstream(echo)})

    # One ordinary 4 MiB session first, so buffer pools and the log file exist
    # before the baseline is taken.
    warm = os.urandom(4 * MiB)
    assert harness.exchange(*s.addr("warm"), warm) == warm
    s.wait_records(1)
    baseline = s.rss_kb()

    c = harness.connect(*s.addr(), timeout=120, rcvbuf=64 * 1024)
    try:
        # Wait until the backend's writes stall: `sent` stops moving.
        def stalled():
            before = source.sent
            time.sleep(0.5)
            return before > 0 and source.sent == before
        harness.wait_until(stalled, timeout=30, interval=0, what="backend sends to stall")
        stalled_at = source.sent
        grown_kb = s.rss_kb() - baseline

        assert stalled_at < 64 * MiB, (
            f"backend pushed {stalled_at / MiB:.1f} MiB into a client that reads nothing")
        assert grown_kb < 32 * 1024, f"sluice RSS grew by {grown_kb / 1024:.1f} MiB"

        # Now read everything: it all arrives, in order, in bounded time.
        h = hashlib.sha256()
        buf = bytearray(MiB)
        got = 0
        deadline = time.monotonic() + 90
        while got < total:
            assert time.monotonic() < deadline, f"only {got} of {total} bytes after 90s"
            n = c.recv_into(buf)
            assert n > 0, f"EOF after {got} of {total} bytes"
            h.update(memoryview(buf)[:n])
            got += n
        assert c.recv(1) == b"", "extra bytes after the stream"
        assert source.done.is_set()
        assert h.hexdigest() == source.sha.hexdigest()
    finally:
        c.close()
    (rec,) = s.wait_records(1, pred=lambda r: r["listener"] == "main")
    assert int(rec["bytes_out"]) == total
    assert rec["cause"] == "server_closed"
