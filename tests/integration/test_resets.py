"""A reset on one side reaches the other side as a reset, never as a clean FIN.

A client (or server) that sees a normal end of stream takes what it got for
the whole reply (or request). When the other peer aborted, sluice must say
so the only way TCP can: by resetting its side too. These run in copy mode
and, in the suite's splice pass, with every listener splicing.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import harness
from harness import listener, upstream

MiB = 1 << 20
LINGER_RESET = struct.pack("ii", 1, 0)


def read_to_end(sock: socket.socket, timeout: float = 20.0) -> tuple[int, str]:
    """Reads until the stream ends; returns (bytes, "eof" | "reset")."""
    sock.settimeout(timeout)
    n = 0
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except (ConnectionResetError, BrokenPipeError):
            return n, "reset"
        if not chunk:
            return n, "eof"
        n += len(chunk)


def test_a_server_reset_reaches_the_client_as_a_reset(sluice, backends):
    def reply_then_reset(backend, conn):
        conn.recv(16)
        conn.sendall(b"r" * 1000)
        time.sleep(0.2)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
        conn.close()

    be = backends(reply_then_reset)
    s = sluice([listener()], {"up": upstream(be)})
    c = s.connect()
    c.sendall(b"hello")
    _, end = read_to_end(c)
    assert end == "reset", "the client saw a clean end although the server reset"
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "server_reset"


def test_a_reset_behind_unread_data_is_still_a_reset(sluice, backends):
    """The server queues more than the client reads, then resets. sluice has
    stopped reading it (backpressure) when the reset arrives, and must not
    take the end of the readable bytes for a FIN."""
    queued = threading.Event()

    def flood_then_reset(backend, conn):
        conn.setblocking(False)
        sent = 0
        deadline = time.monotonic() + 10
        while sent < 64 * MiB and time.monotonic() < deadline:
            try:
                sent += conn.send(b"d" * 65536)
            except BlockingIOError:
                if sent >= 8 * MiB:
                    break
                time.sleep(0.01)
        queued.set()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
        conn.close()

    be = backends(flood_then_reset)
    s = sluice([listener()], {"up": upstream(be)})
    c = harness.connect(*s.addr(), rcvbuf=64 * 1024)
    assert queued.wait(20), "the server could not queue its bytes"
    time.sleep(0.3)  # the reset is in before anyone reads
    got, end = read_to_end(c)
    assert end == "reset", f"the client read {got} bytes and a clean end although the server reset"
    c.close()
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "server_reset"


def test_a_client_reset_reaches_the_server_as_a_reset(sluice, backends):
    ends = []

    def reader(backend, conn):
        ends.append(read_to_end(conn))

    be = backends(reader)
    s = sluice([listener()], {"up": upstream(be)})
    c = s.connect()
    c.sendall(os.urandom(MiB))
    time.sleep(0.2)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
    c.close()
    harness.wait_until(lambda: ends, what="the server to see the end")
    got, end = ends[0]
    assert end == "reset", f"the server read {got} bytes and a clean end although the client reset"
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "client_reset"
