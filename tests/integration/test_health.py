"""Retries, passive health marking and recovery, and the no-server cases."""

from __future__ import annotations

import re
import time

import harness
from harness import listener, upstream


def down_rx(up: str, addr: str) -> str:
    return rf'upstream "{re.escape(up)}" server {re.escape(addr)} marked down: \S'


def up_rx(up: str, addr: str) -> str:
    return rf'upstream "{re.escape(up)}" server {re.escape(addr)} is up again: \S'


def test_refused_server_is_skipped_marked_down_and_recovers(sluice, backends):
    live = backends(harness.banner_handler, name="live")
    dead = harness.dead_port()
    dead_addr = f"127.0.0.1:{dead}"
    s = sluice([listener(tries=3)],
               {"up": upstream(dead_addr, live, balance="round_robin",
                               max_fails=1, fail_timeout="1s")})

    # Every connection succeeds; the first one tried the dead server first.
    # (One at a time, each logged before the next, so records are in order.)
    n = 5
    for i in range(n):
        assert harness.banner_of(s).decode() == "live"
        recs = s.wait_records(i + 1)
    assert [r["tries"] for r in recs] == ["2"] + ["1"] * (n - 1)
    assert all(r["server"] == live.address for r in recs)
    assert all(r["cause"] in ("client_closed", "server_closed") for r in recs)
    s.log.wait_for(down_rx("up", dead_addr))
    assert len(s.log.matches(down_rx("up", dead_addr))) == 1, "one line per transition"
    assert not s.log.matches(down_rx("up", live.address))

    # Bring the dead port back and keep connecting until traffic reaches it
    # (after fail_timeout the next real connection is its trial).
    revived = backends(harness.banner_handler, name="revived", port=dead)
    seen = set()
    deadline = time.monotonic() + 10
    while "revived" not in seen:
        assert time.monotonic() < deadline, f"no traffic to the revived server; saw {seen}"
        seen.add(harness.banner_of(s).decode())
        if "revived" not in seen:
            try:
                # Paces the loop and returns early once sluice says it is up.
                s.log.wait_for(up_rx("up", dead_addr), timeout=0.1)
            except harness.Timeout:
                pass
    s.log.wait_for(up_rx("up", dead_addr), timeout=5)
    assert len(s.log.matches(up_rx("up", dead_addr))) == 1
    assert revived.counts()[0] >= 1
    assert len(s.log.matches(down_rx("up", dead_addr))) == 1, "no second down line"


def test_max_fails_zero_never_marks_down(sluice, backends):
    live = backends(harness.banner_handler, name="live")
    dead_addr = f"127.0.0.1:{harness.dead_port()}"
    s = sluice([listener(tries=2)],
               {"up": upstream(dead_addr, live, balance="round_robin", max_fails=0)})
    n = 6
    for i in range(n):
        assert harness.banner_of(s).decode() == "live"
        recs = s.wait_records(i + 1)
    # Never marked down, so round-robin keeps offering the dead server.
    assert sum(r["tries"] == "2" for r in recs) >= 2, recs
    assert all(r["server"] == live.address for r in recs)
    assert not s.log.matches(r"marked down")


def test_all_servers_refused_is_connect_failed(sluice):
    a = f"127.0.0.1:{harness.dead_port()}"
    b = f"127.0.0.1:{harness.dead_port()}"
    s = sluice([listener(tries=3)], {"up": upstream(a, b, max_fails=0)})
    c = s.connect()
    try:
        assert harness.wait_closed(c) in ("eof", "reset")
    finally:
        c.close()
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "connect_failed"
    assert rec["bytes_out"] == "0"
    assert int(rec["tries"]) == 2, "each server tried once, none twice"


def test_tries_limits_connect_attempts(sluice):
    addrs = [f"127.0.0.1:{harness.dead_port()}" for _ in range(3)]
    s = sluice([listener(tries=1)], {"up": upstream(*addrs, max_fails=0)})
    c = s.connect()
    try:
        harness.wait_closed(c)
    finally:
        c.close()
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "connect_failed"
    assert rec["tries"] == "1"


def test_all_servers_down_is_no_server(sluice):
    # Two servers: a lone one is never kept out by passive failures.
    dead = [f"127.0.0.1:{harness.dead_port()}" for _ in range(2)]
    s = sluice([listener()], {"up": upstream(*dead, max_fails=1, fail_timeout="30s")})

    def attempt():
        c = s.connect()
        try:
            harness.wait_closed(c)
        finally:
            c.close()

    attempt()
    first = s.wait_records(1)[0]
    # However many tries a session makes, two sessions try both servers. The
    # record says how many it made (the error log's lines may come later:
    # a second session after both are down would find no server).
    n = 1
    if int(first["tries"]) < 2:
        attempt()
        n = len(s.wait_records(2))
    for addr in dead:
        s.log.wait_for(down_rx("up", addr))
    assert all(r["cause"] == "connect_failed" for r in s.access_records())
    attempt()
    last = s.wait_records(n + 1)[-1]
    assert last["cause"] == "no_server"
    assert last["tries"] == "0"
    assert last["server"] == "-"


def test_max_conns_reached_is_no_server(sluice, backends):
    be = backends(harness.banner_handler, name="only")
    up = upstream(be)
    up["servers"][0]["max_conns"] = 1
    s = sluice([listener()], {"up": up})
    held = s.connect()
    try:
        assert harness.recv_line(held) == b"only"
        c = s.connect()
        try:
            t0 = time.monotonic()
            harness.wait_closed(c, timeout=5)
            assert time.monotonic() - t0 < 2, "closed at once, not after a timeout"
        finally:
            c.close()
        (rec,) = s.wait_records(1)
        assert rec["cause"] == "no_server"
        assert be.counts() == (1, 1), "the second client never reached the server"
        # The held session is unaffected.
        held.sendall(b"ping")
        assert harness.recv_exact(held, 4) == b"ping"
    finally:
        held.close()
    # Once the held session ends, the server is eligible again.
    s.wait_records(2)
    c = s.connect()
    try:
        assert harness.recv_line(c) == b"only"
    finally:
        c.close()


def test_backup_used_only_when_primaries_are_down(sluice, backends):
    primary = backends(harness.banner_handler, name="primary")
    backup = backends(harness.banner_handler, name="backup")
    up = upstream(primary, backup)
    up["servers"][1]["backup"] = True
    s = sluice([listener()], {"up": up})
    for _ in range(4):
        assert harness.banner_of(s).decode() == "primary"
    s.wait_records(4)
    # Primary gone: its port refuses, the retry goes to the backup.
    primary.stop()
    assert harness.banner_of(s).decode() == "backup"
    assert backup.counts()[0] == 1
