"""A fault on some sessions must not hold up the others on the same worker.
sluice runs one worker; a neighbouring session downloads an endless stream
through it while, on another listener of the same worker, sessions
suffer one of the loopback faults the other files test for behaviour:

- servers that reset mid-stream, one session after another;
- servers that accept and never read, with clients pushing into them;
- servers that read very slowly (4 KiB every 50 ms) while clients upload;
- servers that answer, then stall until `idle_timeout` ends the session,
  one session after another;
- a server that refuses, so that every session moves to the next one;
- a black-holed server (SYNs dropped), so that every connect waits out
  `connect_timeout`;
- clients that read very slowly from a fast source.

During the fault the neighbour must keep moving: its bytes keep arriving,
whole and in order, with no long stall (neighbour.assert_kept_moving). Its
speed is printed, not asserted: on a busy machine it can fall far below what
it was before without anything being wrong; `tools/bench.py --loads
bulk_fault` measures the share kept. Each fault must really have happened (counted on the faulty
sessions themselves, and where sluice sees it, in its access records)."""

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
from test_limits import black_hole  # noqa: F401  (fixture)

SESSIONS = 16   # faulty sessions at a time (never-reading servers, slow readers)
# idle_timeout for the servers that answer, then stall. Each such session
# must end that long after its answer, give or take the moment the answer
# takes to reach the client and room for a loaded machine (late by
# STALL_LATE_S at most), while the neighbour streams on the same worker.
STALL_IDLE_S = 0.5
STALL_LATE_S = 2.0


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
        self.seconds: list[float] = []  # how long each timed event took

    def add(self, n: int = 1, seconds: float | None = None):
        with self.lock:
            self.count += n
            if seconds is not None:
                self.seconds.append(seconds)

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


def slow_server(backend: harness.Backend, conn: socket.socket):
    """Reads 4 KiB every 50 ms to the end of the upload."""
    while conn.recv(4096):
        time.sleep(0.05)


def answer_then_stall(backend: harness.Backend, conn: socket.socket):
    """Answers a request line with 64 KiB, then sends nothing more and keeps
    the connection open until sluice closes it."""
    harness.recv_line(conn)
    conn.sendall(b"a" * 65536)
    while conn.recv(4096):
        pass


def pushing_session(s: harness.Sluice, fault: Fault, keep_pushing: bool = False):
    """Pushes into a server that reads slowly or never, until sending blocks;
    with keep_pushing, goes on pushing whatever the server takes."""
    c = s.connect("far")
    c.settimeout(0.2)
    block = b"n" * 65536
    held = False
    try:
        while not fault.stop_event.is_set():
            try:
                c.send(block)
            except socket.timeout:
                if not held:
                    fault.add()  # backpressure reached the client: the fault is in place
                    held = True
                if not keep_pushing:
                    fault.stop_event.wait()
    finally:
        # A reset: a slow server must not keep the session draining after the test.
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()


def uploading_session(s: harness.Sluice, fault: Fault):
    pushing_session(s, fault, keep_pushing=True)


def stalled_sessions(s: harness.Sluice, fault: Fault):
    """One session after another: a request, the whole answer, then silence
    until sluice ends the session; counts how long the silence lasted."""
    while not fault.stop_event.is_set():
        c = s.connect("far")
        try:
            c.sendall(b"request\n")
            harness.recv_exact(c, 65536)
            t0 = time.monotonic()
            harness.wait_closed(c)
            fault.add(seconds=time.monotonic() - t0)
        finally:
            c.close()


def retried_sessions(s: harness.Sluice, fault: Fault):
    """One session after another, each refused by its first server and
    served by the next."""
    while not fault.stop_event.is_set():
        if harness.banner_of(s, "far") == b"good":
            fault.add()


def connecting_sessions(s: harness.Sluice, fault: Fault):
    """One session after another whose server never answers the SYN: each
    is held until connect_timeout, then closed."""
    while not fault.stop_event.is_set():
        c = s.connect("far")
        try:
            harness.seconds_until_closed(c, timeout=5)
            fault.add()
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


# kind -> (how many faulty sessions run at once, what each runs)
CLIENTS = {
    "server_reset": (1, resetting_sessions),
    "never_reads": (SESSIONS, pushing_session),
    "slow_server": (SESSIONS, uploading_session),
    "answers_then_stalls": (SESSIONS, stalled_sessions),
    "refuses": (1, retried_sessions),
    "black_holed": (SESSIONS, connecting_sessions),
    "slow_reader": (SESSIONS, slow_reader),
}
# What sluice must have logged for the faulty sessions: (cause, tries), None
# for either when it does not matter, or no entry when the faulty sessions
# do not end during the test.
RECORDED = {
    "server_reset": ("server_reset", None),
    "answers_then_stalls": ("idle_timeout", None),
    "refuses": (None, "2"),
    "black_holed": ("connect_failed", "1"),
}


@pytest.mark.parametrize("kind", list(CLIENTS))
def test_neighbour_keeps_moving_during_a_fault(sluice, backends, sources, black_hole, kind):  # noqa: F811
    near = backends(neighbour.source, name="near")
    release = threading.Event()  # lets the never-reading servers go at the end
    far_opts: dict = {}
    if kind == "server_reset":
        far = upstream(backends(rst_after_64k, name="resetter"))
    elif kind == "never_reads":
        far = upstream(backends(lambda backend, conn: release.wait(30), name="sink"))
    elif kind == "slow_server":
        slow = backends(slow_server, name="slow")
        slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        far = upstream(slow)
    elif kind == "answers_then_stalls":
        far = upstream(backends(answer_then_stall, name="staller"))
        far_opts = {"idle_timeout": f"{int(STALL_IDLE_S * 1000)}ms"}
    elif kind == "refuses":
        # The refusing server is the first choice of every session (the only
        # primary, and no passive health to leave it out); the retry goes to
        # the backup.
        refusing = f"127.0.0.1:{harness.dead_port()}"
        far = upstream(refusing, backends(harness.banner_handler, name="good"), max_fails=0)
        far["servers"][1]["backup"] = True
        far_opts = {"tries": 2}
    elif kind == "black_holed":
        # SYNs dropped: every connect waits out connect_timeout.
        far = upstream(black_hole().address, max_fails=0)
        far_opts = {"connect_timeout": "300ms", "tries": 1}
    else:
        far = upstream(sources().address)
    s = sluice([listener("near", "near"), listener("far", "far", **far_opts)],
               {"near": upstream(near.address), "far": far},
               global_={"workers": 1})

    meter = neighbour.Meter(s.connect("near"))
    fault = Fault()
    threads, client = CLIENTS[kind]
    try:
        before = meter.measure()
        for _ in range(threads):
            fault.spawn(client, s, fault)
        # Measured once the fault is in place: a few sessions through it
        # where they follow one another, else every faulty session held back
        # (pushing clients), reading (slow readers) or ended (stalls).
        need = 5 if threads == 1 else SESSIONS
        harness.wait_until(lambda: fault.count >= need, what=f"{need} {kind} events")
        during = meter.measure()
    finally:
        release.set()
        fault.stop()
        meter.stop()
    timed = f" (each {min(fault.seconds):.2f}..{max(fault.seconds):.2f}s)" if fault.seconds else ""
    print(f"{kind}: {fault.count} fault events{timed}")
    if kind in RECORDED:
        cause, tries = RECORDED[kind]

        def as_made(r: dict) -> bool:
            return r["listener"] == "far" and cause in (None, r["cause"]) and tries in (None, r["tries"])
        # sluice saw the faults as the test made them.
        s.wait_records(need, pred=as_made)
    if kind == "answers_then_stalls":
        quiet = fault.seconds
        assert STALL_IDLE_S - 0.1 <= min(quiet) and max(quiet) <= STALL_IDLE_S + STALL_LATE_S, \
            f"stalled sessions ended {min(quiet):.2f}..{max(quiet):.2f}s after the answer, " \
            f"idle_timeout={STALL_IDLE_S}s"
    neighbour.assert_kept_moving(before, during, kind.replace("_", " "))
