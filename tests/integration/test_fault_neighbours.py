"""A fault on some sessions must not slow down the others on the same
worker. sluice runs one worker; a neighbouring session downloads from a fast
source through it while, on another listener of the same worker, sessions
suffer one of the loopback faults the other files test for behaviour:

- servers that reset mid-stream, one session after another;
- servers that accept and never read, with clients pushing into them;
- clients that read very slowly from a fast source.

The neighbour's throughput during the fault must stay above a generous share
of what it was before (neighbour.MIN_SHARE), and each fault must really
have happened (counted on the faulty sessions themselves)."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

import harness
import loadgen
import neighbour
from harness import listener, upstream

SESSIONS = 16   # faulty sessions at a time (never-reading servers, slow readers)


def rst_after_64k(backend: harness.Backend, conn: socket.socket):
    """Reads 64 KiB of what the client pushes (or up to its end), then
    resets the connection."""
    left = 64 * 1024
    while left > 0:
        chunk = conn.recv(left)
        if not chunk:
            break
        left -= len(chunk)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class Fault:
    """Runs the faulty sessions from threads until stop(); counts events."""

    def __init__(self):
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.count = 0

    def add(self, n: int = 1):
        with self.lock:
            self.count += n

    def spawn(self, fn, *args):
        t = threading.Thread(target=fn, args=args, daemon=True)
        self.threads.append(t)
        t.start()

    def stop(self):
        self.stop_event.set()
        for t in self.threads:
            t.join(10)
        assert not any(t.is_alive() for t in self.threads), "a faulty session's thread did not end"


def resetting_sessions(s: harness.Sluice, fault: Fault):
    """One session after another, each pushing until its server resets it."""
    block = b"r" * 65536
    while not fault.stop_event.is_set():
        c = s.connect("far")
        try:
            while not fault.stop_event.is_set():
                c.sendall(block)
        except OSError:
            fault.add()  # reset (or closed) by sluice after the server's reset
        finally:
            c.close()


def pushing_session(s: harness.Sluice, fault: Fault):
    """Pushes into a server that never reads, until sending blocks."""
    c = s.connect("far")
    c.settimeout(0.2)
    block = b"n" * 65536
    try:
        while not fault.stop_event.is_set():
            try:
                c.send(block)
            except socket.timeout:
                fault.add()  # backpressure reached the client: the fault is in place
                fault.stop_event.wait()
    finally:
        c.close()


def slow_reader(s: harness.Sluice, fault: Fault):
    """Reads 4 KiB every 20 ms from a source that could send gigabytes."""
    c = s.connect("far")
    try:
        while not fault.stop_event.is_set():
            if c.recv(4096):
                fault.add()
            time.sleep(0.02)
    finally:
        c.close()


@pytest.fixture
def sources():
    started: list[loadgen.Server] = []

    def make():
        started.append(loadgen.Server("source"))
        return started[-1]

    yield make
    for src in started:
        src.stop()


@pytest.mark.parametrize("kind", ["server_reset", "never_reads", "slow_reader"])
def test_neighbour_keeps_its_throughput_during_a_fault(sluice, backends, sources, kind):
    near = sources()
    release = threading.Event()  # lets the never-reading servers go at the end
    if kind == "server_reset":
        far = backends(rst_after_64k, name="resetter").address
    elif kind == "never_reads":
        far = backends(lambda backend, conn: release.wait(30), name="sink").address
    else:
        far = sources().address
    s = sluice([listener("near", "near"), listener("far", "far")],
               {"near": upstream(near.address), "far": upstream(far)},
               global_={"workers": 1})

    meter = neighbour.Meter(s.connect("near"))
    fault = Fault()
    try:
        before = meter.measure(neighbour.WINDOW_S)
        if kind == "server_reset":
            fault.spawn(resetting_sessions, s, fault)
        else:
            for _ in range(SESSIONS):
                fault.spawn(pushing_session if kind == "never_reads" else slow_reader, s, fault)
        # Measured once the fault is in place: a few resets done, every
        # pushing client held back, every slow reader reading.
        need = 5 if kind == "server_reset" else SESSIONS
        harness.wait_until(lambda: fault.count >= need, what=f"{need} {kind} events")
        during = meter.measure(neighbour.WINDOW_S)
    finally:
        release.set()
        fault.stop()
        meter.stop()
    print(f"{kind}: {fault.count} fault events; neighbour {before / 1e6:.0f} MB/s before, "
          f"{during / 1e6:.0f} MB/s during")
    if kind == "server_reset":
        # sluice saw them as resets too.
        s.wait_records(5, pred=lambda r: r["listener"] == "far" and r["cause"] == "server_reset")
    neighbour.assert_kept_pace(before, during, kind.replace("_", " "))
