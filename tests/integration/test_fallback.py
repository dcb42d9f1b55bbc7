"""Fallback upstreams (docs/configuration.md, "Fallback upstreams"): a read
pool with no eligible server sends new sessions to its fallback, the access
log, /metrics and /status show it, and sessions come back when a server of
the pool returns."""

from __future__ import annotations

import harness
from harness import listener, upstream
from test_admin import admin_sluice, metric, metrics, status  # noqa: F401  (admin_sluice is a fixture)

CHECK = {"type": "tcp", "interval": "100ms", "timeout": "500ms", "rise": 1, "fall": 1, "jitter": "0%"}


def state_of(s, upstream_name: str, address: str) -> str:
    (up,) = [u for u in status(s)["upstreams"] if u["name"] == upstream_name]
    (row,) = [x for x in up["servers"] if x["address"] == address]
    return row["state"]


def test_read_pool_falls_back_to_the_primary_and_comes_back(admin_sluice, backends):  # noqa: F811
    r1 = backends(harness.banner_handler, name="R1")
    p = backends(harness.banner_handler, name="P")
    s = admin_sluice([listener(upstream="reads")], {
        "reads": upstream(r1, fallback="primary", health=CHECK),
        "primary": upstream(p),
    })
    assert harness.banner_of(s) == b"R1"
    rec = s.wait_records(1)[-1]
    assert (rec["upstream"], rec["fallback"]) == ("reads", "0"), rec

    # The read pool's only server goes away and its check marks it down:
    # new clients land on the primary.
    port = r1.port
    r1.stop()
    harness.wait_until(lambda: state_of(s, "reads", r1.address) == "down", what="the replica marked down")
    for _ in range(3):
        assert harness.banner_of(s) == b"P"
    recs = s.wait_records(4)
    assert all((r["upstream"], r["fallback"], r["server"]) == ("primary", "1", p.address) for r in recs[1:]), recs
    _, samples = metrics(s)
    assert metric(samples, "sluice_upstream_fallback_total", upstream="reads", fallback="primary") == 3
    (reads,) = [u for u in status(s)["upstreams"] if u["name"] == "reads"]
    assert (reads["fallback"], reads["fallback_sessions"]) == ("primary", 3), reads

    # A replica returns at the same address: once it is up, new clients go
    # to the read pool again.
    back = backends(harness.banner_handler, name="R1", port=port)
    harness.wait_until(lambda: state_of(s, "reads", back.address) == "up", what="the replica up again")
    assert harness.banner_of(s) == b"R1"
    rec = s.wait_records(5)[-1]
    assert (rec["upstream"], rec["fallback"]) == ("reads", "0"), rec


def test_refused_connects_move_on_before_any_check(admin_sluice, backends):  # noqa: F811
    """Without health checks: the pool's servers refuse, passive health takes
    them out one try at a time, and the same session goes on to the fallback."""
    p = backends(harness.banner_handler, name="P")
    dead = f"127.0.0.1:{harness.dead_port()}"
    s = admin_sluice([listener(upstream="reads", tries=3)], {
        "reads": upstream(dead, fallback="primary"),
        "primary": upstream(p),
    })
    assert harness.banner_of(s) == b"P"
    rec = s.wait_records(1)[-1]
    assert (rec["upstream"], rec["fallback"], rec["tries"], rec["cause"]) == ("primary", "1", "2", "client_closed"), rec
    # The dead server is out for fail_timeout: the next session goes on at once.
    assert harness.banner_of(s) == b"P"
    rec = s.wait_records(2)[-1]
    assert (rec["upstream"], rec["fallback"], rec["tries"]) == ("primary", "1", "1"), rec


def test_chains_are_followed_to_the_end(admin_sluice, backends):  # noqa: F811
    c = backends(harness.banner_handler, name="C")
    dead_a = f"127.0.0.1:{harness.dead_port()}"
    dead_b = f"127.0.0.1:{harness.dead_port()}"
    s = admin_sluice([listener(upstream="a", tries=5)], {
        "a": upstream(dead_a, fallback="b"),
        "b": upstream(dead_b, fallback="c"),
        "c": upstream(c),
    })
    assert harness.banner_of(s) == b"C"
    rec = s.wait_records(1)[-1]
    assert (rec["upstream"], rec["fallback"], rec["tries"]) == ("c", "1", "3"), rec
    _, samples = metrics(s)
    assert metric(samples, "sluice_upstream_fallback_total", upstream="a", fallback="b") == 1
    assert metric(samples, "sluice_upstream_fallback_total", upstream="b", fallback="c") == 1


def test_fallback_comes_before_fail_open(admin_sluice, backends):  # noqa: F811
    """all_down = "fail_open" on the read pool: its (failing-check) server is
    used only when the fallback has no server either."""
    a = backends(harness.banner_handler, name="A")
    p = backends(harness.banner_handler, name="P")
    never = dict(CHECK, type="send_expect", send="hello\n", expect="NEVER")
    s = admin_sluice([listener(upstream="reads")], {
        "reads": upstream(a, fallback="primary", all_down="fail_open", health=never),
        "primary": upstream(p, health=CHECK),
    })
    harness.wait_until(lambda: state_of(s, "reads", a.address) == "down", what="the replica's check failing")
    assert harness.banner_of(s) == b"P"
    p.stop()
    harness.wait_until(lambda: state_of(s, "primary", p.address) == "down", what="the primary marked down")
    # Nothing healthy anywhere: the read pool's fail_open applies.
    assert harness.banner_of(s) == b"A"
    rec = s.wait_records(2)[-1]
    assert (rec["upstream"], rec["fallback"]) == ("reads", "0"), rec


def fallback_line(text: str) -> int:
    """The line of the first `fallback = ...` (rendered listeners may carry
    extra lines, such as the splice mode the suite runs with)."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith("fallback = "))


def test_check_names_a_looping_chain_at_its_key(tmp_path):
    path = tmp_path / "loop.toml"
    text = harness.render_config(
        None, [listener(upstream="a")],
        {"a": upstream("127.0.0.1:1", fallback="b"), "b": upstream("127.0.0.1:2", fallback="a")})
    path.write_text(text)
    res = harness.run_check(path)
    assert res.returncode == 1, res
    err = res.stderr.decode()
    assert f"{path}:{fallback_line(text)}:12: upstream \"a\": fallback chain loops (a -> b -> a)" in err, err

    text = harness.render_config(
        None, [listener(upstream="a")], {"a": upstream("127.0.0.1:1", fallback="primary")})
    path.write_text(text)
    res = harness.run_check(path)
    assert res.returncode == 1, res
    err = res.stderr.decode()
    assert f"{path}:{fallback_line(text)}:12: upstream \"a\": fallback \"primary\" is not defined; known upstreams: none" \
        in err, err


def test_reload_adds_a_fallback_and_keeps_its_count(admin_sluice, backends):  # noqa: F811
    p = backends(harness.banner_handler, name="P")
    dead = f"127.0.0.1:{harness.dead_port()}"
    listeners = [listener(upstream="reads", tries=3)]
    s = admin_sluice(listeners, {"reads": upstream(dead), "primary": upstream(p)})
    # Without a fallback the dead pool refuses the client.
    c = s.connect()
    assert harness.wait_closed(c) in ("eof", "reset")
    c.close()
    rec = s.wait_records(1)[-1]
    assert (rec["upstream"], rec["fallback"], rec["cause"]) == ("reads", "0", "connect_failed"), rec

    s.reload(s.render(listeners, {"reads": upstream(dead, fallback="primary"), "primary": upstream(p)}))
    assert harness.banner_of(s) == b"P"
    s.reload(s.render(listeners, {"reads": upstream(dead, fallback="primary", max_fails=2), "primary": upstream(p)}))
    assert harness.banner_of(s) == b"P"
    _, samples = metrics(s)
    assert metric(samples, "sluice_upstream_fallback_total", upstream="reads", fallback="primary") == 2
    recs = s.wait_records(3)
    assert [(r["upstream"], r["fallback"]) for r in recs[1:]] == [("primary", "1")] * 2, recs


def test_a_chain_with_no_server_refuses_and_logs_the_last_server_tried(admin_sluice, backends):  # noqa: F811
    """The read pool's servers all refuse and its fallback has none up: the
    session ends with connect_failed, and its record names the last server
    really tried, with that server's upstream."""
    dead1, dead2, dead3 = (f"127.0.0.1:{harness.dead_port()}" for _ in range(3))
    s = admin_sluice([listener(upstream="reads", tries=5)], {
        "reads": upstream(dead1, dead2, fallback="primary", balance="round_robin"),
        "primary": upstream(dead3, health=CHECK),
    })
    harness.wait_until(lambda: state_of(s, "primary", dead3) == "down", what="the primary marked down")
    c = s.connect()
    assert harness.wait_closed(c) in ("eof", "reset")
    c.close()
    rec = s.wait_records(1)[-1]
    assert rec["cause"] == "connect_failed", rec
    assert (rec["upstream"], rec["fallback"], rec["tries"]) == ("reads", "0", "2"), rec
    assert rec["server"] in (dead1, dead2), rec
    # sluice is still there and still refuses cleanly.
    c = s.connect()
    assert harness.wait_closed(c) in ("eof", "reset")
    c.close()
    assert s.wait_records(2)[-1]["cause"] in ("connect_failed", "no_server")
