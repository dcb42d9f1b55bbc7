"""A start with nothing wrong logs no warning: a warning at every start
teaches operators to ignore warnings. Servers waiting for their first check
(initial = "down") are news at info level; losing a server still warns."""

from __future__ import annotations

import re
import signal

import harness
from harness import listener, upstream

NOT_QUIET = re.compile(r"\[(warning|error|critical)\]")


def test_a_health_checked_start_logs_no_warning(backends, tmp_path):
    primary = backends(harness.echo_handler, name="A")   # answers PING: passes
    standby = backends(harness.banner_handler, name="B")  # answers its name: fails, as a standby fails a role check
    role_like = {"type": "send_expect", "send": "PING\n", "expect": "PING", "interval": "100ms", "timeout": "2s",
                 "rise": 1, "fall": 1, "jitter": "0%", "initial": "down"}
    tcp = {"type": "tcp", "interval": "100ms", "timeout": "2s", "fall": 1, "jitter": "0%"}
    text = harness.render_config(
        # A limit the test machine's descriptor limit allows (the unit sets
        # LimitNOFILE for the default): no warning about it either.
        {"workers": 2, "max_connections": 1000, "access_log": str(tmp_path / "access.log"),
         "shutdown_timeout": "2s"},
        [listener("main", "db"), listener("pool", "pool")],
        {"db": upstream(primary, standby, health=role_like), "pool": upstream(primary, health=tcp)})
    text += '\n[admin]\nlisten = "127.0.0.1:0"\n'
    s = harness.Sluice(tmp_path, text, ["main", "pool"], name="quiet", access_log=tmp_path / "access.log")
    try:
        s.start()
        a, b = re.escape(primary.address), re.escape(standby.address)
        s.log.wait_for(rf'\[info\] upstream "db" server {b} starts down \(active check\): waiting for the first check')
        s.log.wait_for(rf'\[info\] upstream "db" server {a} is up \(active check\)')
        s.log.wait_for(rf'\[info\] upstream "db" server {b} stays down \(active check\): ')
        s.log.wait_for(r"\[info\] admin API listening on ")
        # Traffic flows through both listeners.
        for name in ("main", "pool"):
            assert harness.exchange(*s.addr(name), b"ping") == b"ping"
        s.wait_records(2)
        quiet_until = len(s.log.lines)
        noisy = [line for line in s.log.lines[:quiet_until] if NOT_QUIET.search(line)]
        assert not noisy, "warnings at a start with nothing to act on:\n" + "\n".join(noisy)

        # What needs action still warns: the primary stops answering.
        primary.stop()
        s.log.wait_for(rf'\[warning\] upstream "(db|pool)" server {a} marked down \(active check\)',
                       start=quiet_until)
        s.signal(signal.SIGTERM)
        assert s.wait_exit(15) == 0
    finally:
        s.stop()
