"""type = "mysql" checks against real MariaDB servers with real replication:
writes reach only the primary and follow a switchover, a replica whose
replication stopped or fell behind max_lag leaves the read pool, and a
server that hangs in the handshake fails at the check's timeout without
holding sluice's control loop."""

from __future__ import annotations

import re
import socket
import threading

import pytest

import harness
import mariadb_peers as mp
from harness import listener, upstream
from test_admin import admin_sluice, status  # noqa: F401  (fixture)

pytestmark = pytest.mark.skipif(mp.missing() is not None, reason=mp.missing() or "")

FAST = {"interval": "300ms", "timeout": "3s", "rise": 1, "fall": 1, "jitter": "0%", "initial": "down"}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return mp.install_template(tmp_path_factory.mktemp("mariadb"))


@pytest.fixture
def primary_replica(template, tmp_path):
    started = []
    try:
        p = mp.make_primary(template, tmp_path / "primary")
        started.append(p)
        r = mp.make_replica(template, tmp_path / "replica", p, server_id=2)
        started.append(r)
        yield p, r
    finally:
        for s in reversed(started):
            s.stop()


def password_file(tmp_path):
    pw = tmp_path / "monitor-password"
    pw.write_text(mp.MONITOR_PASSWORD + "\n")
    return str(pw)


def health(tmp_path, **extra):
    return {"type": "mysql", "user": mp.MONITOR_USER, "password_file": password_file(tmp_path), **FAST, **extra}


def server_state(s, upstream_name, address):
    for u in status(s)["upstreams"]:
        if u["name"] != upstream_name:
            continue
        for srv in u["servers"]:
            if srv["address"] == address:
                return srv
    raise AssertionError(f"{upstream_name}/{address} not in /status")


def server_id_through(s, server, name):
    return server.sql("SELECT @@server_id", user=mp.MONITOR_USER, password=mp.MONITOR_PASSWORD,
                      port=s.port(name))


def test_writes_reach_only_the_primary_and_follow_a_switchover(admin_sluice, primary_replica, tmp_path):
    p, r = primary_replica
    s = admin_sluice([listener(name="rw", upstream="rw"), listener(name="ro", upstream="ro")],
               {"rw": upstream(p.address, r.address, health=health(tmp_path, role="primary")),
                "ro": upstream(p.address, r.address, health=health(tmp_path, role="replica", max_lag="30s"))})
    s.log.wait_for(rf"server {re.escape(p.address)} is up \(active check\): role is primary", timeout=20)
    s.log.wait_for(rf"server {re.escape(r.address)} is up \(active check\): role is replica", timeout=20)
    for _ in range(4):
        assert server_id_through(s, p, "rw") == "1"
        assert server_id_through(s, p, "ro") == "2"
    assert "role is replica, want primary" in server_state(s, "rw", r.address)["reason"]

    # Switchover: the primary turns read-only, the replica stops replicating
    # and becomes writable.
    start = len(s.log.lines)
    p.sql("SET GLOBAL read_only = 1")
    mp.wait_caught_up(r, p)
    r.sql("STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0")
    s.log.wait_for(rf"server {re.escape(r.address)} is up \(active check\): role is primary", start=start,
                   timeout=20)
    s.log.wait_for(rf"server {re.escape(p.address)} is standby \(active check\): role changed: role is replica",
                   start=start, timeout=20)
    for i in range(4):
        assert server_id_through(s, p, "rw") == "2"
        out = p.sql(f"INSERT INTO app.writes VALUES ({i}, @@server_id); SELECT @@server_id",
                    user="root", port=s.port("rw"))
        assert out == "2"
    # The old primary is read-only but replicates from no one: out of the
    # read pool with max_lag, with a reason that says why.
    harness.wait_until(lambda: "replicates from no one" in server_state(s, "ro", p.address)["reason"],
                       what="the old primary to leave the read pool")


def test_a_writable_newcomer_missing_writes_waits_until_the_primary_steps_down(admin_sluice, primary_replica,
                                                                               tmp_path):
    """One writer, MariaDB: a replica made writable while the primary still
    is, and missing a write the primary took, is fenced (the primary keeps
    serving); once the primary turns read-only, the newcomer serves."""
    p, r = primary_replica
    s = admin_sluice([listener(name="rw", upstream="rw")],
                     {"rw": upstream(p.address, r.address, health=health(tmp_path, role="primary"))})
    s.log.wait_for(rf"server {re.escape(p.address)} is up \(active check\): role is primary", timeout=20)
    mp.wait_caught_up(r, p)
    r.sql("STOP SLAVE")
    p.sql("INSERT INTO app.writes VALUES (1, @@server_id)")  # the replica never gets this one
    r.sql("SET GLOBAL read_only = 0")
    s.log.wait_for(rf"server {re.escape(r.address)} fenced: {re.escape(p.address)} also says it is the primary; "
                   r"the serving one keeps serving", timeout=20)
    assert server_state(s, "rw", r.address)["state"] == "fenced"
    assert server_state(s, "rw", p.address)["state"] == "up"
    for _ in range(3):
        assert server_id_through(s, p, "rw") == "1"
    # The primary steps down: the newcomer's fence is lifted and it serves.
    p.sql("SET GLOBAL read_only = 1")
    harness.wait_until(lambda: server_state(s, "rw", r.address)["state"] == "up", timeout=20,
                       what="the newcomer serves")
    assert server_state(s, "rw", p.address)["state"] == "standby"
    assert server_id_through(s, p, "rw") == "2"


def test_a_replica_whose_replication_stops_leaves_the_read_pool(admin_sluice, primary_replica, tmp_path):
    p, r = primary_replica
    s = admin_sluice([listener(name="ro", upstream="ro")],
               {"ro": upstream(r.address, health=health(tmp_path, role="replica"))})
    s.log.wait_for(rf"server {re.escape(r.address)} is up \(active check\): role is replica", timeout=20)
    start = len(s.log.lines)
    r.sql("STOP SLAVE SQL_THREAD")
    s.log.wait_for(rf"server {re.escape(r.address)} marked down \(active check\): .*replication is not running",
                   start=start, timeout=20)
    start = len(s.log.lines)
    r.sql("START SLAVE SQL_THREAD")
    s.log.wait_for(rf"server {re.escape(r.address)} is up \(active check\): role is replica", start=start,
                   timeout=20)


def test_a_replica_behind_max_lag_leaves_the_read_pool_and_returns(admin_sluice, template, tmp_path):
    p = mp.make_primary(template, tmp_path / "primary")
    r = None
    try:
        # The replica applies every event 4 s after the primary wrote it:
        # real lag, on demand.
        r = mp.make_replica(template, tmp_path / "replica", p, server_id=3, delay_s=4)
        s = admin_sluice([listener(name="ro", upstream="ro")],
                   {"ro": upstream(r.address, health=health(tmp_path, role="replica", max_lag="2s"))})
        s.log.wait_for(rf"server {re.escape(r.address)} is up \(active check\): role is replica", timeout=30)
        start = len(s.log.lines)
        p.sql("INSERT INTO app.writes VALUES (1, @@server_id)")
        s.log.wait_for(rf"server {re.escape(r.address)} marked down \(active check\): role is replica, "
                       r"[0-9]+s behind \(max_lag 2s\)", start=start, timeout=20)
        start = len(s.log.lines)
        s.log.wait_for(rf"server {re.escape(r.address)} is up \(active check\): role is replica", start=start,
                       timeout=30)
    finally:
        if r is not None:
            r.stop()
        p.stop()


def test_a_server_that_hangs_in_the_handshake_fails_at_the_timeout(admin_sluice, tmp_path):
    # Accepts and never sends the server greeting.
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    held = []
    stop = threading.Event()

    def accept_and_hold():
        lsock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
                held.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=accept_and_hold, daemon=True)
    t.start()
    try:
        addr = "127.0.0.1:%d" % lsock.getsockname()[1]
        h = health(tmp_path, role="primary")
        h.update({"timeout": "700ms", "initial": "up"})
        s = admin_sluice([listener()], {"up": upstream(addr, health=h)})
        s.log.wait_for(rf"server {re.escape(addr)} marked down \(active check\): .*timeout", timeout=20)
        # The control loop was never held: the admin API answers.
        assert "timeout" in server_state(s, "up", addr)["reason"]
    finally:
        stop.set()
        t.join(timeout=5)
        for c in held:
            c.close()
        lsock.close()
