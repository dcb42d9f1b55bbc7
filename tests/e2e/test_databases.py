"""Real databases behind sluice: PostgreSQL and Redis servers from Debian,
their own clients (psql, pgbench, redis-cli, redis-benchmark) in front.

Everything is on loopback with ports picked at run time. Each test starts its
own servers and stops them at the end, pass or fail; the PostgreSQL data
directories are made once per module (one initdb, copied for the second
server)."""

from __future__ import annotations

import contextlib
import re
import shutil

import pytest

import dbpeers
from dbpeers import PgConn, RespConn
from harness import listener, upstream


# --------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pg_clusters():
    why = dbpeers.pg_missing()
    if why:
        pytest.skip(why)
    with dbpeers.pg_cluster_pair() as clusters:
        yield clusters


@pytest.fixture
def pg_pair(pg_clusters):
    """Two running PostgreSQL servers, stopped when the test ends."""
    with dbpeers.pg_servers(pg_clusters) as servers:
        yield servers


@pytest.fixture
def redis_servers(tmp_path):
    """make() -> a running redis-server, stopped when the test ends."""
    why = dbpeers.redis_missing()
    if why:
        pytest.skip(why)
    started: list[dbpeers.RedisServer] = []

    def make() -> dbpeers.RedisServer:
        srv = dbpeers.RedisServer(tmp_path / f"redis{len(started) + 1}")
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


def pg_sluice(sluice, servers, **upstream_kw):
    """One listener "pg", least_conn over `servers`, two workers."""
    up = dict(max_fails=1, fail_timeout="30s")
    up.update(upstream_kw)
    return sluice([listener("pg", "pg")],
                  {"pg": upstream(*servers, balance="least_conn", **up)},
                  global_={"workers": 2})


def server_port(port: int, sslmode: str = "disable") -> int:
    """Which PostgreSQL server answered a psql session through `port`."""
    out = dbpeers.psql(port, "select inet_server_port()", sslmode=sslmode).stdout
    return int(out.strip())


CLEAN = {"client_closed", "server_closed"}


# --------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------

def test_psql_select_and_ssl_request_pass_through(sluice, pg_pair):
    a, b = pg_pair
    s = pg_sluice(sluice, [a, b])
    port = s.port("pg")

    r = dbpeers.psql(port, "select 1", sslmode="disable")
    assert r.stdout.strip() == "1"
    # sslmode=prefer sends an SSLRequest first; the server (ssl = off)
    # answers 'N' through sluice and libpq carries on in clear.
    r = dbpeers.psql(port, "select 1", sslmode="prefer")
    assert r.stdout.strip() == "1"
    # ...and the 'N' really reached the client: require gives up on it.
    r = dbpeers.psql(port, "select 1", sslmode="require", check=False)
    assert r.returncode != 0
    assert "server does not support SSL" in r.stderr, r.stderr

    # The same exchange byte by byte: an SSLRequest costs exactly 8 bytes in
    # and 1 byte out, nothing else changes.
    with PgConn("127.0.0.1", port) as plain:
        assert plain.scalar("select 6 * 7") == "42"
    with PgConn("127.0.0.1", port, ssl_request=True) as pref:
        assert pref.ssl_answer == b"N"
        assert pref.scalar("select 6 * 7") == "42"
    recs = s.wait_records(5)
    assert all(rec["cause"] in CLEAN and rec["tries"] == "1" for rec in recs), recs
    # psql may exit before sluice has closed its session, so records come in
    # any order: find ours by client address.
    by_client = {rec["client"]: rec for rec in recs}
    plain_rec, pref_rec = by_client[plain.client], by_client[pref.client]
    assert int(pref_rec["bytes_in"]) - int(plain_rec["bytes_in"]) == 8, (plain_rec, pref_rec)
    assert int(pref_rec["bytes_out"]) - int(plain_rec["bytes_out"]) == 1, (plain_rec, pref_rec)


def test_sessions_spread_over_both_servers(sluice, pg_pair):
    a, b = pg_pair
    s = pg_sluice(sluice, [a, b])
    port = s.port("pg")
    want = {a.port, b.port}

    # One at a time: each goes to the other server than the one before (ties
    # take turns, and a session sluice has not closed yet still counts).
    seen = [server_port(port, sslmode=("disable", "prefer")[i % 2]) for i in range(6)]
    assert set(seen) == want, seen
    recs = s.wait_records(6)
    assert {r["server"] for r in recs} == {a.address, b.address}, recs
    assert all(r["cause"] in CLEAN and r["tries"] == "1" for r in recs), recs

    # Held open together: least_conn splits them evenly, across both workers.
    held = []
    try:
        for _ in range(6):
            conn = PgConn("127.0.0.1", port)
            held.append(conn)
            conn.server = int(conn.scalar("select inet_server_port()"))
        ports = [c.server for c in held]
        assert sorted(ports.count(p) for p in want) == [3, 3], ports
        # Every session is a real backend process of its own.
        pids = {c.scalar("select pg_backend_pid()") for c in held}
        assert len(pids) == 6
    finally:
        for c in held:
            c.close()
    s.wait_records(12)


def test_pgbench_through_sluice(sluice, pg_pair):
    a, b = pg_pair
    s = pg_sluice(sluice, [a, b])
    port = s.port("pg")
    by_port = {a.port: a, b.port: b}
    done = 0  # sessions finished so far (each leaves one access record)

    def initialise_other_than(holder: PgConn):
        """`pgbench -i` through sluice while `holder` keeps one server busy:
        least_conn must send it to the other one."""
        nonlocal done
        r = dbpeers.pgbench(port, "-i", "-s", "1", "-q")
        assert r.returncode == 0, f"pgbench -i failed:\n{r.stdout}\n{r.stderr}"
        done += 1
        rec = s.wait_records(done)[-1]
        assert rec["server"] != f"127.0.0.1:{holder.server}", (rec, holder.server)
        return by_port[int(rec["server"].rpartition(":")[2])]

    with contextlib.ExitStack() as cleanup:
        h1 = cleanup.enter_context(PgConn("127.0.0.1", port))
        h1.server = int(h1.scalar("select inet_server_port()"))
        first = initialise_other_than(h1)
        # h1's server now has one session, the other none: h2 goes there.
        h2 = cleanup.enter_context(PgConn("127.0.0.1", port))
        h2.server = int(h2.scalar("select inet_server_port()"))
        assert h2.server == first.port, (h1.server, h2.server)
        h1.close()
        done += 1
        s.wait_records(done)
        second = initialise_other_than(h2)
    done += 1  # h2
    assert {first.port, second.port} == {a.port, b.port}

    for srv in (a, b):  # each server now has its own pgbench tables
        with PgConn("127.0.0.1", srv.port) as direct:
            assert direct.scalar("select count(*) from pgbench_accounts") == "100000"

    r = dbpeers.pgbench(port, "-c", "8", "-j", "2", "-T", "5", "-n")
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"pgbench exited {r.returncode}:\n{out}"
    m = re.search(r"number of transactions actually processed: (\d+)", out)
    assert m and int(m.group(1)) > 0, out
    m = re.search(r"number of failed transactions: (\d+)", out)
    assert m and m.group(1) == "0", out

    recs = s.wait_records(done + 8)
    run = recs[done:]
    assert {r["server"] for r in run} == {a.address, b.address}, run
    assert all(r["cause"] in CLEAN and r["tries"] == "1" for r in run), run
    # The tables on both servers took part.
    for srv in (a, b):
        with PgConn("127.0.0.1", srv.port) as direct:
            assert int(direct.scalar("select count(*) from pgbench_history")) > 0


def test_pgbench_new_connections_without_half_close(sluice, pg_pair):
    """half_close = false: each logout (Terminate, then the client's FIN)
    reaches the server before sluice closes both sides, so PostgreSQL sees
    every session end cleanly, none abandoned."""
    a, _ = pg_pair
    s = sluice([listener("pg", "pg", half_close=False)], {"pg": upstream(a)})
    port = s.port("pg")

    def abandoned() -> int:
        with PgConn("127.0.0.1", a.port) as direct:
            return int(direct.scalar(
                "select sessions_abandoned from pg_stat_database where datname = 'postgres'"))

    r = dbpeers.pgbench(port, "-i", "-s", "1", "-q")
    assert r.returncode == 0, f"pgbench -i failed:\n{r.stdout}\n{r.stderr}"
    before = abandoned()
    r = dbpeers.pgbench(port, "-n", "-S", "-C", "-c", "4", "-j", "2", "-t", "50")
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"pgbench exited {r.returncode}:\n{out}"
    assert "number of transactions actually processed: 200/200" in out, out
    assert re.search(r"number of failed transactions: 0\b", out), out
    # Whichever FIN sluice sees first ends the session: the client's, or
    # the server's when the backend exits on the Terminate before it.
    recs = s.wait_records(201)
    assert all(rec["cause"] in CLEAN for rec in recs), [rec for rec in recs if rec["cause"] not in CLEAN][:3]
    assert abandoned() == before


def test_stopped_server_is_skipped_and_marked_down(sluice, pg_pair):
    a, b = pg_pair
    s = pg_sluice(sluice, [a, b], fail_timeout="60s")
    port = s.port("pg")
    assert {server_port(port) for _ in range(2)} == {a.port, b.port}
    s.wait_records(2)  # psql can exit before sluice has let go of its server

    # Two sessions held open: least_conn puts one on each server.
    held = [PgConn("127.0.0.1", port), PgConn("127.0.0.1", port)]
    try:
        on = {int(c.scalar("select inet_server_port()")): c for c in held}
        assert set(on) == {a.port, b.port}, list(on)
        b.stop()
        dbpeers.wait_port_closed(b.port)
        # The session on b ends with b (PostgreSQL says why, then closes)...
        with pytest.raises((dbpeers.PgError, AssertionError, OSError)):
            on[b.port].scalar("select 1")
        # ...the one on a is not disturbed.
        assert int(on[a.port].scalar("select inet_server_port()")) == a.port
    finally:
        for c in held:
            c.close()

    before = len(s.wait_records(4))  # the two psql runs and the two held sessions
    # New sessions all work: the first that picks b is retried on a, and b is
    # then left out for fail_timeout.
    for i in range(4):
        assert server_port(port, sslmode=("disable", "prefer")[i % 2]) == a.port
    s.log.wait_for(rf'upstream "pg" server {re.escape(b.address)} marked down')
    assert len(s.log.matches(r"marked down")) == 1, s.log.text()

    recs = s.wait_records(before + 4)
    ended_with_b = [r for r in recs[2:before] if r["server"] == b.address]
    assert [r["cause"] for r in ended_with_b] == ["server_closed"], recs[2:before]
    recs = recs[before:]
    assert all(r["server"] == a.address and r["cause"] in CLEAN for r in recs), recs
    assert [r["tries"] for r in recs].count("2") == 1, recs


# --------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------

def redis_sluice(sluice, servers):
    return sluice([listener("redis", "redis")],
                  {"redis": upstream(*servers, balance="least_conn")},
                  global_={"workers": 2})


def test_redis_ping_and_benchmark(sluice, redis_servers):
    r1, r2 = redis_servers(), redis_servers()
    s = redis_sluice(sluice, [r1, r2])
    port = s.port("redis")

    for _ in range(2):
        r = dbpeers.redis_cli(port, "PING")
        assert r.returncode == 0 and r.stdout.strip() == b"PONG", r

    r = dbpeers.redis_cli(port, "--no-raw", "INFO", "server")
    assert b"redis_version:" in r.stdout, r

    r = dbpeers.redis_benchmark(port, "-t", "set,get", "-n", "20000", "-c", "20", "-q")
    out = r.stdout.decode(errors="replace").replace("\r", "\n")
    assert r.returncode == 0, f"redis-benchmark exited {r.returncode}:\n{out}\n{r.stderr!r}"
    for test in ("SET", "GET"):
        assert re.search(rf"^{test}: [\d.]+ requests per second", out, re.M), out

    # 3 redis-cli sessions, then 20 clients per test (plus its own probes).
    recs = s.wait_records(3 + 40)
    assert {r["server"] for r in recs} == {r1.address, r2.address}
    assert all(r["tries"] == "1" and r["cause"] in CLEAN for r in recs), \
        [r for r in recs if r["tries"] != "1" or r["cause"] not in CLEAN]
    # Both servers did real work.
    for srv in (r1, r2):
        with RespConn("127.0.0.1", srv.port) as direct:
            stats = direct.call("INFO", "commandstats").decode()
            assert "cmdstat_set:" in stats and "cmdstat_get:" in stats, stats


def test_redis_pipeline_of_10000_commands(sluice, redis_servers):
    srv = redis_servers()
    s = redis_sluice(sluice, [srv])
    port = s.port("redis")

    n = 10_000
    payload = b"".join(dbpeers.resp_command("SET", f"key:{i}", f"value:{i}") for i in range(n))
    r = dbpeers.redis_cli(port, "--pipe", input=payload, timeout=60)
    out = (r.stdout + r.stderr).decode(errors="replace")
    assert r.returncode == 0, out
    assert f"errors: 0, replies: {n}" in out, out

    with RespConn("127.0.0.1", port) as c:
        assert c.call("DBSIZE") == n
        assert c.call("GET", "key:0") == b"value:0"
        assert c.call("GET", f"key:{n - 1}") == f"value:{n - 1}".encode()
    # Everything went through the one session (redis-cli adds a closing
    # ECHO of its own to know when the last reply is in): n "+OK\r\n" back.
    # The records may come in either order: the pipe's session ends only
    # once Redis has closed its side too, which on a busy machine can be
    # after the three calls above. The pipe's is the one that carried more.
    rec = max(s.wait_records(2), key=lambda r: int(r["bytes_in"]))
    assert rec["cause"] in CLEAN, rec
    assert 0 <= int(rec["bytes_in"]) - len(payload) < 100, (rec, len(payload))
    assert 0 <= int(rec["bytes_out"]) - 5 * n < 100, rec


def test_redis_set_then_get_through_sluice(sluice, redis_servers):
    srv = redis_servers()
    s = redis_sluice(sluice, [srv])
    port = s.port("redis")

    r = dbpeers.redis_cli(port, "SET", "greeting", "hello through sluice")
    assert r.returncode == 0 and r.stdout.strip() == b"OK", r
    r = dbpeers.redis_cli(port, "GET", "greeting")
    assert r.returncode == 0 and r.stdout.strip() == b"hello through sluice", r

    # A value larger than sluice's buffers and watermarks, every byte value.
    big = bytes(range(256)) * (3 * 4096 + 7)
    with RespConn("127.0.0.1", port) as c:
        assert c.call("SET", "big", big) == "OK"
    with RespConn("127.0.0.1", port) as c:
        assert c.call("STRLEN", "big") == len(big)
        assert c.call("GET", "big") == big
    with RespConn("127.0.0.1", srv.port) as direct:
        assert direct.call("GET", "big") == big
        assert direct.call("GET", "greeting") == b"hello through sluice"
    recs = s.wait_records(4)
    assert all(r["server"] == srv.address and r["cause"] in CLEAN for r in recs), recs
