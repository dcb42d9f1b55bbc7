"""Sessions on a server that a reload or a DNS change removed (docs/operations.md,
"Retired servers"): they go on, and /status ("retired"), /metrics
(sluice_upstream_retired_sessions), /status.csv and the status page still
show them with their count, bytes and age, until they end or an operator
closes them with POST /upstreams/U/retired/ADDR/close (cause admin)."""

from __future__ import annotations

import csv
import io
import json
import urllib.request

import harness
from harness import listener, upstream
from test_admin import admin_sluice, metric, metrics, request, server_path, status  # noqa: F401
from test_dns import dns_sluice, held_session, render, tinydns, two_backends  # noqa: F401  (fixtures)


def retired_of(doc: dict, name: str = "up") -> list[dict]:
    for u in doc["upstreams"]:
        if u["name"] == name:
            return u["retired"]
    for u in doc["removed_upstreams"]:
        if u["name"] == name:
            return u["retired"]
    return []


def retired_series(s) -> dict:
    _, samples = metrics(s)
    return {dict(labels)["server"]: v for (n, labels), v in samples.items() if n == "sluice_upstream_retired_sessions"}


def test_a_reload_that_removes_a_server_with_a_live_session(admin_sluice, backends):  # noqa: F811
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = admin_sluice([listener()], {"up": upstream(a, b, balance="round_robin")})
    assert status(s)["upstreams"][0]["retired"] == []
    sessions = {}
    for _ in range(2):
        c = s.connect()
        sessions[harness.recv_line(c).decode()] = c
    held = sessions["A"]
    sessions["B"].close()
    harness.wait_until(lambda: status(s)["connections"] == 1, what="B's session over")
    held.sendall(b"x" * 1000)
    assert harness.recv_exact(held, 1000) == b"x" * 1000

    s.reload(s.render([listener()], {"up": upstream(b)}))
    doc = status(s)
    (r,) = retired_of(doc)
    assert r["address"] == a.address and r["sessions"] == 1, r
    assert r["age_seconds"] >= 0 and r["retired_at_ms"] > 0
    assert [sv["address"] for sv in doc["upstreams"][0]["servers"]] == [b.address]
    assert doc["listeners"][0]["active"] == 1
    assert retired_series(s) == {a.address: 1}
    # Live bytes reach the retired row within the worker's few seconds.
    harness.wait_until(lambda: retired_of(status(s))[0]["bytes_in"] >= 1000, timeout=15, what="live bytes")

    page = request(s, "GET", "/").body.decode()
    assert f'data-retired="{a.address}"' in page and "state-retired" in page
    rows = list(csv.DictReader(io.StringIO(request(s, "GET", "/status.csv").body.decode(), newline="")))
    (row,) = [x for x in rows if x["type"] == "retired"]
    assert (row["name"], row["address"], row["active"]) == ("up", a.address, "1"), row

    # The server's own actions say where its sessions are.
    r = request(s, "POST", server_path("up", a.address, "disable"))
    assert r.status == 404 and "retired" in r.error(), r
    # Close them: the session ends with cause admin, the row goes.
    assert request(s, "POST", f"/upstreams/up/retired/{a.address}/drain").status == 404
    assert request(s, "GET", f"/upstreams/up/retired/{a.address}/close").status == 405
    r = request(s, "POST", f"/upstreams/up/retired/{a.address}/close")
    assert r.status == 200, r
    assert r.json()["closing"] == 1
    assert harness.wait_closed(held) in ("eof", "reset")
    (rec,) = s.wait_records(1, pred=lambda x: x["server"] == a.address and x["cause"] != "interim")
    assert rec["cause"] == "admin", rec
    harness.wait_until(lambda: retired_of(status(s)) == [], what="the retired row gone")
    assert retired_series(s) == {}
    r = request(s, "POST", f"/upstreams/up/retired/{a.address}/close")
    assert r.status == 404 and r.error()
    assert request(s, "POST", f"/upstreams/nope/retired/{a.address}/close").status == 404


def test_a_removed_upstream_keeps_its_sessions_in_view(admin_sluice, backends):  # noqa: F811
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = admin_sluice([listener()], {"up": upstream(a), "spare": upstream(b)})
    held = s.connect()
    assert harness.recv_line(held) == b"A"
    s.reload(s.render([listener(upstream="spare")], {"spare": upstream(b)}))
    doc = status(s)
    assert [u["name"] for u in doc["upstreams"]] == ["spare"]
    (gone,) = doc["removed_upstreams"]
    assert gone["name"] == "up" and [r["address"] for r in gone["retired"]] == [a.address], gone
    page = request(s, "GET", "/").body.decode()
    assert f'data-retired="{a.address}"' in page and "removed from the configuration" in page
    # The session still works; when it ends on its own, the entry goes.
    held.sendall(b"ping")
    assert harness.recv_exact(held, 4) == b"ping"
    held.close()
    harness.wait_until(lambda: status(s)["removed_upstreams"] == [], what="the entry gone")


def test_a_dns_change_retires_the_old_address(tinydns, dns_sluice, backends):  # noqa: F811
    port, _ = two_backends(backends, ["127.0.0.2", "127.0.0.3"])
    dns = tinydns()
    dns.names["db.test"] = ["127.0.0.2"]
    d = dns_sluice(render(dns.nameserver, [{"address": f"db.test:{port}", "resolve": True}]))
    session, name = held_session(d)
    assert name == "127.0.0.2"
    with dns._lock:
        dns.names["db.test"] = ["127.0.0.3"]
    d.wait_addresses([f"127.0.0.3:{port}"])
    old = f"127.0.0.2:{port}"
    (r,) = retired_of(d.status())
    assert (r["address"], r["sessions"]) == (old, 1), r
    assert f'sluice_upstream_retired_sessions{{upstream="up",server="{old}"}} 1' in d.metrics()
    # Still flowing, still shown.
    session.sendall(b"more")
    assert harness.recv_exact(session, 4) == b"more"
    host, admin_port = d.admin
    req = urllib.request.Request(f"http://{host}:{admin_port}/upstreams/up/retired/{old}/close", method="POST",
                                 data=b"")
    with urllib.request.urlopen(req, timeout=10) as reply:
        assert reply.status == 200 and json.load(reply)["closing"] == 1
    assert harness.wait_closed(session) in ("eof", "reset")
    harness.wait_until(lambda: retired_of(d.status()) == [], what="the retired row gone")
