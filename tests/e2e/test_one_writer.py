"""Standby and fenced servers with real Redis: a replica in a primary pool is
standby (not down), and when a second server turns master the one whose
history descends from the other's serves while the other is fenced
(docs/health.md, "Standby" and "One writer")."""

from __future__ import annotations

import re

import dbpeers
import harness
from harness import listener, upstream
from test_admin import admin_sluice, metric, metrics, request, status  # noqa: F401  (fixture)
from test_probes import redis_pair  # noqa: F401  (fixture)

REDIS = {"type": "redis", "role": "master", "interval": "100ms", "timeout": "1s", "rise": 1, "fall": 1,
         "jitter": "0%"}


def server(s, address: str) -> dict:
    up = next(u for u in status(s)["upstreams"] if u["name"] == "up")
    return next(x for x in up["servers"] if x["address"] == address)


def port_through(s) -> int | None:
    try:
        with dbpeers.RespConn(*s.addr(), timeout=2.0) as c:
            return int(c.call("CONFIG", "GET", "port")[1])
    except (AssertionError, OSError):
        return None


def test_a_replica_in_a_primary_pool_is_standby_not_down(admin_sluice, redis_pair):  # noqa: F811
    master, replica = redis_pair
    s = admin_sluice([listener()], {"up": upstream(master.address, replica.address, health=REDIS)})
    harness.wait_until(lambda: server(s, replica.address)["state"] == "standby", what="the replica standby")
    sv = server(s, replica.address)
    assert sv["role"] == "replica" and sv["active_check"] == "standby", sv
    harness.wait_until(lambda: server(s, replica.address)["lag_seconds"] is not None, what="the replica's lag")
    assert server(s, master.address)["state"] == "up" and server(s, master.address)["role"] == "master"
    # Not down: no downtime, no warning; info only.
    assert sv["down_count"] == 0 and sv["downtime_seconds"] == 0, sv
    assert s.log.matches(rf'\[info\] upstream "up" server {re.escape(replica.address)} is standby \(active check\)')
    assert not s.log.matches(rf"\[warning\].*{re.escape(replica.address)}")
    _, samples = metrics(s)
    for state in ("up", "standby", "down", "fenced", "drained", "disabled"):
        want = 1.0 if state == "standby" else 0.0
        assert metric(samples, "sluice_server_state", upstream="up", server=replica.address, state=state) == want
    assert metric(samples, "sluice_server_up", upstream="up", server=replica.address) == 0.0
    assert metric(samples, "sluice_server_up", upstream="up", server=master.address) == 1.0
    assert metric(samples, "sluice_server_fenced", upstream="up", server=master.address) == 0.0
    assert metric(samples, "sluice_server_downtime_seconds_total", upstream="up", server=replica.address) == 0.0
    # The page shows the role in plain words.
    page = request(s, "GET", "/").body.decode()
    assert 'class="state-standby"' in page and "replica, " in page and " s behind" in page
    # A standby that stops answering is down.
    replica.stop()
    harness.wait_until(lambda: server(s, replica.address)["state"] == "down", what="the stopped replica down")


def test_a_promoted_replica_serves_and_the_old_master_is_fenced(admin_sluice, redis_pair):  # noqa: F811
    master, replica = redis_pair
    s = admin_sluice([listener()], {"up": upstream(master.address, replica.address, health=REDIS)})
    # Replicating (its link up): a replica promoted before its first sync
    # has none of the master's history, and would not descend from it.
    harness.wait_until(lambda: server(s, replica.address)["lag_seconds"] is not None, what="the replica in sync")
    held = dbpeers.RespConn(*s.addr())
    assert int(held.call("CONFIG", "GET", "port")[1]) == master.port
    # Split brain: the replica is promoted, the old master is left a master.
    with dbpeers.RespConn("127.0.0.1", replica.port) as c:
        assert c.call("REPLICAOF", "NO", "ONE") == "OK"
    s.log.wait_for(rf"server {re.escape(master.address)} fenced: {re.escape(replica.address)} also says it is the "
                   r"primary; it was promoted from the other")
    assert harness.wait_closed(held.sock) in ("eof", "reset")
    held.close()
    sv = server(s, master.address)
    assert sv["state"] == "fenced" and sv["fenced_by"] == replica.address and sv["role"] == "master", sv
    assert "promoted from the other" in sv["fence_reason"]
    _, samples = metrics(s)
    assert metric(samples, "sluice_server_fenced", upstream="up", server=master.address) == 1.0
    assert metric(samples, "sluice_server_state", upstream="up", server=master.address, state="fenced") == 1.0
    assert metric(samples, "sluice_server_up", upstream="up", server=master.address) == 0.0
    # Every new session goes to the promoted node, never to the fenced one.
    for _ in range(6):
        assert port_through(s) == replica.port
    s.wait_records(1, pred=lambda r: r.get("cause") == "fenced" and r.get("server") == master.address)
    # Once the old master follows the new one, the fence is lifted: standby.
    with dbpeers.RespConn("127.0.0.1", master.port) as c:
        assert c.call("REPLICAOF", "127.0.0.1", str(replica.port)) == "OK"
    harness.wait_until(lambda: server(s, master.address)["state"] == "standby", what="the old master standby")
    assert s.log.matches(rf"server {re.escape(master.address)} no longer fenced")


def test_two_unrelated_masters_neither_serves(admin_sluice, redis_pair, tmp_path):  # noqa: F811
    master, replica = redis_pair
    other = dbpeers.RedisServer(tmp_path / "other")
    try:
        s = admin_sluice([listener()], {"up": upstream(master.address, other.address, health=REDIS)})
        # Two masters with unrelated histories: whichever answered second
        # met the first, and neither serves until one is no longer master.
        harness.wait_until(lambda: server(s, master.address)["state"] == "fenced"
                           and server(s, other.address)["state"] == "fenced", what="both fenced")
        assert "neither replication history descends" in server(s, master.address)["fence_reason"]
        for _ in range(3):
            assert port_through(s) is None
        # One stops being master: the other serves again.
        with dbpeers.RespConn("127.0.0.1", other.port) as c:
            assert c.call("REPLICAOF", "127.0.0.1", str(master.port)) == "OK"
        harness.wait_until(lambda: server(s, master.address)["state"] == "up", what="the master serves again")
        assert port_through(s) == master.port
        assert server(s, other.address)["state"] == "standby"
    finally:
        other.stop()
