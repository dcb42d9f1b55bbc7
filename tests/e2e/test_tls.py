"""TLS through sluice with real peers: openssl s_server behind, s_client and
Python's ssl in front. sluice only reads the ClientHello; the handshakes below
complete end to end, so the replayed bytes must be exactly what was sent."""

from __future__ import annotations

import collections
import os
import selectors
import socket
import ssl
import struct
import subprocess
import threading
import time

import pytest

import harness
from tlspeers import OPENSSL, subject_cn
from harness import listener, upstream


# --------------------------------------------------------------------------
# clients
# --------------------------------------------------------------------------

def s_client(port: int, servername: str | None, alpn: str | None = None,
             line: bytes = b"hello sluice") -> tuple[str, bytes]:
    """Runs openssl s_client through sluice, sends one line, waits for the
    reversed line, then closes stdin. Returns (full output, reversed line)."""
    cmd = [OPENSSL, "s_client", "-connect", f"127.0.0.1:{port}"]
    cmd += ["-servername", servername] if servername else ["-noservername"]
    if alpn:
        cmd += ["-alpn", alpn]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    out = harness.LineLog(proc.stdout)
    try:
        proc.stdin.write(line + b"\n")
        proc.stdin.flush()
        want = line[::-1].decode()
        out.wait_for(rf"^{want}$")
        proc.stdin.close()
        proc.wait(timeout=harness.EVENT_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        out.join()
    return out.text(), want.encode()


def client_ctx(alpn: list[str] | None = None, max_version=None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    # We identify backends by their exact certificate instead of verifying.
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(alpn)
    if max_version:
        ctx.maximum_version = max_version
    return ctx


class TlsResult:
    def __init__(self, der: bytes, alpn: str | None, reply: bytes, version: str):
        self.der, self.alpn, self.reply, self.version = der, alpn, reply, version


def py_tls(port: int, sni: str | None, alpn: list[str] | None = None,
           line: bytes = b"ping", max_version=None) -> TlsResult:
    """A full TLS session with Python's ssl through sluice."""
    ctx = client_ctx(alpn, max_version)
    raw = harness.connect("127.0.0.1", port)
    with ctx.wrap_socket(raw, server_hostname=sni) as tls:
        tls.sendall(line + b"\n")
        reply = bytearray()
        while not reply.endswith(b"\n"):
            chunk = tls.recv(4096)
            assert chunk, f"EOF after {bytes(reply)!r}"
            reply += chunk
        return TlsResult(tls.getpeercert(binary_form=True), tls.selected_alpn_protocol(),
                         bytes(reply[:-1]), tls.version())


def client_hello(sni: str | None, alpn: list[str] | None = None) -> bytes:
    """The first flight (one TLS record with a ClientHello) a real client sends."""
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = client_ctx(alpn).wrap_bio(inc, out, server_hostname=sni)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


def split_into_records(flight: bytes, at: list[int]) -> bytes:
    """Re-frames one handshake record as several records, cut at `at`."""
    ctype, version, length = flight[0], flight[1:3], struct.unpack("!H", flight[3:5])[0]
    assert ctype == 0x16 and len(flight) == 5 + length
    body = flight[5:]
    cuts = [0] + at + [len(body)]
    return b"".join(bytes([ctype]) + version + struct.pack("!H", b - a) + body[a:b]
                    for a, b in zip(cuts, cuts[1:]))


def tls_over_pieces(port: int, sni: str, pieces: list[int], records_at: list[int] | None = None,
                    line: bytes = b"split") -> tuple[bytes, bytes]:
    """Handshake where the ClientHello goes out in TCP writes of the given
    sizes (and optionally in several TLS records). Returns (server cert, reply)."""
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = client_ctx().wrap_bio(inc, out, server_hostname=sni)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    flight = out.read()
    if records_at:
        flight = split_into_records(flight, records_at)
    sock = harness.connect("127.0.0.1", port)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        pos = 0
        for size in pieces:
            sock.sendall(flight[pos:pos + size])
            pos += size
            time.sleep(0.02)  # separate segments; the test is about reassembly
        sock.sendall(flight[pos:])

        deadline = time.monotonic() + harness.EVENT_TIMEOUT
        done = False
        while not done:
            assert time.monotonic() < deadline, "handshake did not finish"
            data = sock.recv(65536)
            assert data, "closed during handshake"
            inc.write(data)
            try:
                obj.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                pass
            pending = out.read()
            if pending:
                sock.sendall(pending)
        obj.write(line + b"\n")
        sock.sendall(out.read())
        reply = b""
        while not reply.endswith(b"\n"):
            assert time.monotonic() < deadline, "no reply"
            try:
                reply += obj.read(4096)
            except ssl.SSLWantReadError:
                data = sock.recv(65536)
                assert data, "closed before the reply"
                inc.write(data)
        return obj.getpeercert(binary_form=True), reply[:-1]
    finally:
        sock.close()


def routed_cn(port: int, sni: str | None, servers) -> str:
    der = py_tls(port, sni).der
    names = [s.cn for s in servers if s.cert.der == der]
    assert len(names) == 1, "certificate matches none of the backends"
    return names[0]


# --------------------------------------------------------------------------
# set-ups
# --------------------------------------------------------------------------

def tls_listener(name="tls", **kw) -> dict:
    d = listener(name, upstream=None, preread="tls")
    d.update(kw)
    return d


@pytest.fixture
def three_routes(sluice, tls_servers):
    """a.test -> a, *.b.test -> b, anything else -> c (the default)."""
    a, b, c = tls_servers("a.test"), tls_servers("b.test"), tls_servers("default.test")
    s = sluice([tls_listener(routes=[{"sni": "a.test", "upstream": "a"},
                                     {"sni": "*.b.test", "upstream": "b"}],
                             default_upstream="c")],
               {"a": upstream(a.address), "b": upstream(b.address), "c": upstream(c.address)})
    return s, a, b, c


# --------------------------------------------------------------------------
# routing
# --------------------------------------------------------------------------

def test_s_client_sees_the_routed_backends_certificate(three_routes):
    s, a, b, c = three_routes
    cases = [("a.test", a), ("x.b.test", b), ("deep.y.b.test", b), ("other.org", c)]
    for i, (sni, want) in enumerate(cases):
        out, reversed_line = s_client(s.port(), sni)
        assert subject_cn(out) == want.cn, f"{sni}: {out[-2000:]}"
        assert reversed_line.decode() in out
        recs = s.wait_records(i + 1)  # one at a time keeps the log in order
    assert [r["sni"] for r in recs] == ["a.test", "x.b.test", "deep.y.b.test", "other.org"]
    assert [r["server"] for r in recs] == [a.address, b.address, b.address, c.address]
    # s_client sends close_notify and the server answers in kind: either FIN may be first.
    assert all(r["cause"] in ("client_closed", "server_closed") for r in recs), recs
    assert all(int(r["bytes_in"]) > 200 and int(r["bytes_out"]) > 700 for r in recs), recs
    assert (a.wait_handshakes(1), b.wait_handshakes(2), c.wait_handshakes(1)) == (1, 2, 1)


def test_no_sni_goes_to_default_upstream(three_routes):
    s, a, b, c = three_routes
    out, _ = s_client(s.port(), None)
    assert subject_cn(out) == c.cn
    assert routed_cn(s.port(), None, [a, b, c]) == c.cn
    recs = s.wait_records(2)
    assert [r["sni"] for r in recs] == ["-", "-"]
    assert all(r["server"] == c.address for r in recs)


def test_alpn_is_negotiated_end_to_end_and_logged(three_routes):
    s, a, b, c = three_routes
    out, _ = s_client(s.port(), "a.test", alpn="h2")
    assert subject_cn(out) == a.cn
    assert "ALPN protocol: h2" in out
    s.wait_records(1)

    r = py_tls(s.port(), "a.test", alpn=["http/1.1", "h2"])
    assert r.der == a.cert.der
    assert r.alpn in ("h2", "http/1.1")
    assert r.reply == b"gnip"

    recs = s.wait_records(2)
    assert recs[0]["alpn"] == "h2"
    assert recs[1]["alpn"] == "http/1.1,h2"


def test_python_client_data_both_ways_tls12_and_tls13(three_routes):
    s, a, b, c = three_routes
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        line = os.urandom(3000).hex().encode()
        r = py_tls(s.port(), "z.b.test", line=line, max_version=version)
        assert r.der == b.cert.der
        assert r.reply == line[::-1]
        assert r.version == ("TLSv1.2" if version == ssl.TLSVersion.TLSv1_2 else "TLSv1.3")


def test_names_match_case_insensitively(three_routes):
    s, a, b, c = three_routes
    out, _ = s_client(s.port(), "A.Test")
    assert subject_cn(out) == a.cn
    out, _ = s_client(s.port(), "X.B.TEST")
    assert subject_cn(out) == b.cn


def test_trailing_dot_is_ignored(three_routes):
    s, a, b, c = three_routes
    out, _ = s_client(s.port(), "a.test.")
    assert subject_cn(out) == a.cn


def test_most_specific_route_wins(sluice, tls_servers):
    wild, exact, dflt = tls_servers("wild.test"), tls_servers("exact.test"), tls_servers("dflt.test")
    s = sluice([tls_listener(routes=[{"sni": "*.b.test", "upstream": "wild"},
                                     {"sni": "exact.b.test", "upstream": "exact"},
                                     {"sni": "*.test", "upstream": "dflt"}],
                             default_upstream="wild")],
               {"wild": upstream(wild.address), "exact": upstream(exact.address),
                "dflt": upstream(dflt.address)})
    servers = [wild, exact, dflt]
    assert routed_cn(s.port(), "exact.b.test", servers) == exact.cn
    assert routed_cn(s.port(), "other.b.test", servers) == wild.cn
    assert routed_cn(s.port(), "c.test", servers) == dflt.cn
    assert routed_cn(s.port(), "x.y.test", servers) == dflt.cn


def test_hello_split_across_segments_and_records(three_routes):
    s, a, b, c = three_routes
    # Byte by byte for the record header, then small writes.
    der, reply = tls_over_pieces(s.port(), "a.test", pieces=[1, 1, 1, 1, 1, 7, 50, 100])
    assert der == a.cert.der and reply == b"tilps"
    s.wait_records(1)
    # The same hello as three TLS records, in odd-sized writes.
    der, reply = tls_over_pieces(s.port(), "q.b.test", pieces=[3, 90, 200],
                                 records_at=[40, 200])
    assert der == b.cert.der and reply == b"tilps"
    recs = s.wait_records(2)
    assert [r["sni"] for r in recs] == ["a.test", "q.b.test"]


# --------------------------------------------------------------------------
# not TLS, malformed, slow
# --------------------------------------------------------------------------

def test_plain_text_is_routed_to_default_when_allowed(sluice, backends, tls_servers):
    a = tls_servers("a.test")
    plain = backends(harness.echo_handler)
    s = sluice([tls_listener(routes=[{"sni": "a.test", "upstream": "a"}],
                             default_upstream="plain", on_not_tls="default")],
               {"a": upstream(a.address), "plain": upstream(plain)})
    request = b"GET / HTTP/1.0\r\nHost: a.test\r\n\r\n"
    assert harness.exchange("127.0.0.1", s.port(), request) == request
    (rec,) = s.wait_records(1)
    assert rec["server"] == plain.address
    assert rec["sni"] == "-"
    assert int(rec["bytes_in"]) == len(request)
    # TLS still goes where the route says.
    assert py_tls(s.port(), "a.test").der == a.cert.der


def test_plain_text_is_closed_when_not_allowed(sluice, backends, tls_servers):
    a = tls_servers("a.test")
    plain = backends(harness.echo_handler)
    s = sluice([tls_listener(routes=[{"sni": "a.test", "upstream": "a"}],
                             default_upstream="plain", on_not_tls="close")],
               {"a": upstream(a.address), "plain": upstream(plain)})
    c = s.connect()
    try:
        c.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
        assert harness.wait_closed(c) in ("eof", "reset")
    finally:
        c.close()
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "rejected_not_tls"
    assert rec["server"] == "-"
    assert plain.counts()[0] == 0
    assert py_tls(s.port(), "a.test").der == a.cert.der


def test_malformed_hello_is_closed(sluice, tls_servers):
    a = tls_servers("a.test")
    s = sluice([tls_listener(default_upstream="a")], {"a": upstream(a.address)})
    # A real ClientHello whose extensions block claims 10 bytes more than the
    # message holds; the record and handshake lengths stay consistent.
    hello = bytearray(client_hello("a.test"))
    pos = 5 + 4 + 2 + 32                  # record hdr, handshake hdr, version, random
    pos += 1 + hello[pos]                 # session id
    pos += 2 + int.from_bytes(hello[pos:pos + 2], "big")  # cipher suites
    pos += 1 + hello[pos]                 # compression methods
    ext_len = int.from_bytes(hello[pos:pos + 2], "big")
    assert pos + 2 + ext_len == len(hello), "walked the hello wrongly"
    hello[pos:pos + 2] = (ext_len + 10).to_bytes(2, "big")
    bad = bytes(hello)
    c = s.connect()
    try:
        c.sendall(bad)
        assert harness.wait_closed(c) in ("eof", "reset")
    finally:
        c.close()
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "preread_malformed"
    assert a.handshakes() == 0


def test_oversized_hello_is_rejected(sluice, tls_servers):
    a = tls_servers("a.test")
    s = sluice([tls_listener(default_upstream="a", preread_max_bytes=4096)],
               {"a": upstream(a.address)})
    # A well-formed ClientHello of ~30 KB (one big padding extension), sent
    # as TLS records of at most 16 KiB.
    pad = 30000
    exts = struct.pack("!HH", 0x0015, pad) + b"\x00" * pad
    body = (b"\x03\x03" + os.urandom(32) + b"\x00" + struct.pack("!H", 2) + b"\x13\x01"
            + b"\x01\x00" + struct.pack("!H", len(exts)) + exts)
    msg = b"\x01" + len(body).to_bytes(3, "big") + body
    records = b"".join(b"\x16\x03\x01" + struct.pack("!H", len(msg[i:i + 16384])) + msg[i:i + 16384]
                       for i in range(0, len(msg), 16384))
    c = s.connect()
    try:
        try:
            c.sendall(records)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while we were still sending: fine
        assert harness.wait_closed(c) in ("eof", "reset")
    finally:
        c.close()
    (rec,) = s.wait_records(1)
    assert rec["cause"] == "preread_malformed"
    assert int(rec["bytes_in"]) <= 4096 + 16384 + 5
    assert a.handshakes() == 0


def trickle(sock: socket.socket, data: bytes, every_s: float, stop: threading.Event) -> threading.Thread:
    """Sends `data` one byte every `every_s` from a thread, until it is all
    sent, the socket fails or `stop` is set."""
    def run():
        try:
            for i in range(len(data)):
                sock.send(data[i:i + 1])
                if stop.wait(every_s):
                    return
        except OSError:
            pass
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


PREREAD_TIMEOUT_S = 1.0


@pytest.mark.parametrize("sent", ["silent", "partial", "trickle"])
def test_slow_client_is_closed_at_preread_timeout(sluice, tls_servers, sent):
    """A client that sends nothing, part of a record header, or a real
    ClientHello one byte every 200 ms (slowloris: each byte comes well
    within the timeout, but preread_timeout is a deadline from accept, not
    reset by each byte) is closed at preread_timeout, while a normal client
    is served meanwhile."""
    a = tls_servers("a.test")
    s = sluice([tls_listener(default_upstream="a", preread_timeout=f"{PREREAD_TIMEOUT_S:.0f}s")],
               {"a": upstream(a.address)})
    stop = threading.Event()
    trickler = None
    with s.connect() as c:
        t0 = time.monotonic()
        if sent == "partial":
            c.sendall(b"\x16\x03\x01\x02")
        elif sent == "trickle":
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            trickler = trickle(c, client_hello("a.test"), 0.2, stop)
        # A normal client, while the slow one holds its connection open.
        assert py_tls(s.port(), "a.test").der == a.cert.der
        assert time.monotonic() - t0 < PREREAD_TIMEOUT_S - 0.1, "too slow for the check below to mean anything"
        try:
            harness.wait_closed(c, timeout=10)
        finally:
            stop.set()
        elapsed = time.monotonic() - t0
    if trickler:
        trickler.join(5)
    assert PREREAD_TIMEOUT_S - 0.1 <= elapsed < PREREAD_TIMEOUT_S + 1.0, \
        f"closed after {elapsed:.2f}s with preread_timeout={PREREAD_TIMEOUT_S:.0f}s"
    recs = s.wait_records(2)
    (rec,) = [r for r in recs if r["server"] == "-"]  # the normal client's went to a
    assert rec["cause"] == "preread_timeout", recs
    assert a.handshakes() == 1  # the normal client's only


def test_thousand_silent_clients_do_not_block_a_real_one(sluice, tls_servers):
    n = 1000
    have = harness.raise_nofile(n + 1024)
    if have < n + 200:
        pytest.skip(f"open-file limit {have} too low for {n} clients")
    a = tls_servers("a.test")
    s = sluice([tls_listener(default_upstream="a", preread_timeout="5s")],
               {"a": upstream(a.address)}, nofile=n + 1024)
    silent = []
    sel = selectors.DefaultSelector()
    try:
        t0 = time.monotonic()
        for _ in range(n):
            c = harness.connect("127.0.0.1", s.port(), timeout=10)
            c.setblocking(False)
            silent.append(c)
            sel.register(c, selectors.EVENT_READ)

        # A real client is served at once, while all the silent ones wait.
        t1 = time.monotonic()
        out, _ = s_client(s.port(), "a.test")
        assert subject_cn(out) == a.cn
        assert py_tls(s.port(), "a.test").der == a.cert.der
        served_in = time.monotonic() - t1
        assert served_in < 2.5, f"real clients took {served_in:.2f}s"
        assert time.monotonic() - t0 < 4.5, "too slow for the next check to mean anything"
        assert not sel.select(timeout=0), "silent clients closed before preread_timeout"

        # Then every silent client is closed at the deadline.
        closed = 0
        deadline = time.monotonic() + 15
        while closed < n and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.5):
                try:
                    key.fileobj.recv(1)
                except OSError:
                    pass
                sel.unregister(key.fileobj)
                closed += 1
        assert closed == n, f"only {closed} of {n} silent clients were closed"
    finally:
        sel.close()
        for c in silent:
            c.close()
    recs = s.wait_records(n + 2)
    causes = collections.Counter(r["cause"] for r in recs)
    assert causes["preread_timeout"] == n, causes


# --------------------------------------------------------------------------
# hashing
# --------------------------------------------------------------------------

def test_same_sni_sticks_to_one_backend_across_restarts(sluice, tls_servers):
    servers = [tls_servers(f"h{i}.test") for i in range(3)]
    config = ([tls_listener(default_upstream="h")],
              {"h": upstream(*[x.address for x in servers], balance="hash", hash_key="sni")})
    # The servers' ports (so their hash seeds) change from run to run. With 8
    # names, all of them landing on one of 3 servers happens by chance once in
    # about 2 200 runs; with 24 names, once in about 10^11.
    names = [f"name{i}.hash.test" for i in range(24)]

    s = sluice(*config)
    first = {}
    for name in names:
        seen = {routed_cn(s.port(), name, servers) for _ in range(4)}
        assert len(seen) == 1, f"{name} went to {seen}"
        first[name] = seen.pop()
    assert len(set(first.values())) >= 2, f"24 names all on one of 3 servers: {first}"
    assert s.stop() == 0

    again = sluice(*config)
    for name in names:
        seen = {routed_cn(again.port(), name, servers) for _ in range(3)}
        assert seen == {first[name]}, f"{name}: {first[name]} before restart, {seen} after"


def test_hash_retry_moves_only_the_dead_servers_keys(sluice, tls_servers):
    servers = [tls_servers(f"r{i}.test") for i in range(3)]
    up = upstream(*[x.address for x in servers], balance="hash", hash_key="sni",
                  max_fails=1, fail_timeout="30s")
    s = sluice([tls_listener(default_upstream="h")], {"h": up})
    names = [f"k{i}.test" for i in range(12)]
    before = {n: routed_cn(s.port(), n, servers) for n in names}
    victim = collections.Counter(before.values()).most_common(1)[0][0]
    next(x for x in servers if x.cn == victim).stop()

    after = {n: routed_cn(s.port(), n, servers) for n in names}
    for n in names:
        if before[n] == victim:
            assert after[n] != victim
        else:
            assert after[n] == before[n], f"{n} moved from {before[n]} to {after[n]}"


# --------------------------------------------------------------------------
# replay: what sluice read is what the server gets
# --------------------------------------------------------------------------

def test_preread_bytes_reach_the_server_unchanged(sluice, backends):
    echo = backends(harness.echo_handler)
    s = sluice([tls_listener(routes=[{"sni": "echo.test", "upstream": "echo"}])],
               {"echo": upstream(echo)})
    hello = client_hello("echo.test", alpn=["h2"])
    trailer = os.urandom(5000)  # more bytes right behind the hello, same write
    for pieces in ([len(hello) + len(trailer)], [1, 4, 30, len(hello) - 35, 17]):
        c = s.connect()
        try:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            data, pos = hello + trailer, 0
            for size in pieces:
                c.sendall(data[pos:pos + size])
                pos += size
                time.sleep(0.02)  # separate segments
            c.sendall(data[pos:])
            c.shutdown(socket.SHUT_WR)
            assert harness.recv_all(c) == hello + trailer
        finally:
            c.close()
    recs = s.wait_records(2)
    for r in recs:
        assert r["sni"] == "echo.test" and r["alpn"] == "h2"
        assert int(r["bytes_in"]) == len(hello) + len(trailer)
        assert int(r["bytes_out"]) == len(hello) + len(trailer)


def test_malformed_hello_can_go_to_default(sluice, backends):
    echo = backends(harness.echo_handler)
    routed = backends(harness.echo_handler)
    s = sluice([tls_listener(routes=[{"sni": "a.test", "upstream": "routed"}],
                             default_upstream="echo", on_malformed="default")],
               {"echo": upstream(echo), "routed": upstream(routed)})
    hello = bytearray(client_hello("a.test"))
    hello[5 + 4 + 2 + 32] = 200  # session id length: more than the 32 allowed
    c = s.connect()
    try:
        c.sendall(bytes(hello))
        c.shutdown(socket.SHUT_WR)
        assert harness.recv_all(c) == bytes(hello)
    finally:
        c.close()
    (rec,) = s.wait_records(1)
    assert rec["server"] == echo.address, "a malformed hello must not be routed by its SNI"
    assert rec["cause"] == "client_closed"
    assert routed.counts()[0] == 0
