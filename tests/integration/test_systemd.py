"""Running under systemd: sd_notify readiness, reload and stop messages; the
shipped logrotate file rotates a live log. (The unit, made at install time,
is checked in test_install.py.)"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

import harness
from harness import listener, upstream

CONF = Path(__file__).resolve().parents[2] / "conf"


def read_notifications(sock: socket.socket, until: str, timeout: float = 10.0) -> list[str]:
    got: list[str] = []
    sock.settimeout(timeout)
    while not any(until in g for g in got):
        got.append(sock.recv(4096).decode())
    return got


def test_sd_notify_ready_reloading_stopping(sluice, backends, tmp_path):
    be = backends(harness.banner_handler, name="A")
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    try:
        s = sluice([listener()], {"up": upstream(be)}, start=False)
        s.env = {"NOTIFY_SOCKET": str(path)}
        s.start()
        got = read_notifications(sock, "READY=1")
        # READY comes once the listeners accept.
        c = s.connect()
        try:
            assert harness.recv_line(c) == b"A"
        finally:
            c.close()
        assert any("STATUS=running" in g for g in got), got
        s.signal(signal.SIGHUP)
        got = read_notifications(sock, "READY=1")
        assert any("RELOADING=1" in g for g in got), got
        s.signal(signal.SIGTERM)
        got = read_notifications(sock, "STOPPING=1")
        assert s.wait_exit(10) == 0
    finally:
        sock.close()


@pytest.mark.skipif(shutil.which("logrotate") is None, reason="logrotate not installed")
def test_logrotate_rules_rotate_a_live_log(sluice, backends, tmp_path):
    """The shipped rules, pointed at this test's log and process, rotate the
    access log with no record lost."""
    be = backends(harness.echo_handler)
    s = sluice([listener()], {"up": upstream(be)})
    for i in range(5):
        harness.exchange(*s.addr(), b"x")
    s.wait_records(5)
    rules = (CONF / "logrotate").read_text()
    rules = rules.replace("/var/log/sluice/*.log", str(s.access_log))
    rules = rules.replace("systemctl kill --signal=SIGUSR1 --kill-whom=main sluice.service", f"kill -USR1 {s.pid}")
    rules = rules.replace("    compress\n", "").replace("    delaycompress\n", "")
    conf = tmp_path / "logrotate.conf"
    conf.write_text(rules)
    res = subprocess.run(["logrotate", "--force", "--state", str(tmp_path / "state"), str(conf)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    rotated = Path(str(s.access_log) + ".1")
    assert rotated.exists()
    s.log.wait_for(r"reopened \d+ log file")
    harness.exchange(*s.addr(), b"y")
    harness.wait_until(lambda: s.access_log.exists() and len(s.access_records()) == 1)
    assert len(rotated.read_text().splitlines()) == 5
