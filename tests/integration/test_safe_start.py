"""Role checks that are safe from the first second: servers with a role start
down and are checked before the listeners accept, a demoted node loses its
sessions at once, on_down = "drain", and a lone server that passive health
never keeps out."""

from __future__ import annotations

import sys
from pathlib import Path

import harness
from harness import listener, upstream

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
import dbpeers  # noqa: E402
from test_probes import redis_pair  # noqa: E402,F401  (a master and its replica)


def role_through(port: int) -> bytes:
    """The ROLE word of the node a new session through sluice reaches."""
    with dbpeers.RespConn("127.0.0.1", port) as c:
        return c.call("ROLE")[0]


def role_or_none(port: int) -> bytes | None:
    """role_through, or None while sluice refuses (no server is up yet)."""
    try:
        return role_through(port)
    except (AssertionError, OSError):
        return None


def redis_upstream(master, replica, **health) -> dict:
    h = {"type": "redis", "role": "master"}
    h.update(health)
    return upstream(master.address, replica.address, balance="round_robin", health=h)


def test_role_check_starts_down_and_answers_before_accepting(sluice, redis_pair):
    master, replica = redis_pair
    # A long interval: were the first check late or `rise` needed, the
    # first sessions would find no server or (initial "up") the replica.
    s = sluice([listener("redis", "redis")],
               {"redis": redis_upstream(master, replica, interval="30s", timeout="2s")})
    port = s.port("redis")
    roles = [role_through(port) for _ in range(8)]
    assert roles == [b"master"] * 8
    s.log.wait_for(r"first checks answered in .*; accepting")
    assert not s.log.matches(r"server 127\.0\.0\.1:\d+ is up \(active check\).*role is replica")


def test_a_demoted_primary_loses_its_sessions_even_with_on_down_keep(sluice, redis_pair):
    master, replica = redis_pair
    s = sluice([listener("redis", "redis")],
               {"redis": redis_upstream(master, replica, interval="100ms", timeout="1s", on_down="keep")})
    port = s.port("redis")
    held = dbpeers.RespConn("127.0.0.1", port)
    assert held.call("ROLE")[0] == b"master"
    # Switchover: the replica is promoted, the old master follows it.
    with dbpeers.RespConn("127.0.0.1", replica.port) as c:
        assert c.call("REPLICAOF", "NO", "ONE") == "OK"
    with dbpeers.RespConn("127.0.0.1", master.port) as c:
        assert c.call("REPLICAOF", "127.0.0.1", str(replica.port)) == "OK"
    s.log.wait_for(rf"server {master.address} is standby \(active check\): role changed: "
                   r"role is replica, want master")
    assert harness.wait_closed(held.sock) in ("eof", "reset")
    held.close()
    # New sessions find the new primary.
    harness.wait_until(lambda: role_or_none(port) == b"master")
    assert [role_through(port) for _ in range(4)] == [b"master"] * 4
    # Closed as down, or as fenced when a check saw both nodes say master
    # in the moment between the two REPLICAOF commands.
    s.wait_records(1, pred=lambda r: r.get("cause") in ("server_down", "fenced"))


def test_on_role_change_keep_leaves_the_sessions(sluice, redis_pair):
    master, replica = redis_pair
    s = sluice([listener("redis", "redis")],
               {"redis": redis_upstream(master, replica, interval="100ms", timeout="1s", on_down="keep",
                                        on_role_change="keep")})
    held = dbpeers.RespConn("127.0.0.1", s.port("redis"))
    assert held.call("ROLE")[0] == b"master"
    with dbpeers.RespConn("127.0.0.1", master.port) as c:
        assert c.call("REPLICAOF", "127.0.0.1", str(replica.port)) == "OK"
    s.log.wait_for(rf"server {master.address} is standby \(active check\): role changed")
    # Nothing closed it: the session still answers, and still does after a
    # new client was refused (no node is the master now).
    assert held.call("PING") == "PONG"
    with harness.connect(*s.addr("redis")) as c:
        assert harness.wait_closed(c) in ("eof", "reset")
    s.wait_records(1, pred=lambda r: r.get("cause") == "no_server")
    assert held.call("PING") == "PONG"
    held.close()


def test_on_down_drain_closes_sessions_after_drain_timeout(sluice, backends):
    echo = backends()
    check = backends(name="check")  # the check probes this port; stopping it fails the checks only
    s = sluice([listener()],
               {"up": upstream(echo, drain_timeout="2s",
                               health={"type": "tcp", "port": check.port, "interval": "100ms", "fall": 1,
                                       "on_down": "drain"})})
    conn = harness.connect(*s.addr())
    conn.sendall(b"one\n")
    assert harness.recv_exact(conn, 4) == b"one\n"
    check.stop()
    s.log.wait_for(rf"server {echo.address} down \(on_down = drain\): its 1 session\(s\) end after "
                   r"drain_timeout 2s")
    # Still served while it drains...
    conn.sendall(b"two\n")
    assert harness.recv_exact(conn, 4) == b"two\n"
    # ...then closed.
    assert harness.wait_closed(conn) in ("eof", "reset")
    conn.close()


def test_a_lone_server_is_not_kept_out_by_passive_failures(sluice, backends):
    echo = backends()
    port = echo.port
    s = sluice([listener()], {"up": upstream(echo, max_fails=1, fail_timeout="60s")})
    echo.stop()
    # The only backend is gone: the client's session fails to connect.
    with harness.connect(*s.addr()) as c:
        c.sendall(b"x")
        assert harness.wait_closed(c) in ("eof", "reset")
    s.log.wait_for(r"marked down: 1 passive failure")
    # Back on the same port: the next client is served at once, not after
    # fail_timeout.
    backends(port=port)
    reply = harness.exchange("127.0.0.1", s.addr()[1], b"back\n", timeout=harness.EVENT_TIMEOUT)
    assert reply == b"back\n"
    s.log.wait_for(r"is up again: trial connection succeeded")


def test_a_server_added_by_a_reload_takes_no_session_before_its_check(sluice, redis_pair, tmp_path):
    master, replica = redis_pair
    health = {"type": "redis", "role": "master", "interval": "30s", "timeout": "2s"}
    listeners = [listener("redis", "redis")]
    s = sluice(listeners, {"redis": upstream(master.address, balance="round_robin", health=health)})
    port = s.port("redis")
    assert role_through(port) == b"master"
    g = {"workers": 1, "log_level": "info", "access_log": str(s.access_log), "shutdown_timeout": "2s"}
    s.reload(harness.render_config(g, listeners, {"redis": upstream(master.address, replica.address,
                                                                     balance="round_robin", health=health)}))
    # The replica was added down and is checked at once; round_robin would
    # send every other session there were it up.
    assert [role_through(port) for _ in range(8)] == [b"master"] * 8
    s.log.wait_for(rf"server {replica.address} is standby \(active check\): role is replica, want master")
    assert [role_through(port) for _ in range(4)] == [b"master"] * 4
