"""The active health probes, one check at a time through `health_probe`,
against real peers on loopback: Python TCP/HTTP servers that answer well,
badly, slowly or not at all, a real Redis master and replica, and a real
PostgreSQL primary and streaming standby with SCRAM password auth.

health_probe prints "ok REASON" / "fail REASON" per check and exits 0/1 (3
when it left a libuv handle open, which would be a leak in the checker).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import harness

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
import dbpeers  # noqa: E402

# Slack for a loaded 2-core machine or a sanitizer build, on top of a timeout.
SLACK = 2.0


def probe_bin() -> Path:
    return harness.sluice_bin().parent / "tests" / "health" / "health_probe"


@pytest.fixture(scope="module", autouse=True)
def need_probe_bin():
    if not probe_bin().exists():
        pytest.skip(f"{probe_bin()} not built (meson -Dtests=true)")


class Result:
    def __init__(self, proc: subprocess.CompletedProcess, elapsed: float):
        self.rc = proc.returncode
        self.lines = proc.stdout.splitlines()
        self.stderr = proc.stderr
        self.elapsed = elapsed

    @property
    def line(self) -> str:
        assert self.lines, f"no output; stderr: {self.stderr}"
        return self.lines[-1]

    def __repr__(self):
        return f"rc={self.rc} lines={self.lines} stderr={self.stderr!r} elapsed={self.elapsed:.2f}s"


def probe(address: str, *args: str, timeout: float = 30.0) -> Result:
    start = time.monotonic()
    proc = subprocess.run([str(probe_bin()), *args, address], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    r = Result(proc, time.monotonic() - start)
    assert r.rc in (0, 1), r  # 2: usage, 3: a handle left open
    assert r.rc == (0 if r.line.startswith(("ok ", "cancelled")) else 1), r
    return r


def ok(address: str, *args: str) -> str:
    r = probe(address, *args)
    assert r.rc == 0, r
    return r.line[3:]


def fail(address: str, *args: str) -> str:
    r = probe(address, *args)
    assert r.rc == 1, r
    return r.line[5:]


# --------------------------------------------------------------------------
# peers
# --------------------------------------------------------------------------

def read_head(conn: socket.socket, limit: int = 65536) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data and len(data) < limit:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def http_handler(status: int = 200, body: bytes = b"ok\n", requests: list | None = None,
                 content_length: bool = True):
    def handle(backend, conn):
        head = read_head(conn)
        if requests is not None:
            requests.append(head)
        reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}.get(status, "X")
        out = b"HTTP/1.1 %d %s\r\nConnection: close\r\n" % (status, reason.encode())
        if content_length:
            out += b"Content-Length: %d\r\n" % len(body)
        conn.sendall(out + b"\r\n" + body)
    return handle


def silent_handler(release: threading.Event):
    """Accepts, reads, never answers (until the test ends)."""
    def handle(backend, conn):
        conn.settimeout(0.2)
        while not release.is_set():
            try:
                if not conn.recv(4096):
                    return
            except socket.timeout:
                continue
    return handle


def closing_handler(backend, conn):
    conn.close()


def garbage_handler(backend, conn):
    read_head(conn)
    conn.sendall(b"\x00\xffTHIS IS NOT HTTP\r\n\r\n")


def line_handler(reply: bytes):
    """Answers `reply` to the first line received."""
    def handle(backend, conn):
        data = b""
        while b"\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                return
            data += chunk
        conn.sendall(reply)
    return handle


@pytest.fixture
def silent(backends):
    release = threading.Event()
    b = backends(silent_handler(release), name="silent")
    yield b
    release.set()


# --------------------------------------------------------------------------
# tcp
# --------------------------------------------------------------------------

def test_tcp_connect_and_refused(backends):
    b = backends(closing_handler)
    assert ok(b.address, "--type", "tcp") == "connected"
    assert fail(f"127.0.0.1:{harness.dead_port()}", "--type", "tcp") == "connect refused"


def test_tcp_on_ipv6_loopback(backends):
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        b = backends(closing_handler, host="::1")
    except OSError:
        pytest.skip("no ::1")
    assert ok(b.address, "--type", "tcp") == "connected"


def test_port_probes_another_port_of_the_same_host(backends):
    b = backends(http_handler(200))
    dead = harness.dead_port()
    assert ok(f"127.0.0.1:{dead}", "--type", "http", "--port", str(b.port)) == "HTTP 200"
    assert fail(b.address, "--type", "tcp", "--port", str(dead)) == "connect refused"


def test_repeated_checks_reuse_the_probe(backends):
    b = backends(http_handler(200))
    r = probe(b.address, "--type", "http", "--repeat", "3")
    assert r.rc == 0 and r.lines == ["ok HTTP 200"] * 3, r
    assert b.counts()[0] == 3


# --------------------------------------------------------------------------
# http
# --------------------------------------------------------------------------

def test_http_status_ranges(backends):
    good = backends(http_handler(200))
    bad = backends(http_handler(503, b"down\n"))
    missing = backends(http_handler(404))
    assert ok(good.address, "--type", "http") == "HTTP 200"
    assert fail(bad.address, "--type", "http") == "HTTP 503"
    assert fail(missing.address, "--type", "http") == "HTTP 404"
    # Explicit ranges: 503 wanted (a "replica" endpoint that answers 503 on a primary), 200 not.
    assert ok(bad.address, "--type", "http", "--expect-status", "404,500-503") == "HTTP 503"
    assert fail(good.address, "--type", "http", "--expect-status", "201-299") == "HTTP 200"


def test_http_request_line_and_host_header(backends):
    requests: list[bytes] = []
    b = backends(http_handler(200, requests=requests))
    ok(b.address, "--type", "http", "--path", "/primary", "--method", "OPTIONS")
    ok(b.address, "--type", "http", "--host", "db.example.com")
    first, second = requests
    assert first.startswith(b"OPTIONS /primary HTTP/1.1\r\n"), first
    assert f"\r\nHost: {b.address}\r\n".encode() in first, first
    assert b"\r\nConnection: close\r\n" in first
    assert second.startswith(b"GET / HTTP/1.1\r\n"), second
    assert b"\r\nHost: db.example.com\r\n" in second, second


def test_http_expect_body(backends):
    b = backends(http_handler(200, b'{"role": "master", "state": "running"}'))
    assert ok(b.address, "--type", "http", "--expect-body", '"role": "master"') == "HTTP 200, body matched"
    reason = fail(b.address, "--type", "http", "--expect-body", '"role": "replica"')
    assert reason.startswith("HTTP 200 but the body lacks"), reason
    # A body delimited by the close (no Content-Length) is read to the end too.
    c = backends(http_handler(200, b"x" * 100000 + b"MARK", content_length=False))
    assert "64 KiB" in fail(c.address, "--type", "http", "--expect-body", "MARK")
    d = backends(http_handler(200, b"y" * 1000 + b"MARK", content_length=False))
    assert ok(d.address, "--type", "http", "--expect-body", "MARK") == "HTTP 200, body matched"


def test_http_head_has_no_body(backends):
    b = backends(http_handler(200, b""))
    assert ok(b.address, "--type", "http", "--method", "HEAD") == "HTTP 200"


def test_http_garbage_and_closed_connections(backends):
    garbage = backends(garbage_handler)
    closing = backends(closing_handler)
    assert fail(garbage.address, "--type", "http").startswith("malformed HTTP response")
    assert fail(closing.address, "--type", "http") in (
        "connection closed without a response", "connection reset by peer")


def test_http_server_that_never_answers_fails_at_the_timeout(silent):
    r = probe(silent.address, "--type", "http", "--timeout", "500ms")
    assert r.rc == 1 and r.line == "fail timeout after 500ms", r
    assert 0.45 <= r.elapsed < 0.5 + SLACK, r


# --------------------------------------------------------------------------
# send_expect
# --------------------------------------------------------------------------

def test_send_expect_prefix_and_substring(backends):
    pong = backends(line_handler(b"+PONG\r\n"))
    err = backends(line_handler(b"-NOAUTH Authentication required.\r\n"))
    info = backends(line_handler(b"# Replication\r\nrole:master\r\nconnected_slaves:0\r\n"))
    assert ok(pong.address, "--type", "send_expect", "--send", "PING\\r\\n", "--expect", "+PONG") == "reply matched"
    reason = fail(err.address, "--type", "send_expect", "--send", "PING\\r\\n", "--expect", "+PONG")
    # The reply is quoted, cut at 32 bytes.
    assert reason == 'unexpected reply "-NOAUTH Authentication required."...', reason
    assert ok(info.address, "--type", "send_expect", "--send", "INFO replication\\r\\n",
              "--expect", "role:master", "--expect-match", "substring") == "reply matched"
    # substring: not there by the time the peer closes
    reason = fail(info.address, "--type", "send_expect", "--send", "INFO\\r\\n",
                  "--expect", "role:slave", "--expect-match", "substring")
    assert reason.startswith('unexpected reply "# Replication'), reason


def test_send_expect_hex(backends):
    b = backends(line_handler(b"\x00\x01OK\n"))
    assert ok(b.address, "--type", "send_expect", "--send-hex", "68690a", "--expect-hex", "00014f4b") == \
        "reply matched"


def test_send_expect_closed_and_silent(backends, silent):
    closing = backends(closing_handler)
    assert fail(closing.address, "--type", "send_expect", "--send", "PING\\r\\n", "--expect", "+PONG") in (
        "connection closed without a reply", "connection reset by peer", "write failed: broken pipe",
        "write failed: connection reset by peer")
    r = probe(silent.address, "--type", "send_expect", "--send", "PING\\r\\n", "--expect", "+PONG",
              "--timeout", "400ms")
    assert r.rc == 1 and r.line == "fail timeout after 400ms", r
    assert 0.35 <= r.elapsed < 0.4 + SLACK, r


# --------------------------------------------------------------------------
# redis
# --------------------------------------------------------------------------

@pytest.fixture
def redis_pair(tmp_path):
    """A master and a replica that follows it (REPLICAOF)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not installed")
    started: list[dbpeers.RedisServer] = []
    try:
        master = dbpeers.RedisServer(tmp_path / "master")
        started.append(master)
        replica = dbpeers.RedisServer(tmp_path / "replica")
        started.append(replica)
        with dbpeers.RespConn("127.0.0.1", replica.port) as c:
            assert c.call("REPLICAOF", "127.0.0.1", str(master.port)) == "OK"
        yield master, replica
    finally:
        for srv in started:
            srv.stop()


def test_redis_roles_follow_a_failover(redis_pair):
    master, replica = redis_pair
    assert ok(master.address, "--type", "redis", "--role", "master") == "role is master"
    assert fail(replica.address, "--type", "redis", "--role", "master") == "role is replica, want master"
    assert ok(replica.address, "--type", "redis", "--role", "replica") == "role is replica"
    assert ok(replica.address, "--type", "redis", "--role", "any") == "role is replica"
    # Failover: the replica is promoted, the old master follows it.
    with dbpeers.RespConn("127.0.0.1", replica.port) as c:
        assert c.call("REPLICAOF", "NO", "ONE") == "OK"
    with dbpeers.RespConn("127.0.0.1", master.port) as c:
        assert c.call("REPLICAOF", "127.0.0.1", str(replica.port)) == "OK"
    assert ok(replica.address, "--type", "redis", "--role", "master") == "role is master"
    assert fail(master.address, "--type", "redis", "--role", "master") == "role is replica, want master"


def test_redis_auth_from_password_file(redis_pair, tmp_path):
    master, _ = redis_pair
    with dbpeers.RespConn("127.0.0.1", master.port) as c:
        assert c.call("CONFIG", "SET", "requirepass", "s3cret") == "OK"
    good = tmp_path / "good"
    good.write_text("s3cret\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("nope\n")
    assert ok(master.address, "--type", "redis", "--role", "master", "--password-file", str(good)) == \
        "role is master"
    assert fail(master.address, "--type", "redis", "--password-file", str(wrong)).startswith("AUTH failed: ")
    assert fail(master.address, "--type", "redis").startswith('ROLE failed: "NOAUTH')
    assert fail(master.address, "--type", "redis", "--password-file", str(tmp_path / "absent")).startswith(
        "cannot read password_file")


def test_redis_refused_and_silent(silent):
    assert fail(f"127.0.0.1:{harness.dead_port()}", "--type", "redis") == "connect refused"
    r = probe(silent.address, "--type", "redis", "--timeout", "500ms")
    assert r.rc == 1 and r.line == "fail timeout after 500ms", r
    assert 0.45 <= r.elapsed < 0.5 + SLACK, r


# --------------------------------------------------------------------------
# postgres
# --------------------------------------------------------------------------

class StandbyServer(dbpeers.PgServer):
    READY = r"database system is ready to accept (read-only )?connections"


CHECKER_PASSWORD = "ch3ck-pw"


@pytest.fixture(scope="module")
def pg_primary_standby():
    """A primary and a streaming standby made with pg_basebackup -R; the
    role "checker" logs in with a SCRAM password."""
    why = dbpeers.pg_missing()
    if why:
        pytest.skip(why)
    root = dbpeers.make_pg_root()
    started: list[dbpeers.PgServer] = []
    try:
        primary_cluster = dbpeers.PgCluster(root, "primary")
        hba = primary_cluster.datadir / "pg_hba.conf"
        hba.write_text("host  all checker 127.0.0.1/32 scram-sha-256\n"
                       "host  replication all 127.0.0.1/32 trust\n" + hba.read_text())
        primary = dbpeers.PgServer(primary_cluster)
        started.append(primary)
        dbpeers.psql(primary.port, f"CREATE ROLE checker LOGIN PASSWORD '{CHECKER_PASSWORD}'")

        standby_cluster = dbpeers.PgCluster.__new__(dbpeers.PgCluster)
        standby_cluster.name = "standby"
        standby_cluster.datadir = root / "standby"
        standby_cluster.sockdir = root / "standby.sock"
        standby_cluster.sockdir.mkdir()
        shutil.chown(standby_cluster.sockdir, dbpeers.PG_USER, dbpeers.PG_USER)
        r = subprocess.run(
            [dbpeers.RUNUSER, "-u", dbpeers.PG_USER, "--", str(dbpeers.PG_BIN / "pg_basebackup"),
             "-h", "127.0.0.1", "-p", str(primary.port), "-U", dbpeers.PG_USER,
             "-D", str(standby_cluster.datadir), "-R", "-X", "stream", "--no-sync"],
            cwd=root, env=dbpeers.clean_env(), stdin=subprocess.DEVNULL, capture_output=True,
            text=True, timeout=120)
        assert r.returncode == 0, f"pg_basebackup: {r.stdout}\n{r.stderr}"
        standby = StandbyServer(standby_cluster)
        started.append(standby)
        yield primary, standby
    finally:
        for srv in reversed(started):
            srv.stop()
        shutil.rmtree(root, ignore_errors=True)


def pg_args(tmp_path: Path, role: str, password: str | None = CHECKER_PASSWORD) -> list[str]:
    args = ["--type", "postgres", "--role", role, "--user", "checker", "--sslmode", "disable"]
    if password is not None:
        f = tmp_path / "pgpass"
        f.write_text(password + "\n")
        args += ["--password-file", str(f)]
    return args


def test_postgres_roles_and_promotion(pg_primary_standby, tmp_path):
    primary, standby = pg_primary_standby
    assert ok(primary.address, *pg_args(tmp_path, "primary")) == "role is primary"
    assert fail(standby.address, *pg_args(tmp_path, "primary")) == "role is standby, want primary"
    assert ok(standby.address, *pg_args(tmp_path, "standby")) == "role is standby"
    assert ok(standby.address, *pg_args(tmp_path, "any")) == "role is standby"
    assert fail(primary.address, *pg_args(tmp_path, "standby")) == "role is primary, want standby"
    # Repeated checks on one probe (a fresh connection each time).
    r = probe(primary.address, *pg_args(tmp_path, "primary"), "--repeat", "3")
    assert r.rc == 0 and r.lines == ["ok role is primary"] * 3, r

    # Wrong or missing password: libpq's SCRAM exchange fails, and says so.
    assert "password authentication failed" in fail(primary.address, *pg_args(tmp_path, "any", "wrong"))
    assert "password" in fail(primary.address, *pg_args(tmp_path, "any", None))

    # Failover: promote the standby; the old primary is stopped.
    r = subprocess.run([dbpeers.RUNUSER, "-u", dbpeers.PG_USER, "--", str(dbpeers.PG_BIN / "pg_ctl"),
                        "promote", "-w", "-D", str(standby.cluster.datadir)],
                       env=dbpeers.clean_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    harness.wait_until(lambda: probe(standby.address, *pg_args(tmp_path, "primary")).rc == 0,
                       timeout=30, interval=0.2, what="the promoted standby to answer as a primary")
    primary.stop()
    assert fail(primary.address, *pg_args(tmp_path, "primary")) == "connect refused"


def test_postgres_silent_server_fails_at_the_timeout(silent, tmp_path):
    r = probe(silent.address, *pg_args(tmp_path, "any"), "--timeout", "500ms")
    assert r.rc == 1 and r.line == "fail timeout after 500ms", r
    assert 0.45 <= r.elapsed < 0.5 + SLACK, r


@pytest.mark.parametrize("kind", ["http", "send_expect", "redis", "postgres"])
def test_closing_a_probe_mid_check_closes_every_handle(kind, silent, tmp_path):
    """The checker closes probes with checks in flight on reload and stop;
    nothing may be left open (health_probe exits 3 otherwise, and a
    sanitizer build reports leaks)."""
    # (tcp is left out: its check is over once a loopback connect succeeds.)
    args = {"http": [], "send_expect": ["--send", "PING\\r\\n", "--expect", "+PONG"],
            "redis": [], "postgres": pg_args(tmp_path, "any")[2:]}[kind]
    r = probe(silent.address, "--type", kind, *args, "--timeout", "5s", "--cancel-after", "200ms")
    assert r.rc == 0 and r.lines == ["cancelled"], r
    assert r.elapsed < 5, r
