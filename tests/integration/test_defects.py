"""Defects found by trying sluice as a new user would. Each test reproduces
one reported trigger with real sockets and fails on the build that had the
defect."""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import socket
import struct
import subprocess
import threading
import time

import pytest

import harness
from harness import listener, upstream

KiB = 1 << 10


def proc_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# --- 1. fin_timeout is an inactivity timeout --------------------------------

def trickle_handler(count: int, every: float):
    """Reads the request to EOF, then sends one byte every `every` seconds."""
    def handle(backend, conn):
        while conn.recv(4096):
            pass
        for i in range(count):
            conn.sendall(bytes([ord("a") + i % 26]))
            time.sleep(every)
    return handle


def test_fin_timeout_does_not_cut_a_reply_that_is_still_flowing(sluice, backends):
    be = backends(trickle_handler(15, 0.2))
    s = sluice([listener(fin_timeout="1s")], {"up": upstream(be)})
    c = s.connect(timeout=10)
    try:
        c.sendall(b"request")
        c.shutdown(socket.SHUT_WR)
        got = harness.recv_all(c)
    finally:
        c.close()
    assert len(got) == 15, f"got {len(got)} of 15 bytes: {got!r}"
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "client_closed"  # the client's FIN came first
    assert rec["bytes_out"] == "15"


def test_fin_timeout_counts_from_the_fin_after_a_quiet_session(sluice, backends):
    # A pooled connection that sat idle longer than fin_timeout and is then
    # half-closed: the reply that follows the FIN must still come through.
    def reply_after_fin(backend, conn):
        while conn.recv(4096):
            pass
        time.sleep(0.4)
        conn.sendall(b"goodbye")
    be = backends(reply_after_fin)
    s = sluice([listener(fin_timeout="1s")], {"up": upstream(be)})
    c = s.connect(timeout=10)
    try:
        c.sendall(b"request")
        time.sleep(1.6)  # quiet for longer than fin_timeout, before any FIN
        c.shutdown(socket.SHUT_WR)
        got = harness.recv_all(c)
    finally:
        c.close()
    assert got == b"goodbye", got
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "client_closed", rec


def test_fin_timeout_still_ends_a_half_closed_session_that_goes_quiet(sluice, backends):
    def silent(backend, conn):
        while conn.recv(4096):
            pass
        time.sleep(5)
    be = backends(silent)
    s = sluice([listener(fin_timeout="1s")], {"up": upstream(be)})
    c = s.connect()
    c.sendall(b"request")
    c.shutdown(socket.SHUT_WR)
    took = harness.seconds_until_closed(c, timeout=4)
    assert 0.8 <= took < 3, f"closed {took:.2f}s after the FIN with fin_timeout=1s"
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "fin_timeout"


# --- 2. signals -------------------------------------------------------------

def test_hup_and_usr1_during_a_graceful_stop_do_not_kill(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener()], {"up": upstream(be)}, global_={"shutdown_timeout": "20s"})
    c = s.connect()
    try:
        assert harness.recv_line(c) == b"A"
        s.signal(signal.SIGTERM)
        s.log.wait_for(r"graceful stop")
        s.signal(signal.SIGHUP)
        s.signal(signal.SIGUSR1)
        s.log.wait_for(r"SIGHUP while stopping")
        time.sleep(0.3)
        assert s.running(), "a SIGHUP/SIGUSR1 during the drain ended the process"
        c.sendall(b"ping")
        assert harness.recv_exact(c, 4) == b"ping"
    finally:
        c.close()
    assert s.wait_exit(timeout=10) == 0
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "client_closed"


def test_signals_while_exiting_do_not_kill(sluice, backends):
    """SIGTERM, then every documented signal over and over until sluice has
    exited. Its error log goes to a pipe that nobody reads, so once the
    sessions are done sluice spends its last seconds waiting for the log to
    drain: a signal arriving then must not kill it either."""
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener()], {"up": upstream(be)}, start=False)
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
    proc = subprocess.Popen([str(harness.sluice_bin()), "-c", str(s.config_path)],
                            stdin=subprocess.DEVNULL, stdout=w, stderr=w, cwd=s.workdir)
    # A second open file description of the pipe, non-blocking, to fill it
    # (sluice's own stays blocking).
    filler = os.open(f"/proc/self/fd/{w}", os.O_WRONLY | os.O_NONBLOCK)
    os.close(w)
    try:
        out = b""
        deadline = time.monotonic() + harness.START_TIMEOUT
        while b"listening on" not in out and time.monotonic() < deadline:
            ready, _, _ = select.select([r], [], [], 0.5)
            if ready:
                chunk = os.read(r, 4096)
                assert chunk, out.decode(errors="replace")
                out += chunk
        assert b"listening on" in out, out.decode(errors="replace")
        try:
            while True:
                os.write(filler, b"x" * 512)
        except BlockingIOError:
            pass  # full: sluice's next log write blocks
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        sent = 0
        while proc.poll() is None and time.monotonic() - t0 < 15:
            for sig in (signal.SIGUSR1, signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
                try:
                    proc.send_signal(sig)
                except ProcessLookupError:
                    break
                sent += 1
            time.sleep(0.002)
        rc = proc.wait(timeout=5)
        took = time.monotonic() - t0
        assert rc == 0, f"exit status {rc} after {sent} signals in {took:.2f}s"
        # The exit did wait on the stalled log: the signals came in that window.
        assert took > 2, f"sluice exited {took:.2f}s after SIGTERM: the log was not stalled"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        os.close(filler)
        os.close(r)


def test_usr1_does_not_kill_a_running_sluice(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener()], {"up": upstream(be)})
    s.signal(signal.SIGUSR1)
    s.log.wait_for(r"SIGUSR1")
    c = s.connect()
    try:
        assert harness.recv_line(c) == b"A"
    finally:
        c.close()
    assert s.running()


# --- 4. local resource errors do not mark healthy servers down ---------------

LOCAL_WARNING_RX = r"local resource error while connecting .*not counted against the server"


def exhaust_server_sockets(s, cap: int, held: list) -> None:
    """Fills sluice (started with nofile_cap=cap, a listener "main" to banner
    servers and a prereading listener "hold") with sessions kept open in
    `held`, until a client is accepted but its server socket cannot be
    opened. One descriptor is then left free: every new client on "main" is
    accepted and fails with cause local_resource."""
    # A proxied session holds two descriptors. With an odd number free, the
    # last accept succeeds and the server socket cannot be opened: the error
    # is ours. A prereading client holds one descriptor, so one of those
    # makes the count odd.
    # (One session first: libuv opens a descriptor of its own on the first
    # accept.)
    warm = s.connect("main")
    assert harness.recv_line(warm) in (b"A", b"B")
    warm.close()
    s.wait_records(1)
    if (cap - open_fds(s.pid)) % 2 == 0:
        # Counted before the connect: sluice may accept it before a count
        # taken after would be read.
        before = open_fds(s.pid)
        held.append(s.connect("hold"))
        harness.wait_until(lambda: open_fds(s.pid) == before + 1, timeout=5)
    for _ in range(cap):
        c = s.connect("main", timeout=5)
        held.append(c)
        c.settimeout(5)
        try:
            line = harness.recv_line(c)
        except (AssertionError, OSError):
            return  # closed by sluice: it could not open the server socket
        assert line in (b"A", b"B")
    raise AssertionError(f"{cap} sessions and the descriptors did not run out")


def test_fd_exhaustion_is_ours_not_the_servers(sluice, backends):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    cap = 96
    s = sluice([listener(tries=2),
                listener("hold", None, preread="tls", default_upstream="up", preread_timeout="60s")],
               {"up": upstream(a, b, max_fails=1, fail_timeout="60s")},
               nofile_cap=cap)
    held = []
    try:
        exhaust_server_sockets(s, cap, held)
        recs = s.wait_records(1, pred=lambda r: r["cause"] == "local_resource")
        assert recs[0]["server"] != "-"
        s.log.wait_for(LOCAL_WARNING_RX)
    finally:
        for c in held:
            c.close()
    # Both servers are still eligible: new clients are served at once.
    deadline = time.monotonic() + 10
    while open_fds(s.pid) > cap // 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in range(4):
        c = s.connect("main")
        try:
            assert harness.recv_line(c) in (b"A", b"B")
        finally:
            c.close()
    assert not s.log.matches(r"marked down"), "\n".join(l for l in s.log.lines if "marked down" in l)
    causes = {r["cause"] for r in s.access_records()}
    assert "no_server" not in causes


def test_local_resource_warning_is_rate_limited(sluice, backends):
    """Hundreds of local_resource failures in a few seconds: one warning line
    per second, each later one saying how many were held back."""
    a = backends(harness.banner_handler, name="A")
    cap = 64
    s = sluice([listener(tries=1),
                listener("hold", None, preread="tls", default_upstream="up", preread_timeout="60s")],
               {"up": upstream(a, max_fails=1, fail_timeout="60s")},
               nofile_cap=cap)
    held = []
    t0 = time.monotonic()
    try:
        exhaust_server_sockets(s, cap, held)
        failures = 1
        storm = time.monotonic()
        # Until the third line (two seconds on), about 200 failures a second.
        while (len(s.log.matches(LOCAL_WARNING_RX)) < 3 and time.monotonic() - storm < 10
               and failures < 5000):
            c = s.connect("main", timeout=5)
            try:
                harness.wait_closed(c, timeout=5)
            finally:
                c.close()
            failures += 1
            time.sleep(0.005)
        span = time.monotonic() - t0
        s.wait_records(failures, pred=lambda r: r["cause"] == "local_resource")
    finally:
        for c in held:
            c.close()
    assert failures >= 100, f"only {failures} local failures"
    lines = [m.string for m in s.log.matches(LOCAL_WARNING_RX)]
    # One line at most per second of the span in which they all happened.
    assert 2 <= len(lines) <= int(span) + 1, (span, failures, lines)
    held_back = [int(m.group(1)) for m in s.log.matches(
        LOCAL_WARNING_RX + r"\) \(and (\d+) more like it since the last report\)")]
    assert len(held_back) == len(lines) - 1, lines
    assert all(n >= 1 for n in held_back), lines
    assert len(lines) + sum(held_back) <= failures


def test_startup_warns_when_the_fd_limit_is_below_max_connections(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener()], {"up": upstream(be)}, global_={"max_connections": 10000}, nofile_cap=512)
    m = s.log.wait_for(r"open-file limit is (\d+) \(hard limit (\d+)\), but max_connections = 10000 needs about (\d+)")
    assert m.group(1) == "512" and m.group(2) == "512"
    assert s.log.matches(r"open-file limit") and len(s.log.matches(r"open-file limit")) == 1


def test_fd_limit_is_raised_to_the_hard_limit(sluice, backends):
    import resource
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or hard <= 1024:
        pytest.skip("needs a finite hard limit above 1024")
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener()], {"up": upstream(be)}, start=False)
    s.nofile_soft = 256
    s.start()
    with open(f"/proc/{s.pid}/limits") as f:
        line = next(l for l in f if l.startswith("Max open files"))
    assert line.split()[3] == str(hard), line


# --- 5. accept under EMFILE does not spin, with several workers -------------

def test_accept_backs_off_when_out_of_fds(sluice, backends):
    echo = backends(harness.echo_handler)
    cap = 128
    s = sluice([listener("live", "up"),
                listener("tls", None, preread="tls", default_upstream="up", preread_timeout="60s")],
               {"up": upstream(echo)}, global_={"workers": 2}, nofile_cap=cap)
    live = s.connect("live")
    idle = []
    try:
        live.sendall(b"before")
        assert harness.recv_exact(live, 6) == b"before"
        # Prereading clients hold one descriptor each and never finish their
        # hello: with more of them than descriptors, accept() fails.
        for _ in range(cap + 40):
            idle.append(s.connect("tls", timeout=5))
        s.log.wait_for(r"cannot accept: too many open files; pausing accepts", timeout=10)
        cpu0 = proc_cpu_seconds(s.pid)
        t0 = time.monotonic()
        # The live session keeps flowing meanwhile.
        for i in range(10):
            msg = f"during-{i}".encode()
            live.sendall(msg)
            assert harness.recv_exact(live, len(msg)) == msg
            time.sleep(0.2)
        used = proc_cpu_seconds(s.pid) - cpu0
        wall = time.monotonic() - t0
        assert used < 0.25 * wall, f"sluice used {used:.2f}s of CPU in {wall:.2f}s while out of descriptors"
    finally:
        for c in idle:
            c.close()
    # Descriptors free again: a new client is served.
    deadline = time.monotonic() + 15
    served = False
    while not served and time.monotonic() < deadline:
        c = s.connect("tls", timeout=5)
        try:
            c.sendall(b"plain text, not TLS")
            c.settimeout(2)
            served = c.recv(100) == b"plain text, not TLS"
        except OSError:
            pass
        finally:
            c.close()
    assert served, "no client was served after the descriptors were freed"
    live.close()
    # One line per episode: at most one per worker and listener, however
    # many accepts failed meanwhile.
    pauses = [l for l in s.log.lines if "cannot accept" in l]
    assert 1 <= len(pauses) <= 4, pauses
    assert not [l for l in s.log.lines if "accepting again" in l]


# --- 6. TCP keepalive on both legs ------------------------------------------

def keepalive_timers(pid: int) -> list[tuple[str, str, str]]:
    """(local, peer, timer) of every TCP socket of `pid` that has a keepalive timer."""
    out = subprocess.run(["ss", "-tnoHp", "state", "established"], capture_output=True, text=True,
                         timeout=10).stdout
    rows = []
    for line in out.splitlines():
        if f"pid={pid}," not in line:
            continue
        parts = line.split()
        m = re.search(r"timer:\((keepalive),([^,]+),", line)
        rows.append((parts[2], parts[3], m.group(2) if m else ""))
    return rows


def test_keepalive_is_on_for_both_legs_by_default(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener()], {"up": upstream(be)})
    c = s.connect()
    try:
        assert harness.recv_line(c) == b"A"
        # The client leg from the accept (inherited from the listening
        # socket); the server leg's is set once the session has lasted half
        # of tcp_keepalive_idle (30 s here), see test_keepalive.py.
        rows = keepalive_timers(s.pid)
        legs = [r for r in rows if r[0].endswith(f":{s.port()}")]
        assert len(legs) == 1, rows
        for local, peer, timer in legs:
            assert timer, f"no keepalive timer on {local} -> {peer}"
            secs = harness.ss_timer_seconds(timer)
            assert 45 <= secs <= 60, f"keepalive idle {timer} on {local}, want 60s"
        server = [r for r in rows if r[1].endswith(f":{be.port}")]
        assert len(server) == 1 and server[0][2] == "", server
    finally:
        c.close()


def test_keepalive_can_be_tuned_or_turned_off(sluice, backends):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = sluice([listener("tuned", "up_a", tcp_keepalive_idle="6s", tcp_keepalive_interval="5s",
                         tcp_keepalive_count=3),
                listener("off", "up_b", tcp_keepalive=False)],
               {"up_a": upstream(a), "up_b": upstream(b)})
    o = s.connect("off")
    assert harness.recv_line(o) == b"B"
    t = s.connect("tuned")
    try:
        assert harness.recv_line(t) == b"A"
        banner_at = time.monotonic()
        # The client legs: from the accept.
        rows = keepalive_timers(s.pid)
        tuned = [r for r in rows if r[0].endswith(f":{s.port('tuned')}")]
        off = [r for r in rows if r[0].endswith(f":{s.port('off')}")]
        assert len(tuned) == 1 and tuned[0][2], rows
        assert harness.ss_timer_seconds(tuned[0][2]) <= 6, tuned
        assert len(off) == 1 and off[0][2] == "", rows

        # The server legs: after half the idle time, counted from the last
        # packet received, so at most 3 s are left on the timer.
        def server_leg():
            before = time.monotonic()
            legs = [r for r in keepalive_timers(s.pid) if r[1].endswith(f":{a.port}")]
            return (before, legs[0]) if len(legs) == 1 and legs[0][2] else None

        before, leg = harness.wait_until(server_leg, timeout=6 + harness.EVENT_TIMEOUT,
                                         what="the server leg's keepalive")
        # The server leg last received before banner_at; set 3 s or more
        # after the connect, its timer counts from then, so no more than
        # 6 s minus the time since is left (a timer counted from the call
        # would show nearly 6 s). Only while no probe has gone yet (a probe
        # re-arms it for the interval).
        if time.monotonic() < banner_at + 5.5:
            assert harness.ss_timer_seconds(leg[2]) <= 6 - (before - banner_at) + 0.1, (leg, before - banner_at)
        off = [r for r in keepalive_timers(s.pid) if r[1].endswith(f":{b.port}")]
        assert len(off) == 1 and off[0][2] == "", off
    finally:
        t.close()
        o.close()


# --- 7. a second sluice on a taken address ----------------------------------

def test_a_second_sluice_on_the_same_address_fails_at_start(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    first = sluice([listener()], {"up": upstream(be)}, name="first")
    host, port = first.addr()
    second = sluice([listener(listen=f"{host}:{port}")], {"up": upstream(be)}, name="second", start=False)
    res = harness.run_plain(second.config_path)
    assert res.returncode == 1
    err = res.stdout.decode() + res.stderr.decode()
    assert f"cannot listen on {host}:{port}" in err and "another process is listening" in err, err
    c = first.connect()
    try:
        assert harness.recv_line(c) == b"A"
    finally:
        c.close()


# --- 9. bytes count what was delivered --------------------------------------

def send_queue(pid: int, local_port: int) -> int:
    """Send-Q of sluice's socket whose peer is 127.0.0.1:local_port."""
    out = subprocess.run(["ss", "-tnHp", "state", "established"], capture_output=True, text=True,
                         timeout=10).stdout
    for line in out.splitlines():
        parts = line.split()
        if f"pid={pid}," in line and parts[3].endswith(f":{local_port}"):
            return int(parts[1])
    raise AssertionError(f"no sluice socket to port {local_port}:\n{out}")


def test_bytes_out_counts_what_was_written_not_what_was_read(sluice, backends):
    src = harness.StreamSource(64 << 20, b"x" * (1 << 16))
    be = backends(src)
    s = sluice([listener()], {"up": upstream(be)})
    c = harness.connect(*s.addr(), rcvbuf=16 * KiB)
    try:
        # Let everything fill up: the client reads nothing.
        last = -1
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if src.sent == last:
                break
            last = src.sent
        import fcntl
        import termios
        pending = bytearray(4)
        fcntl.ioctl(c.fileno(), termios.FIONREAD, pending)
        received = struct.unpack("i", pending)[0]
        in_sluice_kernel = send_queue(s.pid, c.getsockname()[1])
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        c.close()
    (rec,) = s.wait_records(1)
    assert rec["cause"] in ("client_reset", "client_closed")
    delivered = received + in_sluice_kernel
    # What sluice read but still held in its own queue was never written.
    assert int(rec["bytes_out"]) == delivered, (rec, received, in_sluice_kernel)


# --- 10. a slow reader draining a queue is not idle --------------------------

def test_idle_timeout_does_not_cut_a_slow_reader(sluice, backends):
    """The server sends a large reply and waits for the client's answer; the
    client takes several idle_timeouts to read it. Bytes are moving all the
    time (out of sluice's queue and the kernel's buffers), so the session
    must live on until the exchange completes."""
    total = 512 * KiB

    def source(backend, conn):
        conn.sendall(b"y" * total)
        assert harness.recv_exact(conn, 3) == b"ack"
        conn.sendall(b"done")
        while conn.recv(4096):
            pass
    be = backends(source)
    s = sluice([listener(idle_timeout="500ms")], {"up": upstream(be)})
    c = harness.connect(*s.addr(), rcvbuf=8 * KiB)
    got = 0
    t0 = time.monotonic()
    try:
        c.settimeout(10)
        while got < total and time.monotonic() - t0 < 30:
            chunk = c.recv(min(16 * KiB, total - got))
            if not chunk:
                break
            got += len(chunk)
            time.sleep(0.1)  # about 160 KiB/s: several idle_timeouts in all
        took = time.monotonic() - t0
        assert got == total, f"got {got} of {total} bytes"
        c.sendall(b"ack")
        try:
            assert harness.recv_exact(c, 4) == b"done"
        except AssertionError as e:
            raise AssertionError(f"{e}; records: {s.access_records()}") from None
    finally:
        c.close()
    assert took > 1.5, f"the read took only {took:.2f}s: the test did not outlast idle_timeout"
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "client_closed"


def test_idle_timeout_still_cuts_a_peer_that_stopped_reading(sluice, backends):
    src = harness.StreamSource(64 << 20, b"z" * (1 << 16))
    be = backends(src)
    s = sluice([listener(idle_timeout="500ms")], {"up": upstream(be)})
    c = harness.connect(*s.addr(), rcvbuf=8 * KiB)
    t0 = time.monotonic()
    try:
        # The client never reads: once the buffers are full nothing moves.
        rec = s.wait_records(1, timeout=10)[0]
        took = time.monotonic() - t0
    finally:
        c.close()
    assert rec["cause"] == "idle_timeout"
    assert took < 5, f"cut after {took:.2f}s with idle_timeout=500ms"
