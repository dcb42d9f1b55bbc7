"""The wait queue behind max_conns (docs/configuration.md, "Wait queue"):
clients that find every server at max_conns wait, their bytes kept in the
kernel, and go on first come first served as slots free, across workers;
a full queue refuses; queue_timeout ends a wait; /status, the status page
and /metrics show the queue.

Order and progress are asserted, never speed: every wait has a deadline
that only matters when something is broken."""

from __future__ import annotations

import signal
import socket

import pytest

import harness
from harness import listener, upstream
from test_admin import admin_sluice, metric, metrics, request, status  # noqa: F401  (admin_sluice is a fixture)


def tag_handler(backend: harness.Backend, conn: socket.socket):
    """Reads the client's tag line, records it in arrival order, answers
    "ok TAG", then echoes until EOF."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk:
            return
        line += chunk
    with backend._lock:
        backend.tags.append(line.strip().decode())
    conn.sendall(b"ok " + line)
    harness.echo_handler(backend, conn)


def tagged_backend(backends) -> harness.Backend:
    b = backends(tag_handler, name="pg")
    b.tags = []
    return b


def tags(b: harness.Backend) -> list[str]:
    with b._lock:
        return list(b.tags)


def client(s, tag: str) -> socket.socket:
    """A client that says its tag at once: while it waits in the queue the
    bytes stay in the kernel and reach the server only once it has a slot."""
    c = s.connect()
    c.sendall(tag.encode() + b"\n")
    return c


def answered(c: socket.socket, tag: str) -> None:
    assert harness.recv_line(c) == b"ok " + tag.encode()


def pool(b: harness.Backend, max_conns: int, **kw) -> dict:
    """An upstream of one server with max_conns (harness.upstream writes
    plain servers only)."""
    return {**kw, "servers": [{"address": b.address, "max_conns": max_conns}]}


def hold_one_and_queue_one(s) -> tuple[socket.socket, socket.socket]:
    """A held session on the (max_conns = 1) server and a client waiting."""
    held = client(s, "h1")
    answered(held, "h1")
    waiter = client(s, "w2")
    wait_queued(s, 1)
    return held, waiter


def queue_of(s, name: str = "pg") -> dict:
    (up,) = [u for u in status(s)["upstreams"] if u["name"] == name]
    return up["queue"]


def wait_queued(s, n: int) -> None:
    harness.wait_until(lambda: queue_of(s)["length"] == n, what=f"{n} client(s) in the queue")


@pytest.mark.parametrize("workers", [1, 2])
def test_clients_wait_in_order_and_a_full_queue_refuses(admin_sluice, backends, workers):
    b = tagged_backend(backends)
    s = admin_sluice([listener(upstream="pg")],
                     {"pg": pool(b, 2, queue=3, queue_timeout="60s")},
                     global_={"workers": workers})
    # Two held sessions fill the server, one after the other (two clients
    # in flight at once may reach the server in either order).
    held = []
    for tag in ("h1", "h2"):
        held.append(client(s, tag))
        answered(held[-1], tag)
    assert tags(b) == ["h1", "h2"]

    # The 3rd to 5th wait, each after the one before is in line (so that
    # their order of arrival is known, whichever worker accepted them).
    waiting = {}
    for k, tag in enumerate(("w3", "w4", "w5"), 1):
        waiting[tag] = client(s, tag)
        wait_queued(s, k)
    # Nothing of theirs reached the server: it still has its two clients.
    assert b.counts() == (2, 2)
    assert tags(b) == ["h1", "h2"]
    q = queue_of(s)
    assert (q["length"], q["max"], q["queued"], q["timeouts"]) == (3, 3, 3, 0), q
    _, samples = metrics(s)
    assert metric(samples, "sluice_upstream_queue_length", upstream="pg") == 3
    assert metric(samples, "sluice_upstream_queued_total", upstream="pg") == 3
    page = request(s, "GET", "/").body.decode()
    assert '<div class="meta" data-queue="pg">queue: 3 waiting of 3 at most;' in page, page

    # The 6th finds the servers and the queue full: refused as a full
    # upstream without a queue refuses.
    sixth = client(s, "w6")
    assert harness.wait_closed(sixth) in ("eof", "reset")
    sixth.close()
    rec = s.wait_records(1, pred=lambda r: r["cause"] == "no_server")[0]
    assert rec["upstream"] == "pg", rec
    assert queue_of(s)["refused"] == 1

    # Each session that ends lets the earliest waiter in, and only it.
    held[0].close()
    answered(waiting["w3"], "w3")
    assert tags(b) == ["h1", "h2", "w3"]
    assert queue_of(s)["length"] == 2
    held[1].close()
    answered(waiting["w4"], "w4")
    waiting["w3"].close()
    answered(waiting["w5"], "w5")
    assert tags(b) == ["h1", "h2", "w3", "w4", "w5"]
    q = queue_of(s)
    assert (q["length"], q["waits"], q["timeouts"]) == (0, 3, 0), q
    # The waiters' sessions carried their bytes both ways, like any other.
    for tag in ("w4", "w5"):
        waiting[tag].sendall(b"echo\n")
        assert harness.recv_line(waiting[tag]) == b"echo"
        waiting[tag].close()
    _, samples = metrics(s)
    assert metric(samples, "sluice_upstream_queue_length", upstream="pg") == 0
    assert metric(samples, "sluice_upstream_queue_wait_seconds_count", upstream="pg") == 3
    assert metric(samples, "sluice_upstream_queue_refused_total", upstream="pg") == 1


@pytest.mark.parametrize("workers", [1, 2])
def test_queue_timeout_ends_a_wait(admin_sluice, backends, workers):
    b = tagged_backend(backends)
    s = admin_sluice([listener(upstream="pg")],
                     {"pg": pool(b, 1, queue=2, queue_timeout="300ms")},
                     global_={"workers": workers})
    held = client(s, "h1")
    answered(held, "h1")
    late = client(s, "w2")  # not watched in /status: its wait may be over first
    # The wait ends by itself: closed, never connected, cause queue_timeout.
    assert harness.wait_closed(late) in ("eof", "reset")
    late.close()
    rec = s.wait_records(1, pred=lambda r: r["cause"] == "queue_timeout")[0]
    assert rec["upstream"] == "pg", rec
    assert b.counts()[0] == 1
    q = queue_of(s)
    assert (q["length"], q["timeouts"], q["waits"]) == (0, 1, 1), q
    _, samples = metrics(s)
    assert metric(samples, "sluice_upstream_queue_timeouts_total", upstream="pg") == 1
    assert metric(samples, "sluice_listener_closed_total", listener="main", cause="queue_timeout") == 1
    # The held session was never disturbed.
    held.sendall(b"still\n")
    assert harness.recv_line(held) == b"still"
    held.close()


def test_without_a_queue_a_full_upstream_refuses_at_once(admin_sluice, backends):
    b = tagged_backend(backends)
    s = admin_sluice([listener(upstream="pg")],
                     {"pg": pool(b, 1)})
    held = client(s, "h1")
    answered(held, "h1")
    c = client(s, "w2")
    assert harness.wait_closed(c) in ("eof", "reset")
    c.close()
    rec = s.wait_records(1, pred=lambda r: r["cause"] == "no_server")[0]
    assert rec["upstream"] == "pg", rec
    (up,) = [u for u in status(s)["upstreams"] if u["name"] == "pg"]
    assert "queue" not in up, up
    held.close()


def test_a_full_pool_with_a_queue_waits_instead_of_falling_back(admin_sluice, backends):
    """fallback is for servers that are down; servers that are merely full
    keep their clients in the queue."""
    b = tagged_backend(backends)
    p = backends(harness.banner_handler, name="P")
    s = admin_sluice([listener(upstream="pg")], {
        "pg": pool(b, 1, queue=1, queue_timeout="60s", fallback="primary"),
        "primary": upstream(p),
    })
    held, waiter = hold_one_and_queue_one(s)
    assert p.counts()[0] == 0
    # The queue is full too: that client goes on to the fallback, as it
    # would without a queue.
    over = s.connect()
    assert harness.recv_line(over) == b"P"
    over.close()
    held.close()
    answered(waiter, "w2")
    waiter.close()


def test_check_rejects_a_queue_without_max_conns(tmp_path):
    path = tmp_path / "q.toml"
    text = harness.render_config(None, [listener(upstream="pg")],
                                 {"pg": upstream("127.0.0.1:5432", queue=5)})
    path.write_text(text)
    res = harness.run_check(path)
    assert res.returncode == 1, res
    line = next(i for i, l in enumerate(text.splitlines(), 1) if l.startswith("queue = "))
    err = res.stderr.decode()
    assert f"{path}:{line}:9: upstream \"pg\": queue needs max_conns on the servers" in err, err


def test_waiters_outlive_a_reload_and_keep_their_place(admin_sluice, backends):
    """One queue per upstream name: a client that waited before a reload is
    served before one that came after it."""
    b = tagged_backend(backends)
    listeners = [listener(upstream="pg")]
    s = admin_sluice(listeners, {"pg": pool(b, 1, queue=2, queue_timeout="60s")})
    held, before = hold_one_and_queue_one(s)
    s.reload(s.render(listeners, {"pg": pool(b, 1, queue=2, queue_timeout="60s", max_fails=2)}))
    after = client(s, "w3")
    wait_queued(s, 2)
    held.close()
    answered(before, "w2")
    before.close()
    answered(after, "w3")
    after.close()
    assert tags(b) == ["h1", "w2", "w3"]


def test_a_waiter_outlasts_its_servers_being_disabled_and_gets_one_back(admin_sluice, backends):
    """A waiter is tied to no server: disabling the only one closes its
    session but not the wait, and enabling it again (which frees no slot)
    lets the waiter in."""
    b = tagged_backend(backends)
    s = admin_sluice([listener(upstream="pg")], {"pg": pool(b, 1, queue=2, queue_timeout="60s")})
    held, waiter = hold_one_and_queue_one(s)
    assert request(s, "POST", f"/upstreams/pg/servers/{b.address}/disable").status == 200
    assert harness.wait_closed(held) in ("eof", "reset")
    held.close()
    s.wait_records(1, pred=lambda r: r["cause"] == "server_drained")
    assert queue_of(s)["length"] == 1
    assert tags(b) == ["h1"]
    assert request(s, "POST", f"/upstreams/pg/servers/{b.address}/enable").status == 200
    answered(waiter, "w2")
    waiter.close()


def test_graceful_stop_closes_waiters_at_shutdown_timeout(admin_sluice, backends):
    b = tagged_backend(backends)
    s = admin_sluice([listener(upstream="pg")], {"pg": pool(b, 1, queue=2, queue_timeout="60s")},
                     global_={"shutdown_timeout": "500ms"})
    held, waiter = hold_one_and_queue_one(s)
    s.signal(signal.SIGTERM)
    assert harness.wait_closed(waiter) in ("eof", "reset")
    assert harness.wait_closed(held) in ("eof", "reset")
    waiter.close()
    held.close()
    assert s.wait_exit(timeout=harness.EVENT_TIMEOUT) == 0
    causes = sorted(r["cause"] for r in s.wait_records(2))
    assert causes == ["shutdown", "shutdown"], causes
