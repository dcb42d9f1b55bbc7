"""splice = "pipe" | "auto": bytes move socket -> pipe -> socket with splice(2).

The whole suite also runs with every listener splicing (tools/test.sh sets
SLUICE_TEST_SPLICE); these tests check what only splicing can show: that the
kernel path is really taken (sluice holds pipes while it splices, and only
then), and that it keeps the copy mode's promises where its own code differs
(bounded buffering, half-close, resets, the preread replay before the switch).
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from pathlib import Path

import pytest

import harness
from harness import listener, upstream

MiB = 1 << 20
DATA = Path(__file__).resolve().parent.parent / "data"


def pipe_fds(pid: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("pipe:"):
                n += 1
        except OSError:
            pass  # closed meanwhile
    return n


def echo_once(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(payload)
    assert harness.recv_exact(sock, len(payload)) == payload


def pump_both_ways(sock: socket.socket, payload: bytes, timeout: float = 60.0) -> bytes:
    """Sends payload, then FIN, while reading everything that comes back."""
    got = bytearray()
    done = threading.Event()

    def reader():
        sock.settimeout(timeout)
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            got.extend(chunk)
        done.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    sock.sendall(payload)
    sock.shutdown(socket.SHUT_WR)
    assert done.wait(timeout), "reply did not end in time"
    return bytes(got)


def test_pipe_mode_splices_from_the_start_and_is_byte_exact(sluice, backends):
    echo = backends(harness.echo_handler)
    s = sluice([listener(splice="pipe")], {"up": upstream(echo)})
    base = pipe_fds(s.pid)
    c = s.connect()
    echo_once(c, b"x")
    # Two pipes (four descriptors), one per direction, while the session lives.
    harness.wait_until(lambda: pipe_fds(s.pid) >= base + 4, what="sluice to splice")
    payload = os.urandom(32 * MiB)
    got = pump_both_ways(c, payload)
    c.close()
    assert len(got) == len(payload)
    assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()
    (rec,) = s.wait_records(1)
    assert int(rec["bytes_in"]) == len(payload) + 1
    assert int(rec["bytes_out"]) == len(payload) + 1
    assert rec["cause"] == "client_closed"


def test_auto_mode_copies_requests_and_splices_streams(sluice, backends):
    echo = backends(harness.echo_handler)
    s = sluice([listener(splice="auto")], {"up": upstream(echo)})
    base = pipe_fds(s.pid)

    # Request/response traffic stays in copy mode: no pipe ever.
    c = s.connect()
    for i in range(300):
        echo_once(c, os.urandom(1024))
        if i % 50 == 0:
            assert pipe_fds(s.pid) == base, "a request/response session was spliced"
    assert pipe_fds(s.pid) == base
    c.close()

    # A stream is switched over after enough full-buffer reads.
    c = s.connect()
    first = os.urandom(8 * MiB)
    reader_got = bytearray()

    def reader():
        c.settimeout(60)
        while True:
            chunk = c.recv(1 << 16)
            if not chunk:
                break
            reader_got.extend(chunk)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    c.sendall(first)
    harness.wait_until(lambda: pipe_fds(s.pid) >= base + 4, what="sluice to switch to splice")
    rest = os.urandom(8 * MiB)
    c.sendall(rest)
    c.shutdown(socket.SHUT_WR)
    t.join(60)
    assert not t.is_alive()
    assert bytes(reader_got) == first + rest, "bytes differ across the switch"
    recs = s.wait_records(2)
    assert sorted(int(r["bytes_in"]) for r in recs) == [300 * 1024, 16 * MiB]
    assert all(r["bytes_in"] == r["bytes_out"] for r in recs)
    assert all(r["cause"] == "client_closed" for r in recs)


@pytest.mark.parametrize("mode", ["pipe", "auto"])
def test_half_close_and_reply_after_eof(sluice, backends, mode):
    be = backends(harness.reply_after_eof_handler)
    s = sluice([listener(splice=mode)], {"up": upstream(be)})
    payload = os.urandom(4 * MiB)
    got = harness.exchange(*s.addr(), payload, timeout=60)
    assert got == harness.reply_after_eof(payload)
    (rec,) = s.wait_records(1)
    assert int(rec["bytes_in"]) == len(payload)
    assert int(rec["bytes_out"]) == len(got)
    assert rec["cause"] == "client_closed"


def test_server_reset_mid_stream_is_a_reset(sluice, backends):
    def reset_after_1mib(backend, conn):
        n = 0
        while n < MiB:
            chunk = conn.recv(1 << 16)
            if not chunk:
                return
            n += len(chunk)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        conn.close()

    be = backends(reset_after_1mib)
    s = sluice([listener(splice="pipe")], {"up": upstream(be)})
    c = s.connect()
    c.settimeout(30)
    with pytest.raises(OSError):
        for _ in range(256):  # at most 64 MiB: the reset must arrive long before
            c.sendall(os.urandom(256 * 1024))
        c.recv(1)  # an EOF instead of the reset would return b"" here
        raise AssertionError("no reset reached the client")
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "server_reset"
    assert int(rec["bytes_in"]) >= MiB


def test_a_stopped_reader_stops_the_writer(sluice, backends):
    """A pipe is bounded: the server cannot push more than the kernel buffers
    (socket buffers on both legs plus one pipe) while the client reads nothing."""
    total = 256 * MiB
    sent = [0]

    def pusher(backend, conn):
        block = os.urandom(MiB)
        conn.settimeout(60)
        try:
            while sent[0] < total:
                conn.sendall(block)
                sent[0] += len(block)
        except OSError:
            pass
        conn.shutdown(socket.SHUT_WR)

    be = backends(pusher)
    s = sluice([listener(splice="pipe")], {"up": upstream(be)})
    c = harness.connect(*s.addr(), rcvbuf=64 * 1024)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    harness.wait_until(lambda: sent[0] > 0, what="server to start pushing")
    time.sleep(1.0)
    stalled_at = sent[0]
    time.sleep(1.0)
    assert sent[0] == stalled_at, "the server kept writing while nobody read"
    assert stalled_at <= 64 * MiB, f"{stalled_at} bytes buffered for a stopped reader"
    got = harness.recv_all(c)
    assert len(got) == total
    c.close()
    (rec,) = s.wait_records(1)
    assert int(rec["bytes_out"]) == total
    assert rec["cause"] == "server_closed"


def test_tls_preread_replays_the_hello_then_splices(sluice, backends):
    hello = (DATA / "hello_openssl_tls13_sni.bin").read_bytes()
    echo = backends(harness.echo_handler)
    s = sluice([listener("tls", None, preread="tls", splice="pipe",
                         routes=[{"sni": "tls13.example.com", "upstream": "up"}])],
               {"up": upstream(echo)})
    base = pipe_fds(s.pid)
    c = s.connect()
    echo_once(c, hello)
    harness.wait_until(lambda: pipe_fds(s.pid) >= base + 4, what="sluice to splice after the preread")
    payload = os.urandom(8 * MiB)
    got = pump_both_ways(c, payload)
    c.close()
    assert got == payload
    (rec,) = s.wait_records(1)
    assert rec["sni"] == "tls13.example.com"
    assert int(rec["bytes_in"]) == len(hello) + len(payload)
    assert int(rec["bytes_out"]) == len(hello) + len(payload)


def test_without_descriptors_for_pipes_the_session_keeps_copying(sluice, backends):
    echo = backends(harness.echo_handler)
    probe = sluice([listener(splice="pipe")], {"up": upstream(echo)}, name="probe")
    used = len(os.listdir(f"/proc/{probe.pid}/fd"))
    probe.stop()
    # Room for one session's two sockets and one descriptor more: not for a
    # pipe (two descriptors), let alone two.
    s = sluice([listener(splice="pipe")], {"up": upstream(echo)}, global_={"log_level": "debug"},
               nofile_cap=used + 3)
    assert len(os.listdir(f"/proc/{s.pid}/fd")) == used, "a different start-up descriptor count"
    payload = os.urandom(4 * MiB)
    got = harness.exchange(*s.addr(), payload, timeout=60)
    assert got == payload
    s.log.wait_for(r"splice unavailable, copying")
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "client_closed"
    assert int(rec["bytes_in"]) == len(payload) and int(rec["bytes_out"]) == len(payload)
