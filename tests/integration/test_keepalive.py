"""TCP keepalive on both legs, read from sluice's own sockets.

The client leg gets its keepalive from the listening socket (Linux copies
SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL and TCP_KEEPCNT to every accepted
socket), so it must carry the configured values from the accept on. The
server leg gets them once the session has lasted half of
tcp_keepalive_idle, and the kernel must then count the idle time from the
last packet received, not from the call: otherwise a late set would delay
the first probe. The values are read with getsockopt on copies of sluice's
descriptors (pidfd_getfd), the timer with `ss -o`.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import socket
import subprocess
import time

import pytest

import harness
from harness import listener, upstream

SYS_PIDFD_GETFD = 438  # the same number on every Linux architecture
IDLE_S, INTERVAL_S, COUNT = 8, 30, 4  # none equal to the kernel's defaults (7200, 75, 9)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def socket_of(pid: int, peer: tuple[str, int] | None = None,
              local: tuple[str, int] | None = None) -> socket.socket | None:
    """A copy of the TCP socket of process `pid` with that peer and/or local
    address, or None."""
    libc = _libc()
    pidfd = os.pidfd_open(pid)
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            except OSError:
                continue  # closed meanwhile
            fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, int(name), 0)
            if fd < 0:
                err = ctypes.get_errno()
                if err == 9:  # EBADF: closed meanwhile
                    continue
                pytest.fail(f"pidfd_getfd: {os.strerror(err)} (is ptrace allowed here?)")
            s = socket.socket(fileno=fd)
            try:
                if s.type != socket.SOCK_STREAM or s.family != socket.AF_INET:
                    raise OSError
                if peer is not None and s.getpeername() != peer:
                    raise OSError
                if local is not None and s.getsockname() != local:
                    raise OSError
            except OSError:
                s.close()
                continue
            return s
    finally:
        os.close(pidfd)
    return None


def keepalive_of(s: socket.socket) -> tuple[int, int, int, int]:
    return (s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT))


def keepalive_timer_s(local: tuple[str, int], peer: tuple[str, int]) -> float | None:
    """Seconds left on the kernel's keepalive timer of that connection
    (`ss -o`), or None when it has no keepalive timer."""
    out = subprocess.run(["ss", "-tnoH", "state", "established"], capture_output=True, text=True,
                         timeout=10).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[2] != f"{local[0]}:{local[1]}" or parts[3] != f"{peer[0]}:{peer[1]}":
            continue
        m = re.search(r"timer:\(keepalive,([^,]+),", line)
        return harness.ss_timer_seconds(m.group(1)) if m else None
    return None


def test_both_legs_carry_the_configured_keepalive(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener(tcp_keepalive_idle=f"{IDLE_S}s", tcp_keepalive_interval=f"{INTERVAL_S}s",
                         tcp_keepalive_count=COUNT)], {"up": upstream(be)})
    connect_at = time.monotonic()  # the server leg's connect comes after this
    c = s.connect()
    try:
        assert harness.recv_line(c) == b"A"
        banner_at = time.monotonic()  # the server leg received its last packet before this
        client = harness.wait_until(lambda: socket_of(s.pid, peer=c.getsockname()), what="the client leg")
        server = harness.wait_until(lambda: socket_of(s.pid, peer=("127.0.0.1", be.port)), what="the server leg")
        with client, server:
            # Set on the listening socket only: the accepted socket inherits it.
            assert keepalive_of(client) == (1, IDLE_S, INTERVAL_S, COUNT)
            # The server leg's comes once the session has lasted half the idle time.
            harness.wait_until(lambda: keepalive_of(server)[0] == 1, timeout=IDLE_S + harness.EVENT_TIMEOUT,
                               what="the server leg's keepalive")
            assert keepalive_of(server) == (1, IDLE_S, INTERVAL_S, COUNT)
            assert time.monotonic() - connect_at >= IDLE_S / 2 - 0.1, "set earlier than half the idle time"
            before = time.monotonic()
            left = keepalive_timer_s(server.getsockname(), server.getpeername())
            after = time.monotonic()
            assert left is not None, "no keepalive timer on the server leg"
            # Counted from the last packet received (the banner), so at most
            # IDLE_S minus the time since then is left; a timer counted from
            # the late setsockopt would show nearly IDLE_S. Only while no
            # probe has been sent yet (a probe re-arms it for the interval).
            if after < banner_at + IDLE_S - 0.5:
                assert left <= IDLE_S - (before - banner_at) + 0.1, \
                    f"{left}s left, {before - banner_at:.2f}s after the last packet: the delay was not counted"
    finally:
        c.close()


def test_keepalive_false_leaves_both_legs_without(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener(tcp_keepalive=False)], {"up": upstream(be)})
    c = s.connect()
    try:
        assert harness.recv_line(c) == b"A"
        client = harness.wait_until(lambda: socket_of(s.pid, peer=c.getsockname()), what="the client leg")
        server = harness.wait_until(lambda: socket_of(s.pid, peer=("127.0.0.1", be.port)), what="the server leg")
        with client, server:
            assert keepalive_of(client)[0] == 0
            assert keepalive_of(server)[0] == 0
            assert keepalive_timer_s(client.getsockname(), client.getpeername()) is None
            assert keepalive_timer_s(server.getsockname(), server.getpeername()) is None
    finally:
        c.close()


def test_a_short_session_never_sets_the_server_legs_keepalive(sluice, backends, tmp_path):
    """The point of setting it late: a session shorter than half the idle
    time makes no keepalive call on its server leg (strace counts them)."""
    if shutil.which("strace") is None:
        pytest.fail("strace is not installed (tools/setup.sh installs it)")
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener()], {"up": upstream(be)})  # the defaults: 60s idle, set after 30s
    out = tmp_path / "strace.txt"
    tracer = subprocess.Popen(["strace", "-f", "-e", "trace=setsockopt", "-o", str(out), "-p", str(s.pid)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log = harness.LineLog(tracer.stderr)
    try:
        log.wait_for(r"attached")
        for _ in range(5):
            c = s.connect()
            assert harness.recv_line(c) == b"A"
            c.close()
        # Every server leg closed: the session is over on both sides.
        harness.wait_until(lambda: be.counts() == (5, 0), what="the sessions to end")
    finally:
        tracer.send_signal(2)
        tracer.wait(timeout=30)
        log.join()
    calls = out.read_text()
    assert "TCP_NODELAY" in calls, "strace saw no server connect: " + calls[-500:]
    assert "SO_KEEPALIVE" not in calls and "TCP_KEEPIDLE" not in calls, calls[-1000:]

