"""`loadgen open`, the benchmark's open loop: requests go out on schedule
whatever the target does, and each is timed from when it was due, so one
stall of the target shows in every request due during it (a closed loop
would time only the one request it was waiting for)."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time

import loadgen

STALL_S = 0.6


def run_open(target: str, *args: str, timeout: float = 60) -> dict:
    res = subprocess.run([str(loadgen.path()), "open", "--target", target, *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    lines = [l for l in res.stdout.decode().splitlines() if l.startswith("{")]
    assert lines, res.stderr.decode()
    return json.loads(lines[-1])


class StallingEcho:
    """Echoes on one connection, but once, after the first request, stops
    reading for STALL_S seconds."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.sock.accept()
        conn.settimeout(30)
        stalled = False
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                if not stalled:
                    stalled = True
                    time.sleep(STALL_S)
                conn.sendall(data)
        except OSError:
            return
        finally:
            conn.close()

    def close(self):
        self.sock.close()
        self.thread.join(10)


def test_every_request_is_answered_at_the_offered_rate():
    server = loadgen.Server("echo")
    try:
        for mode in ("rr", "conn"):
            r = run_open(server.address, "--mode", mode, "--rate", "300", "--duration", "1",
                         "--warmup", "0.2")
            assert r["errors"] == 0 and r["unfinished"] == 0, r
            assert r["scheduled"] == 300, r
            assert r["requests"] == r["scheduled"], r
            assert 0 < r["timed"] < r["scheduled"], r  # the warm-up is sent, not timed
            assert 0 < r["p50_us"] <= r["p99_us"] <= r["p999_us"] <= r["max_us"], r
    finally:
        server.stop()


def test_a_stall_counts_in_every_request_due_during_it():
    server = StallingEcho()
    try:
        # One connection, one request in flight: while the server stalls,
        # the requests due meanwhile wait in the generator's queue.
        r = run_open(server.address, "--mode", "rr", "--connections", "1", "--rate", "200",
                     "--duration", "2", "--warmup", "0", "--drain", "10")
    finally:
        server.close()
    assert r["errors"] == 0 and r["unfinished"] == 0, r
    assert r["requests"] == r["scheduled"] == 400, r
    # About STALL_S * 200 = 120 of the 400 requests were due during the
    # stall; the one due at its start waited STALL_S, the later ones less.
    # More than 10 % of them waited over a sixth of the stall: a loop that
    # timed from the actual send would show one slow request, not dozens.
    assert r["p90_us"] >= STALL_S / 6 * 1e6, r
    assert r["max_us"] >= STALL_S * 0.9 * 1e6, r


def test_a_keep_alive_connection_the_far_side_closes_is_a_cut_session():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    address = f"127.0.0.1:{sock.getsockname()[1]}"

    def serve_then_close():
        conn, _ = sock.accept()
        conn.settimeout(30)
        try:
            for _ in range(5):
                data = conn.recv(65536)
                if not data:
                    return
                conn.sendall(data)
        except OSError:
            pass
        conn.close()  # ends the session mid-run
        # later connections are accepted and echoed
        while True:
            try:
                c, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(c,), daemon=True).start()

    def echo(c):
        c.settimeout(30)
        try:
            while data := c.recv(65536):
                c.sendall(data)
        except OSError:
            pass
        c.close()

    t = threading.Thread(target=serve_then_close, daemon=True)
    t.start()
    try:
        r = run_open(address, "--mode", "rr", "--connections", "1", "--rate", "100",
                     "--duration", "1", "--warmup", "0")
    finally:
        sock.close()
    assert r["cuts"] >= 1, r
    assert r["connects"] >= 2, r  # it connected again and went on
    assert r["requests"] > 10, r
