"""A peer cannot forge access-log records: SNI/ALPN bytes are escaped, and a
hello carrying control bytes or invalid UTF-8 is still routed."""

from __future__ import annotations

import json
import random
import re
import time

import pytest

import harness
from harness import listener, upstream
from test_tls import client_hello

PLACEHOLDER = "P" * 40

HOSTILE = [
    b"h2\n2026-01-01T00:00:00.000 listener=tls client=6.6.6.6:1 cause=ok",
    b"h2\r\nx",
    b'","cause":"ok","x":"',
    b"\x00\x01\x1b[31mred",
    b"\xff\xfe\xc0\xaf",
    b"\xed\xa0\x80 surrogate",
    b"back\\slash \\x0a",
    b"\x7f\x80\x9f",
]


def hostile_values(n: int) -> list[bytes]:
    rng = random.Random(20261201)
    out = list(HOSTILE)
    while len(out) < n:
        out.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))))
    return out[:n]


def hello_with_alpn(raw: bytes) -> bytes:
    """A real ClientHello whose ALPN protocol bytes are replaced by `raw`
    (same length: the encoding stays valid)."""
    value = raw[:len(PLACEHOLDER)].ljust(len(PLACEHOLDER), b"_")
    flight = client_hello("a.example", alpn=[PLACEHOLDER])
    assert flight.count(PLACEHOLDER.encode()) == 1
    return flight.replace(PLACEHOLDER.encode(), value), value


def answer_handler(tag: bytes):
    def handle(backend, conn):
        conn.recv(65536)
        conn.sendall(tag + b"\n")
    return handle


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_hostile_hellos_give_exactly_one_record_each(sluice, backends, fmt):
    a = backends(answer_handler(b"A"), name="A")
    other = backends(answer_handler(b"B"), name="B")
    s = sluice([listener("tls", None, preread="tls", default_upstream="other",
                         routes=[{"sni": "a.example", "upstream": "a"}])],
               {"a": upstream(a), "other": upstream(other)},
               global_={"access_log_format": fmt})
    values = hostile_values(100)
    sent = []
    for raw in values:
        hello, value = hello_with_alpn(raw)
        sent.append(value)
        c = s.connect("tls")
        try:
            c.sendall(hello)
            assert harness.recv_line(c) == b"A", "a hostile ALPN must not change routing"
        finally:
            c.close()
    harness.wait_until(lambda: len(s.access_log.read_bytes().split(b"\n")) - 1 >= 100)
    time.sleep(0.3)  # anything more (a forged line) would show up now
    lines = s.access_log.read_bytes().split(b"\n")
    assert lines[-1] == b""
    lines = lines[:-1]
    assert len(lines) == 100, f"{len(lines)} lines for 100 sessions"
    for line in lines:
        text = line.decode("utf-8")  # strict: the file is valid UTF-8
        assert all(ch >= " " for ch in text), repr(text)
        if fmt == "json":
            rec = json.loads(text)
            assert rec["sni"] == "a.example" and rec["cause"] in ("client_closed", "server_closed")
            assert set(rec) == {"time", "listener", "upstream", "client", "server", "sni", "alpn", "tries",
                                "fallback", "bytes_in", "bytes_out", "connect_ms", "duration_ms", "cause"}
        else:
            fields = re.findall(r" (\w+)=", " " + text.split(" ", 1)[1])
            assert fields == ["listener", "upstream", "client", "server", "sni", "alpn", "tries", "fallback",
                              "bytes_in", "bytes_out", "connect_ms", "duration_ms", "cause"], text
            rec = harness.parse_access_line(text)
            assert rec["sni"] == "a.example" and rec["cause"] in ("client_closed", "server_closed")
    # The escaping is reversible: each ALPN value can be read back exactly.
    if fmt == "text":
        got = [harness.parse_access_line(l.decode())["alpn"] for l in lines]
        decoded = [re.sub(rb"\\(\\|x[0-9a-f]{2})",
                          lambda m: b"\\" if m.group(1) == b"\\" else bytes([int(m.group(1)[1:], 16)]),
                          g.encode()) for g in got]
        assert sorted(decoded) == sorted(sent)
