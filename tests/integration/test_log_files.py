"""Log files: SIGUSR1 reopens them (logrotate's rename-then-signal pattern,
no record lost), and a destination that stops draining never stalls
traffic: records it could not take are dropped, counted and reported."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time

import harness
from harness import listener, upstream


def run_sessions(s, count: int, stop_at: threading.Event | None = None) -> int:
    done = 0
    for i in range(count):
        c = s.connect()
        try:
            c.sendall(f"n{i}".encode())
            c.shutdown(1)
            assert harness.recv_all(c) == f"n{i}".encode()
        finally:
            c.close()
        done += 1
    return done


def test_usr1_reopens_the_access_log_without_losing_records(sluice, backends):
    be = backends(harness.echo_handler)
    s = sluice([listener()], {"up": upstream(be)})
    total = 300
    result: dict[str, int] = {}
    t = threading.Thread(target=lambda: result.update(n=run_sessions(s, total)))
    t.start()
    # Rotate while records are being written.
    harness.wait_until(lambda: len(s.access_records()) >= 100, timeout=30)
    rotated = s.access_log.with_name(s.access_log.name + ".1")
    s.access_log.rename(rotated)
    s.signal(signal.SIGUSR1)
    s.log.wait_for(r"reopened (\d+) log file")
    t.join(60)
    assert result.get("n") == total
    harness.wait_until(lambda: s.access_log.exists() and
                       len(rotated.read_text().splitlines()) + len(s.access_records()) >= total, timeout=10)
    old = rotated.read_text().splitlines()
    new = s.access_log.read_text().splitlines()
    assert len(old) >= 100 and len(new) >= 1, (len(old), len(new))
    assert len(old) + len(new) == total, "records lost or duplicated across the rotation"
    clients = [harness.parse_access_line(l)["client"] for l in old + new]
    assert len(set(clients)) == total
    assert s.running()


def test_usr1_reopens_promptly_even_when_idle(sluice, backends):
    be = backends(harness.echo_handler)
    s = sluice([listener()], {"up": upstream(be)})
    run_sessions(s, 1)
    s.wait_records(1)
    rotated = s.access_log.with_name(s.access_log.name + ".1")
    s.access_log.rename(rotated)
    s.signal(signal.SIGUSR1)
    # The new file exists at the old path at once, before any new record.
    harness.wait_until(lambda: s.access_log.exists(), timeout=5)
    run_sessions(s, 1)
    s.wait_records(1)
    assert len(rotated.read_text().splitlines()) == 1


def test_a_stalled_log_pipe_does_not_stall_sessions(tmp_path, backends):
    be = backends(harness.echo_handler)
    text = harness.render_config({"workers": 1, "access_log": "stderr"}, [listener()], {"up": upstream(be)})
    cfg = tmp_path / "stall.toml"
    cfg.write_text(text)
    # stderr is a pipe nobody reads (64 KiB of kernel buffer, then writes block).
    proc = subprocess.Popen([str(harness.sluice_bin()), "-c", str(cfg)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        addr = None
        deadline = time.monotonic() + harness.START_TIMEOUT
        while addr is None and time.monotonic() < deadline:
            line = proc.stderr.readline().decode()
            m = re.search(harness.LISTENING_RX, line)
            if m:
                addr = harness.split_addr(m.group("addr"))
        assert addr is not None
        # More records than the pipe (64 KiB) and the logging queue (4 096
        # records) hold together.
        sessions = 6000
        t0 = time.monotonic()
        for i in range(sessions):
            c = harness.connect(*addr, timeout=5)
            try:
                c.sendall(b"x")
                c.shutdown(1)
                assert harness.recv_all(c) == b"x"
            finally:
                c.close()
            assert time.monotonic() - t0 < 120, f"only {i} sessions in 120 s: logging stalls traffic"
        assert proc.poll() is None
        # Drain the pipe: the dropped records are reported once it flows again.
        out = bytearray()
        reader = threading.Thread(target=drain_into, args=(proc.stderr, out), daemon=True)
        reader.start()
        harness.wait_until(lambda: re.search(rb"(\d+) log record\(s\) were dropped", out), timeout=15)
        dropped = int(re.search(rb"(\d+) log record\(s\) were dropped", out).group(1))
        records = out.count(b" cause=")
        assert dropped > 0
        # Every session is either written or counted as dropped (the 64 KiB
        # already in the pipe were written before the stall).
        assert records + dropped >= sessions, (records, dropped)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()


def drain_into(stream, out: bytearray):
    while True:
        chunk = stream.read1(65536)
        if not chunk:
            return
        out += chunk
