"""half_close = false: the first FIN, once the bytes before it are delivered,
ends the session (nginx's default); with the default (true) the other
direction goes on, which tests/integration/test_bytes.py covers."""

from __future__ import annotations

import hashlib
import os
import queue
import socket
import time

import harness
from harness import listener, upstream

KiB = 1 << 10


def reads_to_eof_then_answers(seen: queue.Queue):
    """Reads to EOF, reports what it read and how the read ended, then tries
    to answer (an answer that comes too late for a closed session)."""
    def handler(backend, conn):
        try:
            data, ended = harness.recv_all(conn), "eof"
        except ConnectionResetError:
            data, ended = b"", "reset"
        seen.put((hashlib.sha256(data).hexdigest(), len(data), ended))
        try:
            conn.sendall(b"too late\n")
        except OSError:
            pass
    return handler


def test_client_fin_ends_the_session_once_its_bytes_are_delivered(sluice, backends):
    seen: queue.Queue = queue.Queue()
    be = backends(reads_to_eof_then_answers(seen))
    s = sluice([listener(half_close=False)], {"up": upstream(be)})
    data = os.urandom(300 * KiB)

    # The server answers only after our FIN reached it; the session is over
    # by then, so the client sees a clean EOF and nothing else.
    assert harness.exchange(*s.addr(), data, timeout=10) == b""
    sha, n, ended = seen.get(timeout=10)
    assert (n, sha, ended) == (len(data), hashlib.sha256(data).hexdigest(), "eof")
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "client_closed"
    assert int(rec["bytes_in"]) == len(data)
    assert int(rec["bytes_out"]) == 0


def test_server_fin_ends_the_session_after_a_slow_reader_took_every_byte(sluice, backends):
    body = os.urandom(4 << 20)  # more than sluice queues: the FIN waits behind backpressure

    def send_then_close(backend, conn):
        conn.sendall(body)

    be = backends(send_then_close)
    s = sluice([listener(half_close=False)], {"up": upstream(be)})
    c = s.connect(timeout=10)
    try:
        time.sleep(0.5)  # let the kernel's buffers and sluice's queue fill
        got = harness.recv_all(c)
        # The client has not closed its side: the session ended on the
        # server's FIN alone (with half-close it would wait for the client).
        (rec,) = s.wait_records(1, timeout=5)
    finally:
        c.close()

    assert hashlib.sha256(got).digest() == hashlib.sha256(body).digest()
    assert rec["cause"] == "server_closed"
    assert int(rec["bytes_out"]) == len(body)
    assert int(rec["bytes_in"]) == 0


def test_with_half_close_the_session_outlives_the_server_fin(sluice, backends):
    # The contrast: by default the client can still send after the server's
    # FIN, and its bytes arrive (the server reads after shutting down its side).
    got_after: queue.Queue = queue.Queue()

    def fin_then_read(backend, conn):
        conn.sendall(b"bye\n")
        conn.shutdown(socket.SHUT_WR)
        got_after.put(harness.recv_all(conn))

    be = backends(fin_then_read)
    s = sluice([listener()], {"up": upstream(be)})
    c = s.connect(timeout=10)
    try:
        assert harness.recv_all(c) == b"bye\n"
        c.sendall(b"still talking")
        c.shutdown(socket.SHUT_WR)
        assert got_after.get(timeout=10) == b"still talking"
    finally:
        c.close()
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "server_closed"
    assert int(rec["bytes_in"]) == len(b"still talking")
