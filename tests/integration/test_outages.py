"""An upstream left with no eligible server is announced (docs/operations.md,
"Every outage is announced"): one warning when its last eligible server
goes, with how many are in which state, one info line when one is back,
nothing while it lasts; sluice_upstream_servers_available says how many
are eligible now, and the status page shows the listener in red.

Each way a pool empties is tried as an operator meets it: real backends
that close, every server drained through the admin API, every server at
max_conns, and a DNS answer with no record (tests/integration/test_dns.py's
responder)."""

from __future__ import annotations

import re

import harness
from harness import listener, upstream
from status_rows import StatusPageRows
from test_admin import admin_sluice, metric, metrics, request, server_path, status  # noqa: F401
from test_dns import dns_sluice, render, tinydns, two_backends  # noqa: F401  (fixtures)

START_RX = r'upstream "{}" has no server available: (.*)'
END_RX = r'upstream "{}" has a server available again after \S+: (\d+) of (\d+) eligible'


def available(s, name: str = "up") -> float:
    _, samples = metrics(s)
    return metric(samples, "sluice_upstream_servers_available", upstream=name)


def ticks(s, n: int = 3) -> None:
    """Lets the control loop's once-a-second look run `n` more times: waits
    until /status's uptime has moved on by n seconds."""
    start = status(s)["uptime_seconds"]
    harness.wait_until(lambda: status(s)["uptime_seconds"] >= start + n + 0.2, what=f"{n} ticks")


def warnings(s, name: str = "up") -> list[str]:
    return [m.group(1) for m in s.log.matches(START_RX.format(re.escape(name)))]


def test_servers_that_go_down_are_announced_once_and_their_return(admin_sluice, backends):  # noqa: F811
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    health = {"type": "tcp", "interval": "200ms", "timeout": "1s", "rise": 1, "fall": 1}
    s = admin_sluice([listener(tries=1)], {"up": upstream(a, b, health=health)})
    harness.wait_until(lambda: available(s) == 2, what="both servers eligible")
    port_a = a.port

    a.stop()
    b.stop()
    m = s.log.wait_for(START_RX.format("up"), timeout=harness.EVENT_TIMEOUT)
    assert m.group(1) == "2 down (of 2)", m.group(0)
    line = next(l for l in s.log.lines if "has no server available" in l)
    assert "warn" in line.lower(), line
    assert available(s) == 0
    c = s.connect()
    assert harness.wait_closed(c) in ("eof", "reset")
    s.wait_records(1, pred=lambda r: r["cause"] == "no_server")

    # The page: the listener in red, the upstream flagged.
    page = request(s, "GET", "/").body.decode()
    p = StatusPageRows()
    p.feed(page)
    (main,) = [a_ for t, a_ in p.tags if t == "tr" and a_.get("data-listener") == "main"]
    assert "no-server" in (main.get("class") or "").split(), main
    assert 'id="outages"' in page

    # Not repeated while it lasts.
    ticks(s, 3)
    assert warnings(s) == ["2 down (of 2)"], s.log.text()

    # One server back: one line, at info, and the gauge follows.
    back = backends(harness.banner_handler, name="A2", port=port_a)
    m = s.log.wait_for(END_RX.format("up"), timeout=harness.EVENT_TIMEOUT)
    assert (m.group(1), m.group(2)) == ("1", "2"), m.group(0)
    line = next(l for l in s.log.lines if "has a server available again" in l)
    assert "info" in line.lower(), line
    assert available(s) == 1
    c = s.connect()
    assert harness.recv_line(c) == b"A2"
    c.close()
    ticks(s, 2)
    assert len(s.log.matches(END_RX.format("up"))) == 1
    assert back.accepted >= 1


def test_every_server_drained_through_the_admin_api(admin_sluice, backends):  # noqa: F811
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = admin_sluice([listener()], {"up": upstream(a, b), "other": upstream(a)})
    assert available(s) == 2 and available(s, "other") == 1
    for be in (a, b):
        assert request(s, "POST", server_path("up", be.address, "drain")).status == 200
    m = s.log.wait_for(START_RX.format("up"))
    assert m.group(1) == "2 drained (of 2)", m.group(0)
    assert available(s) == 0
    doc = status(s)
    (up,) = [u for u in doc["upstreams"] if u["name"] == "up"]
    assert up["servers_available"] == 0 and up["unavailable"] == {"drained": 2}, up
    # The same server in another upstream is its own: nothing to say there.
    assert warnings(s, "other") == []
    assert available(s, "other") == 1

    assert request(s, "POST", server_path("up", b.address, "disable")).status == 200
    ticks(s, 2)
    assert warnings(s) == ["2 drained (of 2)"]  # the breakdown changed, the outage did not

    assert request(s, "POST", server_path("up", a.address, "enable")).status == 200
    m = s.log.wait_for(END_RX.format("up"))
    assert (m.group(1), m.group(2)) == ("1", "2")
    assert available(s) == 1


def test_every_server_full_then_a_slot_frees(admin_sluice, backends):  # noqa: F811
    a = backends(harness.banner_handler, name="A")
    s = admin_sluice([listener()], {"up": {"servers": [{"address": a.address, "max_conns": 1}]}})
    held = s.connect()
    assert harness.recv_line(held) == b"A"
    m = s.log.wait_for(START_RX.format("up"))
    assert m.group(1) == "1 full (of 1)", m.group(0)
    assert available(s) == 0
    held.close()
    s.log.wait_for(END_RX.format("up"))
    assert available(s) == 1
    assert len(warnings(s)) == 1


def test_an_empty_dns_answer(tinydns, dns_sluice, backends):  # noqa: F811
    port, _ = two_backends(backends, ["127.0.0.2"])
    dns = tinydns()
    dns.names["db.test"] = ["127.0.0.2"]
    d = dns_sluice(render(dns.nameserver, [{"address": f"db.test:{port}", "resolve": True}]))
    assert d.addresses() == [f"127.0.0.2:{port}"]
    assert d.metric("sluice_upstream_servers_available", upstream="up") == 1

    # The name stays, its answer has no record: after `hold`, no server.
    with dns._lock:
        dns.names["db.test"] = []
    d.wait_addresses([])
    m = d.s.log.wait_for(START_RX.format("up"))
    assert m.group(1) == "the pool is empty", m.group(0)
    assert d.metric("sluice_upstream_servers_available", upstream="up") == 0
    assert d.status()["upstreams"][0]["servers_available"] == 0

    with dns._lock:
        dns.names["db.test"] = ["127.0.0.2"]
    d.wait_addresses([f"127.0.0.2:{port}"])
    m = d.s.log.wait_for(END_RX.format("up"))
    assert (m.group(1), m.group(2)) == ("1", "1")
    assert len(d.s.log.matches(START_RX.format("up"))) == 1
