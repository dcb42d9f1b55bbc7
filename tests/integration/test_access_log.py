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


PHASES = ("pick", "connect", "connected", "first_in", "first_out", "close")


def test_log_phases_times_each_phase_of_a_session_in_order(sluice, backends):
    """[global] log_phases: the record gives when each phase was reached,
    in microseconds after the accept, in the order a session reaches them,
    and the loop turn that accepted it; a connect that never succeeds
    leaves the later phases at -1."""
    echo = backends(harness.echo_handler)
    s = sluice([listener(name="front"), listener(name="dead", upstream="gone")],
               {"up": upstream(echo), "gone": upstream(f"127.0.0.1:{harness.dead_port()}")},
               global_={"log_phases": True})
    assert harness.exchange(*s.addr("front"), b"timed", timeout=10) == b"timed"
    rec = s.wait_records(1, pred=lambda r: r["listener"] == "front")[0]
    at = {p: int(rec[f"{p}_us"]) for p in PHASES}
    assert int(rec["turn_us"]) >= 0 and int(rec["turn_events"]) >= 1
    # The client's bytes can arrive before the connect to the server ends:
    # first_in is after the accept, first_out after the connect.
    assert 0 <= at["pick"] <= at["connect"] <= at["connected"] <= at["first_out"] <= at["close"]
    assert 0 <= at["first_in"] <= at["close"]
    # A session whose server refuses: picked and connecting, never connected.
    with harness.connect(*s.addr("dead"), timeout=10) as c:
        c.settimeout(10)
        assert c.recv(16) == b""
    rec = s.wait_records(1, pred=lambda r: r["listener"] == "dead")[0]
    assert int(rec["pick_us"]) >= 0 and int(rec["connect_us"]) >= int(rec["pick_us"])
    assert rec["connected_us"] == rec["first_out_us"] == "-1"
    assert int(rec["close_us"]) >= int(rec["connect_us"])


def test_phases_are_left_out_unless_asked_for(sluice, backends):
    echo = backends(harness.echo_handler)
    s = sluice([listener(name="front")], {"up": upstream(echo)},
               global_={"access_log_format": "json"})
    assert harness.exchange(*s.addr(), b"plain", timeout=10) == b"plain"

    def records():
        try:
            lines = s.access_log.read_text().split("\n")[:-1]
        except FileNotFoundError:
            return None
        return [json.loads(l) for l in lines] or None

    rec = harness.wait_until(records, timeout=10, what="a JSON access record")[0]
    assert not any(k.endswith("_us") or k == "turn_events" for k in rec)
