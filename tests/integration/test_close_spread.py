"""[global] close_spread: sessions that sluice closes together at a deadline
are closed one by one over the window instead of in the same instant, so
that their clients do not all reconnect in the same second
(docs/operations.md, "Closing many sessions: close_spread").

A separate client process holds 1 000 idle sessions and records when each
is closed; the figures (closes per second of the window) are printed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import harness
import loadgen
from fixtures import default_global
from harness import listener, upstream

HOLDER = Path(__file__).with_name("conn_holder.py")
SESSIONS = 1000
WINDOW_S = 5.0
# How late a close may be seen after the window's end on a busy machine: the
# scheduling of sluice's worker and of the holder, not the spread.
LATE_S = 1.5
# No second of the window may hold more than this many times the average.
PEAK_FACTOR = 3.0


@pytest.fixture
def echo_backend():
    b = loadgen.Server("echo")
    yield b
    b.stop()


class Holder:
    """conn_holder.py: `count` idle sessions through `addr`."""

    def __init__(self, addr: tuple[str, int], count: int, seconds: float):
        self.proc = subprocess.Popen([sys.executable, str(HOLDER), addr[0], str(addr[1]), str(count), str(seconds)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.count = count
        self.seconds = seconds
        first = self.proc.stdout.readline()
        assert first.strip() == f"held {count}", (first, self.proc.stderr.read() if self.proc.poll() else "")

    def result(self) -> dict:
        out, err = self.proc.communicate(timeout=self.seconds + 30)
        assert self.proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def spread_figures(closed: list[float], start: float, window: float) -> list[int]:
    """Closes per second of the window that begins at `start` (one more
    slot for any close after the window, which should stay empty)."""
    per = [0] * (int(window) + 1)
    for t in closed:
        per[min(max(int(t - start), 0), int(window))] += 1
    return per


def assert_spread(closed: list[float], start: float, what: str, window: float = WINDOW_S) -> None:
    closed = sorted(closed)
    per = spread_figures(closed, start, window)
    avg = len(closed) / window
    first, last = closed[0] - start, closed[-1] - start
    print(f"\n{what}: {len(closed)} closes from {first:+.2f} s to {last:+.2f} s of the window; per second: "
          f"{per[:-1]} (average {avg:.0f}, peak {max(per[:-1])}), after the window: {per[-1]}")
    # Not before the deadline (a little slack for the clocks of two processes).
    assert first > -0.25, f"a session was closed {-first:.2f} s before the deadline"
    # None after the window (a busy machine may report the last ones late).
    assert last < window + LATE_S, f"the last close came {last:.2f} s into a {window:.0f} s window"
    # Spread: every second of the window has some, none holds more than a few times the average.
    assert min(per[:-1]) > 0, f"a second of the window had no close: {per}"
    assert max(per[:-1]) <= PEAK_FACTOR * avg, f"closes bunched: {per} (average {avg:.0f})"


def stop_holding(s, seconds: float) -> tuple[float, dict]:
    """SESSIONS idle sessions through `s`, then SIGTERM: the signal's time
    and what the holder saw."""
    holder = Holder(s.addr(), SESSIONS, seconds=seconds)
    try:
        t_signal = time.monotonic()
        s.signal(signal.SIGTERM)
        return t_signal, holder.result()
    finally:
        holder.kill()


def start_many(sluice, backend, **global_):
    g = {"workers": 2, "max_connections": 2 * SESSIONS, "shutdown_timeout": "1s"}
    g.update(global_)
    return sluice([listener(splice="off")], {"up": upstream(backend.address)}, global_=g, nofile=4 * SESSIONS + 500)


def config_text(access_log: Path, upstreams: dict, **global_) -> str:
    g = default_global(access_log)
    g.update({"workers": 2, "max_connections": 2 * SESSIONS, "log_level": "info"})
    g.update(global_)
    return harness.render_config(g, [listener(splice="off")], upstreams)


def test_stop_closes_a_thousand_idle_sessions_over_close_spread(sluice, echo_backend):
    s = start_many(sluice, echo_backend, close_spread=f"{WINDOW_S:.0f}s")
    t_signal, res = stop_holding(s, seconds=60)
    assert res["open"] == 0, f"{res['open']} session(s) still open a minute after SIGTERM"
    assert len(res["closed"]) == SESSIONS
    s.log.wait_for(r"shutdown_timeout reached; closing \d+ session\(s\) one by one over close_spread 5s", timeout=5)
    assert_spread(res["closed"], t_signal + 1.0, "stop, shutdown_timeout 1s then close_spread 5s")
    assert s.wait_exit(timeout=harness.EVENT_TIMEOUT) == 0
    recs = s.access_records()
    assert len(recs) == SESSIONS and {r["cause"] for r in recs} == {"shutdown"}, {r["cause"] for r in recs}


def test_without_close_spread_the_stop_closes_them_at_once(sluice, echo_backend):
    """What close_spread changes: the same stop without it closes every
    session within a fraction of a second."""
    s = start_many(sluice, echo_backend)
    t_signal, res = stop_holding(s, seconds=30)
    assert res["open"] == 0
    per = spread_figures(res["closed"], t_signal + 1.0, WINDOW_S)
    print(f"\nstop without close_spread: per second after shutdown_timeout: {per}")
    assert max(per) >= 0.9 * SESSIONS, per  # (nearly) all in one second
    assert s.wait_exit(timeout=harness.EVENT_TIMEOUT) == 0


def test_a_removed_server_closes_its_sessions_over_close_spread_after_drain_timeout(sluice, echo_backend):
    other = loadgen.Server("echo")
    try:
        ups = {"up": upstream(echo_backend.address, drain_timeout="1s")}
        s = sluice([listener(splice="off")], ups,
                   global_={"workers": 2, "max_connections": 2 * SESSIONS, "close_spread": f"{WINDOW_S:.0f}s"},
                   nofile=4 * SESSIONS + 500)
        holder = Holder(s.addr(), SESSIONS, seconds=60)
        try:
            t_reload = time.monotonic()
            s.reload(config_text(s.access_log, {"up": upstream(other.address, drain_timeout="1s")},
                                 close_spread=f"{WINDOW_S:.0f}s"))
            res = holder.result()
        finally:
            holder.kill()
        assert res["open"] == 0, f"{res['open']} session(s) of the removed server still open"
        assert_spread(res["closed"], t_reload + 1.0, "removed server, drain_timeout 1s then close_spread 5s")
        recs = s.access_records()
        assert len(recs) == SESSIONS and {r["cause"] for r in recs} == {"server_drained"}
        # The new server serves meanwhile and after.
        assert harness.exchange(*s.addr(), b"still here") == b"still here"
    finally:
        other.stop()


def test_on_down_drain_closes_over_close_spread_after_drain_timeout(sluice, echo_backend, backends):
    n, window = 300, 3.0
    check = backends(name="check")  # the check probes this port; stopping it fails the checks only
    health = {"type": "tcp", "port": check.port, "interval": "100ms", "fall": 1, "on_down": "drain"}
    s = sluice([listener(splice="off")], {"up": upstream(echo_backend.address, drain_timeout="1s", health=health)},
               global_={"workers": 2, "close_spread": f"{window:.0f}s"}, nofile=4 * n + 200)
    holder = Holder(s.addr(), n, seconds=60)
    try:
        check.stop()
        s.log.wait_for(r"down \(on_down = drain\): its \d+ session\(s\) end after drain_timeout 1s")
        t_down = time.monotonic()
        res = holder.result()
    finally:
        holder.kill()
    assert res["open"] == 0
    # The log line comes a moment after the drain's timer started: the
    # window is measured from the line, with the usual slack before it.
    assert_spread(res["closed"], t_down + 1.0, "server down (on_down = drain), drain_timeout 1s then close_spread 3s",
                  window=window)
    assert {r["cause"] for r in s.access_records()} == {"server_down"}


def test_a_second_signal_during_the_spread_closes_the_rest_at_once(sluice, echo_backend):
    n = 200
    s = sluice([listener(splice="off")], {"up": upstream(echo_backend.address)},
               global_={"workers": 2, "shutdown_timeout": "0s", "close_spread": "60s"}, nofile=4 * n + 200)
    holder = Holder(s.addr(), n, seconds=30)
    try:
        s.signal(signal.SIGTERM)
        s.log.wait_for(r"closing \d+ session\(s\) one by one over close_spread 1m", timeout=10)
        t_second = time.monotonic()
        s.signal(signal.SIGTERM)
        assert s.wait_exit(timeout=harness.EVENT_TIMEOUT) == 0
        res = holder.result()
    finally:
        holder.kill()
    assert res["open"] == 0
    late = [t - t_second for t in res["closed"] if t > t_second]
    # Over a minute's window, a handful at most closed before the second
    # signal; the rest right after it, not a minute later.
    assert len(late) >= n - 20, len(late)
    assert max(late) < 5.0, max(late)
    assert {r["cause"] for r in s.access_records()} == {"shutdown"}


def test_close_spread_is_checked(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text(harness.render_config({"close_spread": "soon"}, [listener()], {"up": upstream("127.0.0.1:1")}))
    res = harness.run_check(p)
    assert res.returncode == 1
    assert b"close_spread" in res.stderr + res.stdout
    assert os.path.basename(str(p)).encode() in res.stderr + res.stdout
