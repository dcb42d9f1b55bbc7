"""The access log's JSON format: one object per line, the same fields as text."""

from __future__ import annotations

import json

import harness
from harness import listener, upstream


def test_json_access_log_has_one_object_per_session(sluice, backends):
    echo = backends(harness.echo_handler)
    s = sluice([listener(name="front")], {"up": upstream(echo)},
               global_={"access_log_format": "json"})
    for payload in (b"one", b"second"):
        assert harness.exchange(*s.addr(), payload, timeout=10) == payload

    def records():
        try:
            lines = s.access_log.read_text().split("\n")[:-1]
        except FileNotFoundError:
            return None
        return [json.loads(l) for l in lines] if len(lines) >= 2 else None

    recs = harness.wait_until(records, timeout=10, what="2 JSON access records")
    assert len(recs) == 2
    for rec, payload in zip(recs, (b"one", b"second")):
        assert set(rec) == {"time", "listener", "upstream", "client", "server", "sni", "alpn", "tries",
                            "fallback", "bytes_in", "bytes_out", "connect_ms", "duration_ms", "cause"}
        assert rec["listener"] == "front"
        assert rec["upstream"] == "up" and rec["fallback"] is False
        assert rec["client"].startswith("127.0.0.1:")
        assert rec["server"] == echo.address
        assert rec["sni"] == "" and rec["alpn"] == ""
        assert rec["tries"] == 1
        assert rec["bytes_in"] == len(payload) and rec["bytes_out"] == len(payload)
        assert rec["connect_ms"] >= 0 and rec["duration_ms"] >= rec["connect_ms"]
        assert rec["cause"] == "client_closed"
