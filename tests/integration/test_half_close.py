"""half_close = false: the first FIN, once the bytes before it are delivered,
ends the session (nginx's default); with the default (true) the other
direction goes on, which tests/integration/test_bytes.py covers."""

from __future__ import annotations

import hashlib
import os
import queue
import socket
import threading
import time

import harness
from harness import listener, upstream

KiB = 1 << 10
MiB = 1 << 20


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
    data = os.urandom(16 * KiB)  # the server's window takes it all at once

    # The server answers only after our FIN reached it; the session is over
    # by then, so the client sees a clean EOF and nothing else.
    assert harness.exchange(*s.addr(), data, timeout=10) == b""
    sha, n, ended = seen.get(timeout=10)
    assert (n, sha, ended) == (len(data), hashlib.sha256(data).hexdigest(), "eof")
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "client_closed"
    assert int(rec["bytes_in"]) == len(data)
    assert int(rec["bytes_out"]) == 0


def connect_to_sender(sluice, backends, body: bytes):
    """sluice (half_close = false) in front of a server that sends `body`
    and closes; returns sluice and a client connected through it."""
    def send_then_close(backend, conn):
        conn.sendall(body)

    be = backends(send_then_close)
    s = sluice([listener(half_close=False)], {"up": upstream(be)})
    return s, s.connect(timeout=10)


def test_server_fin_ends_the_session_without_the_client_closing(sluice, backends):
    body = os.urandom(16 * KiB)
    s, c = connect_to_sender(sluice, backends, body)
    try:
        got = harness.recv_all(c)
        # The client has not closed its side: the session ended on the
        # server's FIN alone (with half-close it would wait for the client).
        (rec,) = s.wait_records(1, timeout=5)
    finally:
        c.close()

    assert got == body
    assert rec["cause"] == "server_closed"
    assert int(rec["bytes_out"]) == len(body)
    assert int(rec["bytes_in"]) == 0


def test_a_slow_reader_gets_every_byte_before_the_server_fin(sluice, backends):
    body = os.urandom(4 << 20)  # more than sluice queues: the FIN waits behind backpressure
    s, c = connect_to_sender(sluice, backends, body)
    try:
        time.sleep(0.5)  # let the kernel's buffers and sluice's queue fill
        got = harness.recv_all(c)
    finally:
        c.close()

    assert hashlib.sha256(got).digest() == hashlib.sha256(body).digest()
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "server_closed"
    assert int(rec["bytes_out"]) == len(body)


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


def test_bytes_before_the_fin_arrive_although_the_server_had_more_to_say(sluice, backends):
    # The server talks first and a lot (the client does not read yet), and
    # reads slowly. When the client's FIN comes, sluice's socket to the
    # server still holds unread bytes from it, and the last of the client's
    # bytes still wait in sluice's kernel for the server's window: a
    # close(2) now would be a reset that drops them. sluice sends that FIN
    # with shutdown(2) and lets the session end as with half-close.
    seen: queue.Queue = queue.Queue()

    def talks_reads_slowly(backend, conn):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # a small window: bytes wait in sluice's kernel

        def talk():
            try:
                conn.sendall(os.urandom(8 << 20))
            except OSError:
                pass
        threading.Thread(target=talk, daemon=True).start()
        # The first MiB now, the rest once the client's FIN has come and
        # gone: by then sluice's kernel holds what the window did not take.
        data, ended = bytearray(), "eof"
        try:
            while len(data) < MiB:
                data += conn.recv(1 << 16)
            time.sleep(1.0)
            data += harness.recv_all(conn)
        except ConnectionResetError:
            ended = "reset"
        seen.put((hashlib.sha256(data).hexdigest(), len(data), ended))

    be = backends(talks_reads_slowly)
    s = sluice([listener(half_close=False)], {"up": upstream(be)})
    data = os.urandom(4 << 20)
    c = s.connect(timeout=20)
    try:
        c.sendall(data)
        c.shutdown(socket.SHUT_WR)
        try:
            harness.recv_all(c)
        except ConnectionResetError:
            pass
    finally:
        c.close()
    sha, n, ended = seen.get(timeout=20)
    assert (n, ended) == (len(data), "eof")
    assert sha == hashlib.sha256(data).hexdigest()
