"""Refusals in the client's protocol (listener `protocol`): a client that
sluice refuses reads why, in its own client: psql, mariadb and redis-cli,
the real ones, print the text checked here. Real servers stand behind the
sessions that are not refused.

A listener without `protocol` still closes a refused client at once, with
no byte sent; a refused client that never sends its first message is closed
at preread_timeout; hostile first messages are bounded."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import time

import pytest

import dbpeers
import harness
import mariadb_peers as mp
from harness import listener, upstream
from test_databases import pg_clusters  # noqa: F401  (fixture: one initdb for the module)

MARIADB = shutil.which("mariadb")
REDIS_CLI = shutil.which("redis-cli")

NO_SERVER_PG = 'sluice: no server available in upstream "pg" (no_server)'


def closed_port() -> str:
    """An address where nothing listens (bound, then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


def down_upstream(*servers: str) -> dict:
    """An upstream whose servers a check keeps down from the start: no_server."""
    up = upstream(*(servers or (closed_port(),)))
    up["health"] = {"type": "tcp", "initial": "down", "interval": "1s"}
    return up


def pg_startup(user: str = "alice") -> bytes:
    body = struct.pack(">I", 196608) + b"user\0" + user.encode() + b"\0database\0db\0\0"
    return struct.pack(">I", len(body) + 4) + body


SSL_REQUEST = struct.pack(">II", 8, 80877103)


def read_all(sock: socket.socket, timeout: float = harness.EVENT_TIMEOUT) -> bytes:
    """Everything the peer sends until it closes (EOF or reset)."""
    sock.settimeout(timeout)
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not chunk:
            return out
        out += chunk


def pg_error_fields(reply: bytes) -> dict[str, str]:
    """The fields of one ErrorResponse ('E', length, type+value NUL ..., NUL)."""
    assert reply[:1] == b"E", reply
    n, = struct.unpack(">I", reply[1:5])
    assert len(reply) == 1 + n, reply
    fields = {}
    for part in reply[5:-2].split(b"\0"):
        fields[chr(part[0])] = part[1:].decode()
    return fields


def psql(port: int, sslmode: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
    return dbpeers.psql(port, "select 1", sslmode=sslmode, check=False, timeout=timeout)


def mariadb(port: int, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([MARIADB, "--no-defaults", "-h", "127.0.0.1", "-P", str(port), "-u", "root",
                           "--connect-timeout=10", *extra, "-e", "select 1"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)


def redis_cli(port: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([REDIS_CLI, "-h", "127.0.0.1", "-p", str(port), *args],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)


def records_with(s: harness.Sluice, cause: str, count: int = 1) -> list[dict]:
    return s.wait_records(count, pred=lambda r: r.get("cause") == cause)


# --------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------

need_psql = pytest.mark.skipif(dbpeers.pg_missing() is not None, reason=dbpeers.pg_missing() or "")


@pytest.fixture
def pg_server(pg_clusters):
    with dbpeers.pg_servers(pg_clusters[:1]) as servers:
        yield servers[0]


@need_psql
def test_psql_refused_for_no_server_reads_why(sluice):
    s = sluice([listener("pg", "pg", protocol="postgres")], {"pg": down_upstream()})
    port = s.port("pg")
    for sslmode in ("prefer", "disable", "allow"):
        r = psql(port, sslmode)
        assert r.returncode != 0
        assert f"FATAL:  {NO_SERVER_PG}" in r.stderr, (sslmode, r.stderr)
    # sslmode=require will not read an error over plain text: the 'N' ends it.
    r = psql(port, "require")
    assert r.returncode != 0 and "server does not support SSL" in r.stderr, r.stderr
    # What went over the wire: 'N' to the SSLRequest, then one FATAL
    # ErrorResponse with SQLSTATE 57P03, then the close.
    c = socket.create_connection(s.addr("pg"), timeout=harness.EVENT_TIMEOUT)
    c.sendall(SSL_REQUEST)
    assert harness.recv_exact(c, 1) == b"N"
    c.sendall(pg_startup())
    fields = pg_error_fields(read_all(c))
    assert fields == {"S": "FATAL", "V": "FATAL", "C": "57P03", "M": NO_SERVER_PG}
    c.close()
    # The access log still says why.
    assert len(records_with(s, "no_server", 5)) >= 5


@need_psql
def test_psql_over_the_client_limit_reads_why_and_the_held_session_works(sluice, pg_server):
    s = sluice([listener("pg", "pg", protocol="postgres", client_max_connections=1)],
               {"pg": upstream(pg_server.address)})
    port = s.port("pg")
    # Not refused: a real session through the listener, unchanged.
    with dbpeers.PgConn("127.0.0.1", port) as held:
        assert held.scalar("select 21 * 2") == "42"
        r = psql(port, "prefer")
        assert r.returncode != 0
        assert ('FATAL:  sluice: too many connections from this address, before upstream "pg" (client_limit)'
                in r.stderr), r.stderr
        c = socket.create_connection(s.addr("pg"), timeout=harness.EVENT_TIMEOUT)
        c.sendall(pg_startup())
        assert pg_error_fields(read_all(c))["C"] == "53300"
        c.close()
        assert held.scalar("select 1") == "1"
    # The slot is free again: psql gets through.
    harness.wait_until(lambda: psql(port, "disable").returncode == 0, timeout=harness.EVENT_TIMEOUT,
                       what="psql through once the held session ended")


@need_psql
def test_psql_refused_by_the_access_list_reads_why(sluice):
    s = sluice([listener("pg", "pg", protocol="postgres", deny=["127.0.0.0/8"])], {"pg": down_upstream()})
    r = psql(s.port("pg"), "prefer")
    assert 'FATAL:  sluice: this address is not allowed, before upstream "pg" (acl_denied)' in r.stderr, r.stderr
    c = socket.create_connection(s.addr("pg"), timeout=harness.EVENT_TIMEOUT)
    c.sendall(pg_startup())
    assert pg_error_fields(read_all(c))["C"] == "28000"
    c.close()


@need_psql
def test_preread_postgres_implies_the_protocol(sluice):
    """preread = "postgres" answers 'S' to route on the SNI: a client already
    in TLS cannot be told in plain text and is closed; psql's
    sslmode=prefer then tries without TLS and reads the error."""
    s = sluice([listener("pg", None, preread="postgres", default_upstream="pg")], {"pg": down_upstream()})
    port = s.port("pg")
    r = psql(port, "prefer")
    assert f"FATAL:  {NO_SERVER_PG}" in r.stderr, r.stderr
    r = psql(port, "disable")
    assert f"FATAL:  {NO_SERVER_PG}" in r.stderr, r.stderr


@need_psql
def test_psql_told_about_a_full_queue_and_a_queue_timeout(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    up = upstream(be.address, queue=1, queue_timeout="3s")
    up["servers"][0]["max_conns"] = 1
    s = sluice([listener("pg", "pg", protocol="postgres")], {"pg": up})
    held = s.connect("pg")
    assert harness.recv_line(held).strip() == b"A"
    # The second client waits in the queue (one worker takes them in the
    # order they came) and is told when it times out; meanwhile a third
    # finds the queue full.
    waiting = socket.create_connection(s.addr("pg"), timeout=harness.EVENT_TIMEOUT)
    waiting.sendall(pg_startup())
    r = psql(s.port("pg"), "disable")
    assert ('FATAL:  sluice: every server of upstream "pg" is busy and its queue is full (no_server)'
            in r.stderr), r.stderr
    fields = pg_error_fields(read_all(waiting))
    assert fields["C"] == "53300"
    assert fields["M"] == 'sluice: every server of upstream "pg" stayed busy until the queue timed out (queue_timeout)'
    waiting.close()
    held.close()


# --------------------------------------------------------------------------
# MySQL / MariaDB
# --------------------------------------------------------------------------

need_mariadb = pytest.mark.skipif(mp.missing() is not None, reason=mp.missing() or "")


@pytest.fixture(scope="module")
def mariadb_template(tmp_path_factory):
    if mp.missing():
        pytest.skip(mp.missing())
    return mp.install_template(tmp_path_factory.mktemp("mariadb"))


@need_mariadb
def test_mariadb_refused_reads_error_1040_in_place_of_the_handshake(sluice):
    s = sluice([listener("db", "db", protocol="mysql")], {"db": down_upstream()})
    port = s.port("db")
    want = 'sluice: no server available in upstream "db" (no_server)'
    r = mariadb(port, "--skip-ssl")
    assert r.returncode != 0
    assert f"ERROR 1040 (HY000): {want}" in r.stderr, r.stderr
    # A client that wants TLS still shows the text, inside its own warning.
    r = mariadb(port)
    assert r.returncode != 0 and f"1040 - {want}" in r.stderr, r.stderr
    # On the wire: one ERR packet, sequence 0, nothing read from the client.
    c = socket.create_connection(s.addr("db"), timeout=harness.EVENT_TIMEOUT)
    reply = read_all(c)
    c.close()
    n = reply[0] | reply[1] << 8 | reply[2] << 16
    assert len(reply) == 4 + n and reply[3] == 0 and reply[4] == 0xFF
    assert struct.unpack("<H", reply[5:7])[0] == 1040 and reply[7:].decode() == want
    assert len(records_with(s, "no_server", 3)) >= 3


@need_mariadb
def test_mariadb_over_the_rate_limit_reads_why_while_a_real_session_works(sluice, mariadb_template, tmp_path):
    server = mp.MariaDb(mariadb_template, tmp_path / "db", server_id=1)
    try:
        s = sluice([listener("db", "db", protocol="mysql", client_rate_limit="1/m")], {"db": upstream(server.address)})
        port = s.port("db")
        # The first connection of the minute is a real session.
        assert server.sql("select 40 + 2", port=port) == "42"
        r = mariadb(port, "--skip-ssl")
        assert ('ERROR 1040 (HY000): sluice: too many new connections from this address, before upstream "db" '
                '(rate_limited)' in r.stderr), r.stderr
    finally:
        server.stop()


@need_mariadb
def test_mariadb_refused_by_the_access_list_reads_error_1130(sluice):
    s = sluice([listener("db", "db", protocol="mysql", allow=["10.0.0.0/8"])], {"db": down_upstream()})
    r = mariadb(s.port("db"), "--skip-ssl")
    assert 'ERROR 1130 (HY000): sluice: this address is not allowed, before upstream "db" (acl_denied)' in r.stderr, \
        r.stderr


# --------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------

need_redis = pytest.mark.skipif(REDIS_CLI is None or dbpeers.redis_missing() is not None,
                                reason=dbpeers.redis_missing() or "redis-cli not installed")


@need_redis
def test_redis_cli_refused_reads_the_error_after_its_first_command(sluice):
    s = sluice([listener("cache", "cache", protocol="redis")], {"cache": down_upstream()})
    r = redis_cli(s.port("cache"), "ping")
    assert 'ERR sluice: no server available in upstream "cache" (no_server)' in r.stdout + r.stderr, r
    # On the wire: nothing until the command is whole, then one error line.
    c = socket.create_connection(s.addr("cache"), timeout=harness.EVENT_TIMEOUT)
    c.sendall(b"*2\r\n$4\r\nECHO\r\n$2\r")
    c.settimeout(0.3)
    with pytest.raises(socket.timeout):
        c.recv(100)
    c.sendall(b"\nhi\r\n")
    assert read_all(c) == b'-ERR sluice: no server available in upstream "cache" (no_server)\r\n'
    c.close()


@need_redis
def test_redis_cli_over_the_client_limit_reads_why_while_a_real_session_works(sluice, tmp_path):
    server = dbpeers.RedisServer(tmp_path / "redis")
    try:
        s = sluice([listener("cache", "cache", protocol="redis", client_max_connections=1)],
                   {"cache": upstream(server.address)})
        with dbpeers.RespConn(*s.addr("cache")) as held:
            assert held.call("SET", "k", "v") == "OK"
            r = redis_cli(s.port("cache"), "get", "k")
            out = r.stdout + r.stderr
            assert ('ERR sluice: too many connections from this address, before upstream "cache" (client_limit)'
                    in out), out
            assert held.call("GET", "k") == b"v"
        harness.wait_until(lambda: redis_cli(s.port("cache"), "get", "k").stdout.strip() == "v",
                           timeout=harness.EVENT_TIMEOUT, what="redis-cli through once the held session ended")
    finally:
        server.stop()


# --------------------------------------------------------------------------
# bounds, and listeners without protocol
# --------------------------------------------------------------------------

def test_without_protocol_a_refusal_closes_at_once_with_nothing_sent(sluice):
    s = sluice([listener("plain", "up")], {"up": down_upstream()})
    c = socket.create_connection(s.addr("plain"), timeout=harness.EVENT_TIMEOUT)
    t0 = time.monotonic()
    assert read_all(c, timeout=5) == b""
    assert time.monotonic() - t0 < 2.0, "a refusal without protocol waited for something"
    c.close()


@pytest.mark.parametrize("protocol", ["postgres", "redis"])
def test_a_client_that_never_sends_is_closed_at_preread_timeout(sluice, protocol):
    s = sluice([listener("l", "up", protocol=protocol, preread_timeout="400ms")], {"up": down_upstream()})
    c = socket.create_connection(s.addr("l"), timeout=harness.EVENT_TIMEOUT)
    t0 = time.monotonic()
    assert read_all(c) == b""
    waited = time.monotonic() - t0
    assert waited >= 0.3, f"closed after {waited:.2f}s, before preread_timeout"
    c.close()
    records_with(s, "no_server")


def test_hostile_first_messages_are_bounded(sluice):
    s = sluice([listener("pg", "up", protocol="postgres"), listener("r", "up", protocol="redis")],
               {"up": down_upstream()})
    # A startup packet longer than PostgreSQL's limit: closed, nothing said.
    c = socket.create_connection(s.addr("pg"), timeout=harness.EVENT_TIMEOUT)
    c.sendall(struct.pack(">I", 1_000_000) + b"x" * 1000)
    assert read_all(c) == b""
    c.close()
    # A Redis line that never ends: answered at 64 KiB, the rest not read.
    c = socket.create_connection(s.addr("r"), timeout=harness.EVENT_TIMEOUT)
    sent = 0
    c.settimeout(harness.EVENT_TIMEOUT)
    try:
        while sent < 1 << 20:
            c.sendall(b"a" * 65536)
            sent += 65536
    except (BrokenPipeError, ConnectionResetError):
        pass
    c.close()
    # Bytes a client sends are never echoed: a name with a newline and quotes.
    c = socket.create_connection(s.addr("r"), timeout=harness.EVENT_TIMEOUT)
    c.sendall(b'GET "\r\n-OK injected\r\n')
    reply = read_all(c)
    assert reply == b'-ERR sluice: no server available in upstream "up" (no_server)\r\n', reply
    c.close()
