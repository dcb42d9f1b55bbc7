"""Backend faults while streaming, one session each, with the cause it ends
with and when:

- a server that accepts and never reads while the client pushes: the queues
  fill, then nothing moves, and `idle_timeout` ends the session on time (a
  send queue that does not drain is inactivity);
- a server that reads very slowly (4 KiB every 50 ms) while the client
  uploads: bytes keep leaving sluice's queues, so `idle_timeout` must not
  cut it, and every byte arrives;
- a server that refuses: the session moves to the next server at once,
  without waiting for `connect_timeout`.

What these faults do to the other sessions of the worker is measured in
test_fault_neighbours.py."""

from __future__ import annotations

import hashlib
import os
import select
import socket
import threading
import time

import harness
from harness import listener, upstream

KiB = 1 << 10
MiB = 1 << 20

IDLE_S = 1.0
# When idle_timeout is due and sluice still has bytes in a socket's send
# queue, it looks again a quarter of idle_timeout later; a queue that has not
# shrunk by then ends the session. So a peer that stopped reading is cut
# between idle_timeout and 1.25 idle_timeout after the last byte moved.
RECHECK_S = IDLE_S / 4
# Room for a loaded two-core machine on top of that. A session that is not
# cut at all, or cut only by some later timer, takes far longer.
SLACK_S = 1.0


def push_until_closed(sock: socket.socket, deadline_s: float) -> tuple[int, float, float]:
    """Pushes into `sock` without blocking until sluice closes it. Returns
    (bytes pushed, time of the last send that took bytes, time the close was
    seen)."""
    sock.setblocking(False)
    block = b"n" * (256 * KiB)
    pushed = 0
    last_progress = time.monotonic()
    deadline = last_progress + deadline_s
    while True:
        now = time.monotonic()
        assert now < deadline, f"still open {deadline_s:.0f}s after it stopped moving"
        assert pushed < 256 * MiB, "sluice kept taking bytes that nobody reads"
        try:
            pushed += sock.send(block)
            last_progress = time.monotonic()
            continue
        except BlockingIOError:
            pass
        except (ConnectionResetError, BrokenPipeError):
            return pushed, last_progress, time.monotonic()
        # Nothing was taken: wait a little for room, or for sluice's close.
        readable, _, _ = select.select([sock], [], [], 0.01)
        if readable:
            try:
                if sock.recv(65536) == b"":
                    return pushed, last_progress, time.monotonic()
            except (ConnectionResetError, BrokenPipeError):
                return pushed, last_progress, time.monotonic()


def test_a_server_that_never_reads_is_cut_by_idle_timeout_on_time(sluice, backends):
    release = threading.Event()

    def never_reads(backend, conn):
        release.wait(30)
        # Then reads to the end, which comes once sluice has closed its side.
        while conn.recv(1 << 16):
            pass

    sink = backends(never_reads, name="sink")
    s = sluice([listener(idle_timeout=f"{IDLE_S:.0f}s")], {"up": upstream(sink)})
    c = s.connect()
    try:
        pushed, last_progress, closed_at = push_until_closed(c, IDLE_S + RECHECK_S + 10)
    finally:
        c.close()
    took = closed_at - last_progress
    (rec,) = s.wait_records(1)
    print(f"never reads: {pushed / MiB:.1f} MiB pushed, closed {took:.2f}s after the last byte moved, "
          f"cause {rec['cause']}")
    assert rec["cause"] == "idle_timeout", rec
    # The close came on time after the client's last send. It cannot be
    # measured from below as exactly: the client's kernel keeps taking
    # bytes into sluice's receive queue after sluice's last read (and may
    # open more window later, when it packs the queue), so the client's
    # last send can come well after sluice's last move. Seen at 0.38 s on
    # a loaded sanitizer build with splicing. From below, then: the session
    # lived at least idle_timeout, and most of it after the last send.
    # (That moving bytes re-arm the timer is the slow reader's test below.)
    assert float(rec["duration_ms"]) >= IDLE_S * 1000, rec
    assert IDLE_S / 2 <= took <= IDLE_S + RECHECK_S + SLACK_S, \
        f"closed {took:.2f}s after the last byte moved, with idle_timeout={IDLE_S:.0f}s"
    # sluice closed the server's side too.
    release.set()
    harness.wait_until(lambda: sink.counts() == (1, 0), what="the server's connection to end")


def test_a_very_slow_reader_is_not_cut_while_it_drains(sluice, backends):
    total = 256 * KiB
    payload = os.urandom(total)

    def slow_reader(backend, conn):
        """Reads 4 KiB every 50 ms (80 KiB/s) to the end of the upload, then
        answers with the count and SHA-256 of what it read."""
        h = hashlib.sha256()
        got = 0
        while True:
            chunk = conn.recv(4 * KiB)
            if not chunk:
                break
            h.update(chunk)
            got += len(chunk)
            time.sleep(0.05)
        conn.sendall(f"{got} {h.hexdigest()}\n".encode())

    be = backends(slow_reader, name="slow")
    # A small receive buffer on the server: the bytes wait in sluice's own
    # queues, where it can see them leave, not in the server's kernel. (What
    # a peer's kernel holds is acknowledged and gone as far as sluice can
    # tell, so a server that takes longer than idle_timeout to read its own
    # receive buffer looks idle to any proxy.)
    be.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * KiB)
    s = sluice([listener(idle_timeout=f"{IDLE_S:.0f}s")], {"up": upstream(be)})
    t0 = time.monotonic()
    reply = harness.exchange(*s.addr(), payload, timeout=30)
    took = time.monotonic() - t0
    (rec,) = s.wait_records(1)
    print(f"slow reader: {total / KiB:.0f} KiB in {took:.1f}s, cause {rec['cause']}")
    assert reply == f"{total} {hashlib.sha256(payload).hexdigest()}\n".encode(), (reply, rec)
    assert rec["cause"] == "client_closed", rec
    assert int(rec["bytes_in"]) == total, rec
    # The upload outlasted idle_timeout several times over.
    assert took > 2 * IDLE_S, f"the upload took only {took:.2f}s: the test did not outlast idle_timeout"


def test_a_refused_connect_moves_to_the_next_server_at_once(sluice, backends):
    good = backends(harness.banner_handler, name="good")
    refusing = f"127.0.0.1:{harness.dead_port()}"
    # The refusing server is the only primary, so it is the first choice
    # every time (with passive health off it stays eligible), and the retry
    # falls to the backup. (Weights alone would not do: least_conn's tie
    # rotation hands an idle lighter server a first pick now and then.) A
    # long connect_timeout shows that the move does not wait for it.
    up = upstream(refusing, good, max_fails=0)
    up["servers"][1]["backup"] = True
    s = sluice([listener(connect_timeout="5s", tries=2)], {"up": up})
    n = 5
    for i in range(n):
        t0 = time.monotonic()
        assert harness.banner_of(s) == b"good"
        took = time.monotonic() - t0
        # Well under connect_timeout (5s), however busy the machine.
        assert took < 2.5, f"session {i} took {took:.2f}s to be served after a refused connect"
    recs = s.wait_records(n)
    for rec in recs:
        assert rec["tries"] == "2" and rec["server"] == good.address, rec
        assert int(rec["connect_ms"]) < 250, rec
