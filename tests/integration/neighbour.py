"""A neighbouring session's throughput, measured while another session on
the same sluice worker suffers a fault.

The neighbour downloads from `loadgen serve --mode source` (loadgen.Server)
through sluice and a reader thread counts what arrives; `rate()` gives
bytes per second over a window, from samples the reader takes as it goes."""

from __future__ import annotations

import bisect
import socket
import threading
import time


class Meter:
    """Reads a session to its end in a thread, keeping (time, bytes) samples."""

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
        buf = bytearray(1 << 20)
        total = 0
        try:
            while not self._stop.is_set():
                try:
                    n = self.sock.recv_into(buf)
                except socket.timeout:
                    continue
                if n == 0:
                    raise AssertionError("the neighbour's stream ended")
                total += n
                now = time.monotonic()
                if now - self.times[-1] >= self.SAMPLE_EVERY:
                    self.times.append(now)
                    self.totals.append(total)
        except BaseException as e:  # reported by the test through rate()
            self.error = e

    def _total_at(self, t: float) -> int:
        i = bisect.bisect_right(self.times, t) - 1
        return self.totals[max(i, 0)]

    def rate(self, t0: float, t1: float) -> float:
        """Bytes per second between t0 and t1 (monotonic times in the past)."""
        if self.error is not None:
            raise AssertionError(f"neighbour session failed: {self.error!r}")
        return (self._total_at(t1) - self._total_at(t0)) / (t1 - t0)

    def measure(self, seconds: float) -> float:
        """Bytes per second over the next `seconds`."""
        t0 = time.monotonic()
        time.sleep(seconds)
        return self.rate(t0, time.monotonic())

    def stop(self):
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


# The neighbour must keep at least this share of its throughput during a
# fault. Generous: the machine has two cores shared with other work, and a
# broken sluice (a worker spinning, or blocked in a call) drops it to near 0.
MIN_SHARE = 0.3
WINDOW_S = 1.0


def assert_kept_pace(before: float, during: float, what: str) -> None:
    assert before > 1e6, f"the neighbour moved only {before:.0f} B/s before {what}"
    assert during >= MIN_SHARE * before, (
        f"neighbour throughput fell from {before / 1e6:.1f} MB/s to {during / 1e6:.1f} MB/s "
        f"during {what} (want at least {MIN_SHARE:.0%})")
