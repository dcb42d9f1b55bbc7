"""preread = "postgres": SNI routing of PostgreSQL's in-band TLS, end to end.

Two real PostgreSQL servers with `ssl = on` and their own self-signed
certificates sit behind one sluice port. psql asks for TLS with an
SSLRequest; sluice answers 'S' itself, reads the ClientHello's SNI, asks the
chosen server for TLS the same way and replays the hello. TLS ends at
PostgreSQL (pg_stat_ssl says so); sluice holds no keys."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading

import pytest

import dbpeers
import harness
from harness import listener, upstream


def _enable_ssl(cluster: dbpeers.PgCluster, cn: str) -> None:
    crt, key = cluster.datadir / "server.crt", cluster.datadir / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", f"/CN={cn}", "-keyout", str(key), "-out", str(crt)],
                   check=True, capture_output=True, timeout=60)
    for f in (crt, key):
        shutil.chown(f, dbpeers.PG_USER, dbpeers.PG_USER)
    key.chmod(0o600)
    with open(cluster.datadir / "postgresql.conf", "a") as f:
        f.write("ssl = on\n")


@pytest.fixture(scope="module")
def tls_clusters():
    why = dbpeers.pg_missing()
    if why:
        pytest.skip(why)
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    with dbpeers.pg_cluster_pair(lambda cluster, name: _enable_ssl(cluster, f"{name}.db.test")) as clusters:
        yield clusters


@pytest.fixture
def tls_pair(tls_clusters):
    with dbpeers.pg_servers(tls_clusters) as servers:
        yield servers


def pg_sni_sluice(sluice, a, b, **kw):
    routes = [{"sni": "a.db.test", "upstream": "a"}, {"sni": "b.db.test", "upstream": "b"}]
    lst = listener("pg", None, preread="postgres", routes=routes, default_upstream="a", **kw)
    return sluice([lst], {"a": upstream(a), "b": upstream(b)}, global_={"workers": 2})


def psql_via(port: int, host: str, sql: str, sslmode: str) -> subprocess.CompletedProcess:
    """psql to sluice at 127.0.0.1:port, naming `host` (the SNI) but connecting
    to hostaddr 127.0.0.1, as a client behind DNS would."""
    env = dbpeers.clean_env(PGGSSENCMODE="disable", PGCONNECT_TIMEOUT="10")
    conninfo = (f"host={host} hostaddr=127.0.0.1 port={port} user={dbpeers.PG_USER} "
                f"dbname=postgres sslmode={sslmode} sslsni=1")
    return subprocess.run([str(dbpeers.PG_BIN / "psql"), "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                           "-d", conninfo, "-c", sql],
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)


WHO = ("select current_setting('port') || ' ' || coalesce((select ssl::text from pg_stat_ssl "
       "where pid = pg_backend_pid()), 'none')")


def test_sni_picks_the_server_and_tls_ends_there(sluice, tls_pair):
    a, b = tls_pair
    s = pg_sni_sluice(sluice, a, b)
    port = s.port("pg")
    for host, srv in (("a.db.test", a), ("b.db.test", b), ("B.DB.test", b), ("a.db.test", a)):
        r = psql_via(port, host, WHO, "require")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [str(srv.port), "true"], (host, r.stdout)
    recs = s.wait_records(4)
    assert sorted(rec["sni"] for rec in recs) == ["a.db.test", "a.db.test", "b.db.test", "b.db.test"]
    # The query ran (checked above); how the TCP connection ends after TLS's
    # close_notify (FIN or reset, from either side) is up to the peers.
    assert all(rec["tries"] == "1" and int(rec["bytes_out"]) > 1000 for rec in recs), recs


def test_plain_client_goes_to_the_default_upstream(sluice, tls_pair):
    a, b = tls_pair
    s = pg_sni_sluice(sluice, a, b)
    r = psql_via(s.port("pg"), "b.db.test", WHO, "disable")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(a.port), "false"]  # no TLS, so no SNI: the default


def test_plain_client_is_closed_with_on_not_tls_close(sluice, tls_pair):
    a, b = tls_pair
    s = pg_sni_sluice(sluice, a, b, on_not_tls="close")
    r = psql_via(s.port("pg"), "a.db.test", "select 1", "disable")
    assert r.returncode != 0
    assert s.wait_records(1)[0]["cause"] == "rejected_not_tls"
    r = psql_via(s.port("pg"), "a.db.test", "select 1", "require")
    assert r.returncode == 0, r.stderr


class NoTlsServer:
    """Answers every SSLRequest with 'N' (a PostgreSQL with ssl = off does)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    self.requests.append(harness.recv_exact(conn, 8))
                    conn.sendall(b"N")
                    conn.recv(1)
                except OSError:
                    pass

    def close(self):
        self.sock.close()
        self.thread.join(5)


def test_server_that_refuses_tls_closes_the_client_with_a_cause(sluice, tls_pair):
    a, _ = tls_pair
    n = NoTlsServer()
    try:
        s = pg_sni_sluice(sluice, a, n.address)
        r = psql_via(s.port("pg"), "b.db.test", "select 1", "require")
        assert r.returncode != 0
        rec = s.wait_records(1)[0]
        assert rec["cause"] == "server_no_tls", rec
        assert n.requests == [bytes.fromhex("0000000804d2162f")]  # sluice's own SSLRequest
    finally:
        n.close()


def test_direct_tls_is_routed_on_sni_and_replayed_unchanged(sluice, tls_pair):
    """PostgreSQL 17's direct TLS: the ClientHello comes first, with ALPN
    "postgresql". It is routed like any TLS hello and forwarded byte for byte
    (no SSLRequest): here to a plain TCP server that records what arrives."""
    a, _ = tls_pair
    got: list[bytes] = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(5)
            got.append(conn.recv(5))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        s = pg_sni_sluice(sluice, a, "127.0.0.1:%d" % srv.getsockname()[1])
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["postgresql"])
        raw = harness.connect("127.0.0.1", s.port("pg"))
        with pytest.raises((ssl.SSLError, OSError)):
            ctx.wrap_socket(raw, server_hostname="b.db.test").close()
        t.join(10)
        assert got and got[0][:1] == b"\x16", got  # a TLS record, not an SSLRequest
        rec = s.wait_records(1)[0]
        assert rec["sni"] == "b.db.test" and rec["alpn"] == "postgresql", rec
    finally:
        srv.close()
