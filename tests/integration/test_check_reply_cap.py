"""Every active check reads at most 64 KiB from a server (docs/health.md):
a port that announces a huge Redis bulk string, PostgreSQL message or MySQL
packet and then streams bytes (or, for MySQL, only announces it) takes the
server down with a reason naming the cap, and sluice's memory stays small
while it tries."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

import harness
from harness import listener, upstream

MiB = 1 << 20
# Far below what the stream would cost without the cap (hundreds of MiB in
# one check), far above what a check may hold with it.
RSS_GROWTH_MAX_KIB = 48 * 1024
CHUNK = b"x" * (1 << 20)


def stream_until_closed(conn: socket.socket, stop: threading.Event) -> None:
    conn.settimeout(5.0)
    try:
        while not stop.is_set():
            conn.sendall(CHUNK)
    except OSError:
        pass  # the check gave up: that is the point


def redis_handler(stop: threading.Event):
    """Answers the first command with "$2000000000" and then streams bytes."""
    def handle(backend, conn):
        if not conn.recv(4096):
            return
        conn.sendall(b"$2000000000\r\n")
        stream_until_closed(conn, stop)
    return handle


def recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def postgres_handler(stop: threading.Event):
    """Speaks just enough PostgreSQL to be read by libpq: refuses TLS, takes
    the startup packet, lets the user in, then announces a notice of 1 GiB
    (libpq waits for a message whole) and streams its bytes."""
    def handle(backend, conn):
        try:
            (length,) = struct.unpack("!I", recv_exact(conn, 4))
            body = recv_exact(conn, length - 4)
            if body[:4] == struct.pack("!I", 80877103):  # SSLRequest
                conn.sendall(b"N")
                (length,) = struct.unpack("!I", recv_exact(conn, 4))
                recv_exact(conn, length - 4)
        except (EOFError, OSError):
            return
        conn.sendall(b"R" + struct.pack("!II", 8, 0))  # AuthenticationOk
        conn.sendall(b"N" + struct.pack("!I", 1 << 30))
        stream_until_closed(conn, stop)
    return handle


def mysql_announcer(stop: threading.Event, stream: bool):
    """Greets, lets any login in, then answers the first query with a packet
    header that announces 16 MiB - 1 (the most one MySQL packet can say) and
    streams its bytes, or sends nothing more."""
    caps = 0x1 | 0x4 | 0x200 | 0x2000 | 0x8000 | 0x20000 | 0x80000
    salt = b"0123456789abcdefghij"
    greeting = (b"\x0a8.0.36\x00" + struct.pack("<I", 7) + salt[:8] + b"\x00" + struct.pack("<H", caps & 0xFFFF) +
                b"\x21" + struct.pack("<H", 2) + struct.pack("<H", caps >> 16) + bytes([21]) + b"\x00" * 10 +
                salt[8:] + b"\x00" + b"mysql_native_password\x00")

    def packet(seq: int, payload: bytes) -> bytes:
        return struct.pack("<I", len(payload))[:3] + bytes([seq]) + payload

    def handle(backend, conn):
        try:
            conn.sendall(packet(0, greeting))
            conn.recv(65536)  # the login
            conn.sendall(packet(2, b"\x00\x00\x00\x02\x00\x00\x00"))  # OK
            conn.recv(65536)  # the first query
            conn.sendall(b"\xff\xff\xff\x01" + b"\x01")
        except OSError:
            return
        if stream:
            stream_until_closed(conn, stop)
            return
        stop.wait(30)
    return handle


@pytest.mark.parametrize("kind", ["redis", "postgres", "mysql", "mysql_announced"])
def test_a_reply_that_never_ends_is_cut_at_the_cap(sluice, backends, kind):
    """mysql_announced: Connector/C sizes its buffer from a packet's header
    before the bytes come (up to 1 GiB by default); the check sets its
    max_allowed_packet to the cap, so a packet that only announces 16 MiB
    fails at once, with nothing allocated for it, not at the timeout."""
    stop = threading.Event()
    handler = {"redis": redis_handler, "postgres": postgres_handler}.get(kind)
    handler = handler(stop) if handler else mysql_announcer(stop, stream=kind == "mysql")
    flood = backends(handler, name="flood")
    health = {"type": kind.split("_")[0], "interval": "300ms", "timeout": "3s", "rise": 1, "fall": 1,
              "jitter": "0%"}
    if health["type"] == "mysql":
        health["user"] = "monitor"
    s = sluice([listener()], {"up": upstream(flood, health=health)})
    try:
        before = s.rss_kb()
        m = s.log.wait_for(rf"server {flood.address} marked down \(active check\): (.*) \(detected", timeout=15)
        assert m.group(1) == "reply over the 64 KiB cap", m.group(0)
        # Several more checks meet the same stream.
        harness.wait_until(lambda: flood.counts()[0] >= 4, timeout=15, what="four checks")
        grown = s.rss_kb() - before
        assert grown < RSS_GROWTH_MAX_KIB, f"RSS grew by {grown} KiB while checking a flooding server"
        assert not s.log.matches(r"is up \(active check\)")
    finally:
        stop.set()
