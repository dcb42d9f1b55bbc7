"""Client faults in bulk: a storm of clients that connect and go away at
once, go away while sluice is still connecting to a server that does not
answer, or reset in the middle of a session, with no limit configured to
turn them away. Every one of them must end as a session with its cause,
sluice must give back every descriptor, and a normal client must be served
promptly during the storm and after it (accepting never stalls).

Other client faults have their own files: a client reset mid-stream in
test_resets.py and test_limits.py, a client that vanishes without FIN in
test_netns_faults.py, 10 000 idle clients in test_idle_crowd.py, slow and
garbage ClientHellos in tests/e2e/test_tls.py."""

from __future__ import annotations

import collections
import os
import socket
import struct
import threading
import time

import harness
import loadgen
from harness import listener, upstream
from test_limits import black_hole  # noqa: F401  (fixture)

STORM = 4000          # clients in all, a quarter of each kind
STORM_THREADS = 4
STORM_DEADLINE_S = 60.0
CONNECT_TIMEOUT_S = 0.3
# A normal client (connect, one echo, close) must take less than this during
# the storm; an accept loop that stalls holds it for the rest of the storm.
# Not less: one dropped SYN alone costs a second (the first retransmission),
# and a busy machine adds to that.
PROBE_MAX_S = 3.0
PROBE_EVERY_S = 0.01

KINDS = ["fin_at_once", "rst_at_once", "gone_while_connecting", "rst_mid_session"]


def rst_close(sock: socket.socket):
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def storm_client(s: harness.Sluice, kind: str):
    """One client of the storm."""
    if kind == "gone_while_connecting":
        # The server behind this listener never answers SYNs: sluice is
        # still connecting when the client leaves.
        s.connect("slow").close()
        return
    c = s.connect("main")
    if kind == "fin_at_once":
        c.close()
    elif kind == "rst_at_once":
        rst_close(c)
    else:
        c.sendall(b"m" * 1024)
        harness.recv_exact(c, 1024)
        rst_close(c)


class Prober:
    """A normal client, again and again until stop(): connect, one echo,
    close. Keeps how long each took."""

    def __init__(self, s: harness.Sluice):
        self.s = s
        self.took: list[float] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            while not self._stop.is_set():
                t0 = time.monotonic()
                assert harness.exchange(*self.s.addr("main"), b"probe", timeout=5) == b"probe"
                self.took.append(time.monotonic() - t0)
                self._stop.wait(PROBE_EVERY_S)
        except BaseException as e:  # reported by stop()
            self.error = e

    def stop(self) -> list[float]:
        self._stop.set()
        self._thread.join(10)
        assert not self._thread.is_alive(), "the normal client is stuck"
        if self.error is not None:
            raise AssertionError(f"a normal client failed during the storm: {self.error!r}")
        return self.took


def test_a_connect_and_close_storm_leaves_nothing_behind(sluice, black_hole):  # noqa: F811
    echo = loadgen.Server("echo")
    hole = black_hole()
    try:
        # A backlog that holds the whole storm: the kernel never drops a
        # connection that sluice has not accepted yet, so every client must
        # show up as a session.
        backlog = STORM + 100
        s = sluice([listener("main", "echo", backlog=backlog),
                    listener("slow", "hole", backlog=backlog,
                             connect_timeout=f"{int(CONNECT_TIMEOUT_S * 1000)}ms", tries=1)],
                   {"echo": upstream(echo.address), "hole": upstream(hole.address, max_fails=0)})
        fd_dir = f"/proc/{s.pid}/fd"
        assert harness.exchange(*s.addr("main"), b"warm") == b"warm"
        s.wait_records(1)
        baseline = len(os.listdir(fd_dir))

        prober = Prober(s)
        per_thread = STORM // STORM_THREADS
        errors: list[BaseException] = []

        def storm(offset: int):
            try:
                for i in range(per_thread):
                    storm_client(s, KINDS[(offset + i) % len(KINDS)])
            except BaseException as e:  # reported below
                errors.append(e)

        t0 = time.monotonic()
        threads = [threading.Thread(target=storm, args=(k,), daemon=True) for k in range(STORM_THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(STORM_DEADLINE_S)
        storm_s = time.monotonic() - t0
        assert not any(t.is_alive() for t in threads), f"the storm took more than {STORM_DEADLINE_S:.0f}s"
        assert not errors, errors[:3]
        during = prober.stop()

        # Every client of the storm became a session with one cause.
        probes = len(during)
        recs = s.wait_records(1 + STORM + probes, timeout=CONNECT_TIMEOUT_S + 15)
        causes = {name: collections.Counter(r["cause"] for r in recs if r["listener"] == name)
                  for name in ("main", "slow")}
        print(f"storm: {STORM} clients in {storm_s:.1f}s; {probes} normal clients meanwhile, slowest "
              f"{max(during):.3f}s; causes {dict(causes['main'])}, slow {dict(causes['slow'])}")
        quarter = STORM // len(KINDS)
        assert causes["slow"] == {"connect_failed": quarter}, causes
        assert causes["main"]["client_reset"] == 2 * quarter, causes
        assert causes["main"]["client_closed"] == quarter + 1 + probes, causes
        assert sum(causes["main"].values()) == 3 * quarter + 1 + probes, causes

        # A normal client was served all along, promptly.
        assert probes >= 3, f"only {probes} normal clients during a {storm_s:.1f}s storm"
        assert max(during) < PROBE_MAX_S, f"a normal client took {max(during):.2f}s during the storm"
        # And after it; then every descriptor is back.
        assert harness.exchange(*s.addr("main"), b"after") == b"after"
        harness.wait_until(lambda: len(os.listdir(fd_dir)) <= baseline, timeout=5,
                           what=f"sluice's descriptors to return to {baseline}")
    finally:
        echo.stop()
