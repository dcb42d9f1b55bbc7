"""PROXY protocol: sluice sends v1/v2 to real receivers (nginx `listen ...
proxy_protocol`, HAProxy `accept-proxy`) and accepts it from trusted peers."""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest

import harness
from harness import listener, upstream
from test_tls import client_hello

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
STREAM_MODULE = "/usr/lib/nginx/modules/ngx_stream_module.so"
V2_SIG = b"\r\n\r\n\x00\r\nQUIT\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, what: str):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited: {proc.stdout.read().decode(errors='replace')}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"{what} did not listen on {port}")


@contextlib.contextmanager
def serving(argv: list[str], port: int, what: str):
    """Starts `argv`, waits until it listens on `port` and yields its address;
    stops it on the way out."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_listening(port, proc, what)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def nginx_receiver(tmp_path):
    """nginx stream server that answers with the address the PROXY header carried."""
    if not Path(NGINX).exists() or not Path(STREAM_MODULE).exists():
        pytest.skip("nginx with the stream module is not installed")
    port = free_port()
    conf = tmp_path / "nginx.conf"
    conf.write_text(f"""
load_module {STREAM_MODULE};
daemon off;
master_process off;
worker_processes 1;
pid {tmp_path}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 64; }}
stream {{
  server {{
    listen 127.0.0.1:{port} proxy_protocol;
    return "$proxy_protocol_addr $proxy_protocol_port\\n";
  }}
}}
""")
    with serving([NGINX, "-c", str(conf), "-p", str(tmp_path)], port, "nginx") as addr:
        yield addr


@pytest.fixture
def haproxy_receiver(tmp_path):
    """HAProxy frontend with accept-proxy answering HTTP with the client it saw."""
    if not Path(HAPROXY).exists():
        pytest.skip("haproxy is not installed")
    port = free_port()
    conf = tmp_path / "haproxy.cfg"
    conf.write_text(f"""
global
  log stderr format raw local0 warning
defaults
  mode http
  timeout connect 5s
  timeout client 10s
  timeout server 10s
frontend fe
  bind 127.0.0.1:{port} accept-proxy
  http-request return status 200 content-type text/plain lf-string "%[src] %[src_port]\\n"
""")
    with serving([HAPROXY, "-db", "-f", str(conf)], port, "haproxy") as addr:
        yield addr


def header_echo_handler(backend, conn):
    """Reads a PROXY header (v1 line or v2 block) and echoes it back."""
    conn.settimeout(5)
    buf = b""
    while True:
        chunk = conn.recv(4096)
        if not chunk:
            break
        buf += chunk
        if buf.startswith(b"PROXY") and b"\r\n" in buf:
            buf = buf[:buf.index(b"\r\n") + 2]
            break
        if buf.startswith(V2_SIG) and len(buf) >= 16 and len(buf) >= 16 + struct.unpack("!H", buf[14:16])[0]:
            buf = buf[:16 + struct.unpack("!H", buf[14:16])[0]]
            break
    conn.sendall(buf)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_nginx_sees_the_real_client(sluice, nginx_receiver, version):
    s = sluice([listener()], {"up": upstream(nginx_receiver, proxy_protocol=version)})
    c = harness.connect(*s.addr())
    try:
        line = harness.recv_line(c).decode()
        addr, port = line.split()
        assert (addr, int(port)) == c.getsockname()[:2], line
    finally:
        c.close()


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_haproxy_sees_the_real_client(sluice, haproxy_receiver, version):
    s = sluice([listener()], {"up": upstream(haproxy_receiver, proxy_protocol=version)})
    c = harness.connect(*s.addr())
    try:
        c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = harness.recv_all(c).decode()
        assert reply.startswith("HTTP/1.1 200"), reply
        addr, port = reply.split("\r\n\r\n", 1)[1].split()
        assert (addr, int(port)) == c.getsockname()[:2], reply
    finally:
        c.close()


def test_v1_header_is_exact(sluice, backends):
    be = backends(header_echo_handler)
    s = sluice([listener()], {"up": upstream(be, proxy_protocol="v1")})
    c = harness.connect(*s.addr())
    try:
        got = harness.recv_line(c).decode()
        ch, cp = c.getsockname()[:2]
        sh, sp = s.addr()
        assert got == f"PROXY TCP4 {ch} {sh} {cp} {sp}\r"
    finally:
        c.close()


def test_v2_carries_sni_and_alpn_after_tls_preread(sluice, backends):
    be = backends(header_echo_handler)
    s = sluice([listener("tls", None, preread="tls", routes=[{"sni": "db.example", "upstream": "up"}])],
               {"up": upstream(be, proxy_protocol="v2")})
    c = harness.connect(*s.addr("tls"))
    try:
        c.sendall(client_hello("db.example", alpn=["postgresql", "h2"]))
        head = harness.recv_exact(c, 16)
        assert head[:12] == V2_SIG and head[12] == 0x21 and head[13] == 0x11
        body = harness.recv_exact(c, struct.unpack("!H", head[14:16])[0])
        tlvs = {}
        pos = 12
        while pos < len(body):
            t, n = body[pos], struct.unpack("!H", body[pos + 1:pos + 3])[0]
            tlvs[t] = body[pos + 3:pos + 3 + n]
            pos += 3 + n
        assert tlvs.get(0x02) == b"db.example"
        assert tlvs.get(0x01) == b"postgresql"
        assert socket.inet_ntoa(body[0:4]) == c.getsockname()[0]
        assert struct.unpack("!H", body[8:10])[0] == c.getsockname()[1]
    finally:
        c.close()


def proxied_client(s, header: bytes, payload: bytes = b"") -> socket.socket:
    c = harness.connect(*s.addr())
    c.sendall(header + payload)
    return c


def test_accept_proxy_from_a_trusted_peer(sluice, backends):
    be = backends(harness.echo_handler)
    s = sluice([listener(accept_proxy=True, trusted_proxies=["127.0.0.0/8"])], {"up": upstream(be)})
    for header in (b"PROXY TCP4 203.0.113.7 192.0.2.1 40000 5432\r\n",
                   V2_SIG + b"\x21\x11\x00\x0c" + socket.inet_aton("203.0.113.7") + socket.inet_aton("192.0.2.1")
                   + struct.pack("!HH", 40000, 5432)):
        c = proxied_client(s, header, b"hello")
        try:
            assert harness.recv_exact(c, 5) == b"hello"  # the header is not forwarded
        finally:
            c.close()
    recs = s.wait_records(2)
    assert [r["client"] for r in recs] == ["203.0.113.7:40000"] * 2


def test_v2_without_a_usable_address_keeps_the_connections_own(sluice, backends):
    """A proxy on a UNIX socket (HAProxy `bind unix@...` with `send-proxy-v2`)
    sends AF_UNIX paths; UNSPEC and UDP carry no TCP client either. The
    specification has the receiver fall back to the connection's own
    addresses: the session is served and logged with the real peer."""
    be = backends(harness.echo_handler)
    s = sluice([listener(accept_proxy=True, trusted_proxies=["127.0.0.0/8"])], {"up": upstream(be)})
    paths = b"/run/client.sock".ljust(108, b"\0") + b"/run/haproxy/pg.sock".ljust(108, b"\0")
    headers = {
        "unix_stream": V2_SIG + b"\x21\x31" + struct.pack("!H", len(paths)) + paths,
        "unix_dgram": V2_SIG + b"\x21\x32" + struct.pack("!H", len(paths)) + paths,
        "unspec": V2_SIG + b"\x21\x00\x00\x00",
        "udp4": V2_SIG + b"\x21\x12\x00\x0c" + socket.inet_aton("203.0.113.7") * 2 + struct.pack("!HH", 1, 2),
    }
    peers = []
    for name, header in headers.items():
        c = proxied_client(s, header, name.encode())
        try:
            assert harness.recv_exact(c, len(name)) == name.encode(), name
            peers.append("%s:%d" % c.getsockname())
        finally:
            c.close()
    recs = s.wait_records(len(headers))
    assert all(r["cause"] != "rejected_proxy" for r in recs), recs
    assert sorted(r["client"] for r in recs) == sorted(peers)
    assert be.counts()[0] == len(headers)


def test_accept_proxy_then_proxy_protocol_to_the_server(sluice, backends):
    be = backends(header_echo_handler)
    s = sluice([listener(accept_proxy=True, trusted_proxies=["127.0.0.1"])], {"up": upstream(be, proxy_protocol="v1")})
    c = proxied_client(s, b"PROXY TCP4 198.51.100.2 192.0.2.1 1234 443\r\n")
    try:
        assert harness.recv_line(c) == b"PROXY TCP4 198.51.100.2 192.0.2.1 1234 443\r"
    finally:
        c.close()


def test_accept_proxy_chains_with_tls_preread(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    other = backends(harness.banner_handler, name="B")
    s = sluice([listener("main", None, accept_proxy=True, trusted_proxies=["127.0.0.0/8"], preread="tls",
                         routes=[{"sni": "a.example", "upstream": "a"}], default_upstream="b")],
               {"a": upstream(be), "b": upstream(other)})
    c = proxied_client(s, b"PROXY TCP4 203.0.113.9 192.0.2.1 1 2\r\n", client_hello("a.example"))
    try:
        assert harness.recv_line(c) == b"A"
    finally:
        c.close()
    (rec,) = s.wait_records(1)
    assert rec["client"] == "203.0.113.9:1" and rec["sni"] == "a.example"


@pytest.mark.parametrize("bad", [
    b"GET / HTTP/1.1\r\n\r\n",
    b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
    b"PROXY TCP4 999.2.3.4 5.6.7.8 1 2\r\n",
    b"PROXY TCP4 " + b"1" * 200,
    V2_SIG + b"\x21\x11\xff\xff",
    V2_SIG + b"\x21\x11\x00\x04\x01\x02\x03\x04",
])
def test_malformed_headers_are_rejected(sluice, backends, bad):
    be = backends(harness.echo_handler)
    s = sluice([listener(accept_proxy=True, trusted_proxies=["127.0.0.0/8"])], {"up": upstream(be)})
    c = proxied_client(s, bad)
    try:
        assert harness.wait_closed(c) in ("eof", "reset")
    finally:
        c.close()
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "rejected_proxy"
    assert be.counts()[0] == 0


def test_truncated_header_times_out(sluice, backends):
    be = backends(harness.echo_handler)
    s = sluice([listener(accept_proxy=True, trusted_proxies=["127.0.0.0/8"], preread_timeout="300ms")],
               {"up": upstream(be)})
    c = proxied_client(s, b"PROXY TCP4 1.2.3.4 ")
    try:
        assert harness.wait_closed(c) in ("eof", "reset")
    finally:
        c.close()
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "preread_timeout"


def test_untrusted_peer_is_closed(sluice, backends):
    be = backends(harness.echo_handler)
    s = sluice([listener(accept_proxy=True, trusted_proxies=["10.0.0.0/8"])], {"up": upstream(be)})
    c = proxied_client(s, b"PROXY TCP4 203.0.113.7 192.0.2.1 40000 5432\r\n", b"x")
    try:
        assert harness.wait_closed(c) in ("eof", "reset")
    finally:
        c.close()
    s.log.wait_for(r"refused \(rejected_proxy\)")
    assert be.counts()[0] == 0


def test_acl_applies_to_the_carried_address(sluice, backends):
    be = backends(harness.echo_handler)
    s = sluice([listener(accept_proxy=True, trusted_proxies=["127.0.0.0/8"], deny=["203.0.113.0/24"])],
               {"up": upstream(be)})
    c = proxied_client(s, b"PROXY TCP4 203.0.113.7 192.0.2.1 40000 5432\r\n", b"x")
    try:
        assert harness.wait_closed(c) in ("eof", "reset")
    finally:
        c.close()
    s.log.wait_for(r"connection from 203\.0\.113\.7:40000 refused \(acl_denied\)")
    c = proxied_client(s, b"PROXY TCP4 198.51.100.7 192.0.2.1 40000 5432\r\n", b"ok")
    try:
        assert harness.recv_exact(c, 2) == b"ok"
    finally:
        c.close()


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_health_checks_send_the_header_too(sluice, nginx_receiver, version, tmp_path):
    """A server that wants the PROXY header on every connection (nginx
    `listen ... proxy_protocol` closes on a broken header) passes sluice's
    send_expect check only because the check sends the header first."""
    health = {"type": "send_expect", "send": "", "expect": "127.0.0.1 ", "interval": "200ms",
              "timeout": "1s", "rise": 1, "fall": 1, "initial": "down"}
    s = sluice([listener()], {"up": upstream(nginx_receiver, proxy_protocol=version, health=health)})
    s.log.wait_for(rf"server {re.escape(nginx_receiver)} is up \(active check\)", timeout=5)
    assert harness.banner_of(s).startswith(b"127.0.0.1 ")


def test_health_check_without_the_header_fails_against_such_a_server(sluice, nginx_receiver):
    health = {"type": "send_expect", "send": "", "expect": "127.0.0.1 ", "interval": "200ms",
              "timeout": "1s", "rise": 1, "fall": 1, "initial": "down"}
    s = sluice([listener()], {"up": upstream(nginx_receiver, health=health)})
    time.sleep(1.5)  # seven checks, each refused by nginx's "broken header"
    assert not s.log.matches(r"is up \(active check\)")
    c = harness.connect(*s.addr())
    harness.wait_closed(c)
    c.close()
    assert s.wait_records(1)[0]["cause"] == "no_server"
