"""A neighbouring session that must keep moving while another session on the
same sluice worker suffers a fault.

The neighbour downloads an endless stream whose every byte is known
(`source`, a backend handler: the letters a..z over and over) through sluice;
a reader thread checks each byte as it arrives and keeps (time, bytes)
samples. A test asserts progress and integrity, never speed: the machine
running the suite may be busy with other work, and a sluice that is really
broken here (a worker spinning, or blocked in a call) stops the neighbour
outright. How fast the neighbour goes is printed for the reader; the
share of throughput kept during a fault is measured by
`tools/bench.py --loads bulk_fault`."""

from __future__ import annotations

import bisect
import socket
import threading
import time
from dataclasses import dataclass

PERIOD = 26
# Whole periods, so that block after block the stream stays a..z, a..z, ...
BLOCK = bytes(ord("a") + i % PERIOD for i in range(PERIOD)) * ((1 << 20) // PERIOD)
# Any offset into the stream, then up to a read's worth of bytes.
READ_MAX = 1 << 20
EXPECTED = bytes(ord("a") + i % PERIOD for i in range(PERIOD)) * ((READ_MAX + 2 * PERIOD) // PERIOD)


def source(backend, conn: socket.socket):
    """Backend handler: sends the stream until the connection is closed."""
    try:
        while True:
            conn.sendall(BLOCK)
    except OSError:
        pass  # the neighbour's session ended: that is the end of the stream


# During a fault the neighbour must receive at least MIN_BYTES within the
# window and never wait longer than MAX_STALL_S for its next bytes. Both are
# generous: on an idle machine it moves hundreds of megabytes a second; on a
# loaded one far less, but it keeps moving.
WINDOW_S = 2.0
MIN_BYTES = 1 << 20
MAX_STALL_S = 1.0


@dataclass
class Window:
    seconds: float
    moved: int          # bytes received in the window
    longest_stall: float  # the longest time in the window without a byte

    @property
    def rate(self) -> float:
        return self.moved / self.seconds

    def __str__(self) -> str:
        return f"{self.rate / 1e6:.0f} MB/s, longest stall {self.longest_stall:.2f}s"


class Meter:
    """Reads a session to its end in a thread, checking every byte and keeping
    (time, bytes) samples."""

    SAMPLE_EVERY = 0.005

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.sock.settimeout(0.5)
        self.times: list[float] = [time.monotonic()]
        self.totals: list[int] = [0]
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        buf = bytearray(READ_MAX)
        total = 0
        try:
            while not self._stop.is_set():
                try:
                    n = self.sock.recv_into(buf)
                except socket.timeout:
                    continue
                if n == 0:
                    raise AssertionError("the neighbour's stream ended")
                at = total % PERIOD
                if buf[:n] != EXPECTED[at:at + n]:
                    bad = next(i for i in range(n) if buf[i] != EXPECTED[at + i])
                    raise AssertionError(f"the neighbour's stream is corrupt at byte {total + bad}")
                total += n
                now = time.monotonic()
                if now - self.times[-1] >= self.SAMPLE_EVERY:
                    self.times.append(now)
                    self.totals.append(total)
        except BaseException as e:  # reported by the test through window()
            self.error = e

    def _total_at(self, t: float) -> int:
        i = bisect.bisect_right(self.times, t) - 1
        return self.totals[max(i, 0)]

    def window(self, t0: float, t1: float) -> Window:
        """What arrived between t0 and t1 (monotonic times in the past)."""
        if self.error is not None:
            raise AssertionError(f"neighbour session failed: {self.error!r}")
        lo = bisect.bisect_right(self.times, t0)
        hi = bisect.bisect_left(self.times, t1)
        arrivals = [t0] + self.times[lo:hi] + [t1]
        stall = max(b - a for a, b in zip(arrivals, arrivals[1:]))
        return Window(t1 - t0, self._total_at(t1) - self._total_at(t0), stall)

    def measure(self, seconds: float = WINDOW_S) -> Window:
        """What arrives over the next `seconds`."""
        t0 = time.monotonic()
        time.sleep(seconds)
        return self.window(t0, time.monotonic())

    def stop(self):
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
        if self.error is not None:
            raise AssertionError(f"neighbour session failed: {self.error!r}")


def assert_kept_moving(before: Window, during: Window, what: str) -> None:
    """The neighbour moved before the fault, and kept moving during it."""
    print(f"neighbour before {what}: {before}; during: {during}")
    assert before.moved >= MIN_BYTES, f"the neighbour moved only {before.moved} bytes in {before.seconds:.1f}s before {what}"
    assert during.moved >= MIN_BYTES, (
        f"the neighbour moved only {during.moved} bytes in {during.seconds:.1f}s during {what} "
        f"(before: {before})")
    assert during.longest_stall <= MAX_STALL_S, (
        f"the neighbour received nothing for {during.longest_stall:.2f}s during {what} (before: {before})")
