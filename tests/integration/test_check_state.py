"""What active checks leave on a server, as /status shows it: the last
check's result as the reason, and a slow-start ramp only after the server
was down, and only where the balancer uses it (docs/health.md)."""

from __future__ import annotations

import harness
from harness import listener, upstream
from test_admin import admin_sluice, status  # noqa: F401  (admin_sluice is a fixture)

CHECK = {"type": "tcp", "interval": "100ms", "timeout": "500ms", "rise": 1, "fall": 1, "jitter": "0%"}


def servers(s) -> dict[str, dict]:
    (up,) = [u for u in status(s)["upstreams"] if u["name"] == "up"]
    return {x["address"]: x for x in up["servers"]}


def test_the_reason_is_the_last_checks_result(admin_sluice, backends):  # noqa: F811
    a = backends(harness.banner_handler, name="A")
    s = admin_sluice([listener()], {"up": upstream(a, health=dict(CHECK, rise=2, fall=2))})
    # initial = "up" until the first check; then what the checks found.
    harness.wait_until(lambda: servers(s)[a.address]["reason"] == "active check: connected",
                       what="the first check's result in the reason")
    harness.wait_until(lambda: a.counts()[0] >= 3, what="more checks")
    row = servers(s)[a.address]
    assert (row["state"], row["reason"]) == ("up", "active check: connected"), row


def test_slow_start_does_not_ramp_at_start_up(admin_sluice, backends):  # noqa: F811
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    health = dict(CHECK, slow_start="60s")
    s = admin_sluice([listener()], {"up": upstream(a, b, balance="round_robin", health=health)})
    harness.wait_until(lambda: a.counts()[0] >= 2 and b.counts()[0] >= 2, what="checks of both")
    rows = servers(s)
    # Nothing came back from anything: both take their full weight at once.
    assert [rows[x.address]["effective_weight"] for x in (a, b)] == [1.0, 1.0], rows

    # A server that was down and came back ramps.
    port = b.port
    b.stop()
    s.log.wait_for(rf"server {b.address} marked down \(active check\)")
    b2 = backends(harness.banner_handler, name="B", port=port)
    s.log.wait_for(rf"server {b2.address} is up \(active check\)")
    w = servers(s)[b2.address]["effective_weight"]
    assert 0.1 <= w < 0.5, f"effective weight {w} right after coming back, with a 60s ramp"
    assert servers(s)[a.address]["effective_weight"] == 1.0


def test_hash_reports_no_ramp_it_does_not_use(admin_sluice, backends):  # noqa: F811
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    health = dict(CHECK, slow_start="60s")
    s = admin_sluice([listener()], {"up": upstream(a, b, balance="hash", hash_key="client_ip", health=health)})
    port = b.port
    b.stop()
    s.log.wait_for(rf"server {b.address} marked down \(active check\)")
    b2 = backends(harness.banner_handler, name="B", port=port)
    s.log.wait_for(rf"server {b2.address} is up \(active check\)")
    rows = servers(s)
    assert [rows[x.address]["effective_weight"] for x in (a, b2)] == [1.0, 1.0], rows
