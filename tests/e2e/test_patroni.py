"""The Patroni recipe of docs/health.md: `http` checks against each node's
Patroni REST API, one upstream for writes (`/primary`) and one for reads
(`/replica?lag=1MB`), the check on the API's port while sessions go to the
database port.

Each node is a loopback address of its own (127.0.0.1, .2, .3), with the
same two ports on every node, as three hosts would have 5432 and 8008: a TCP
backend that names its node, and a stand-in for Patroni's REST API that
answers the health endpoints the way Patroni does, with a role the test
flips. A switchover demotes the leader, then promotes a replica; sessions
follow, the live write session on the old leader is closed, and no write
session reaches a node that is not the leader."""

from __future__ import annotations

import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

import harness
from harness import listener, upstream

NODES = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]

# Patroni's units for ?lag= (bytes, or kB/MB/GB/TB in powers of 1024).
LAG_UNITS = {"": 1, "B": 1, "kB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


def parse_lag(text: str) -> int | None:
    m = re.fullmatch(r"\s*(\d+)\s*(B|kB|MB|GB|TB)?\s*", text)
    return int(m.group(1)) * LAG_UNITS[m.group(2) or ""] if m else None


class PatroniStandIn:
    """Answers Patroni's health endpoints from `role` ("primary" or
    "replica"), `state` ("running" or anything else) and `lag` (bytes behind
    the leader):

    - `/`, `/primary`, `/read-write`: 200 on a running primary, else 503;
    - `/replica`: 200 on a running replica, else 503; with `?lag=N`, also 503
      when the replica is more than N behind;
    - `/read-only`: as `/replica`, and 200 on a running primary too;
    - `/health`: 200 while PostgreSQL runs, whatever the role.

    GET gets a JSON body like Patroni's; HEAD and OPTIONS the status only.
    Every request's path is kept in `requests`."""

    def __init__(self, host: str, port: int, role: str):
        self.role = role
        self.state = "running"
        self.lag = 0
        self.requests: list[str] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def answer(self, body: bool):
                status = owner.status_for(self.path)
                payload = json.dumps({"state": owner.state, "role": owner.role,
                                      "xlog": {"replayed_location": 1000 - owner.lag}}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload) if body else 0))
                self.end_headers()
                if body:
                    self.wfile.write(payload)

            def do_GET(self):
                self.answer(True)

            def do_HEAD(self):
                self.answer(False)

            def do_OPTIONS(self):
                self.answer(False)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def status_for(self, target: str) -> int:
        url = urlsplit(target)
        with self.lock:
            self.requests.append(target)
            running = self.state == "running"
            role, lag = self.role, self.lag
        query = parse_qs(url.query)
        within_lag = True
        if "lag" in query:
            limit = parse_lag(query["lag"][0])
            within_lag = limit is not None and lag <= limit
        replica_ok = running and role == "replica" and within_lag
        if url.path in ("/", "/primary", "/read-write"):
            return 200 if running and role == "primary" else 503
        if url.path == "/replica":
            return 200 if replica_ok else 503
        if url.path == "/read-only":
            return 200 if replica_ok or (running and role == "primary") else 503
        if url.path == "/health":
            return 200 if running else 503
        return 404

    def set(self, **kw):
        with self.lock:
            for k, v in kw.items():
                setattr(self, k, v)

    def seen(self) -> list[str]:
        with self.lock:
            return list(self.requests)

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def same_port_on_every_node(make, tries: int = 20):
    """make(host, port) on every node with one port, picked by binding port 0
    on the first node; tries again while another node has it taken."""
    for _ in range(tries):
        made = [make(NODES[0], 0)]
        port = made[0].port
        try:
            for host in NODES[1:]:
                made.append(make(host, port))
            return port, made
        except OSError:
            for m in made:
                m.stop()
    raise AssertionError("no port free on every loopback node")


@pytest.fixture
def cluster():
    """Three nodes: node 1 the leader, 2 and 3 replicas. Yields (db_port,
    api_port, backends, apis); everything is stopped afterwards."""
    started = []
    try:
        db_port, backends = same_port_on_every_node(
            lambda host, port: harness.Backend(harness.banner_handler, name=f"node{NODES.index(host) + 1}",
                                               host=host, port=port))
        started += backends
        api_port, apis = same_port_on_every_node(
            lambda host, port: PatroniStandIn(host, port, "primary" if host == NODES[0] else "replica"))
        started += apis
        yield db_port, api_port, backends, apis
    finally:
        for thing in started:
            thing.stop()


def patroni_health(api_port: int, path: str) -> dict:
    """The recipe's check, with test timings (the recipe's are 2s, rise 2, fall 3)."""
    return {"type": "http", "port": api_port, "path": path, "expect_status": [200],
            "initial": "down", "on_down": "close_sessions",
            "interval": "200ms", "timeout": "1s", "rise": 1, "fall": 1, "jitter": "0%"}


def node_through(s, name: str) -> str:
    """Which node a new session through listener `name` reached."""
    with s.connect(name) as c:
        return harness.recv_line(c).decode().strip()


def test_sessions_follow_the_patroni_leader(sluice, cluster):
    db_port, api_port, backends, apis = cluster
    addrs = [f"{h}:{db_port}" for h in NODES]
    s = sluice([listener("rw", "rw"), listener("ro", "ro")],
               {"rw": upstream(*addrs, balance="least_conn", health=patroni_health(api_port, "/primary")),
                "ro": upstream(*addrs, balance="least_conn", health=patroni_health(api_port, "/replica?lag=1MB"))},
               global_={"workers": 2})
    # The first round of checks ran before the listeners accepted: from the
    # very first session, writes reach the leader only and reads the replicas.
    s.log.wait_for(r"first checks answered")
    assert [node_through(s, "rw") for _ in range(4)] == ["node1"] * 4
    assert {node_through(s, "ro") for _ in range(4)} == {"node2", "node3"}
    # The checks went to each node's API port, with the path and query as written.
    for api in apis:
        seen = api.seen()
        assert "/primary" in seen and "/replica?lag=1MB" in seen, seen
        assert set(seen) <= {"/primary", "/replica?lag=1MB"}, seen

    held = s.connect("rw")  # a write session that stays on the leader
    assert harness.recv_line(held) == b"node1"
    done = len(s.wait_records(8))

    # Switchover: Patroni demotes the leader first, then promotes node 2.
    start = len(s.log.lines)
    apis[0].set(role="replica")
    apis[1].set(role="primary")
    n1, n2 = (re.escape(a) for a in addrs[:2])
    s.log.wait_for(rf'upstream "rw" server {n1} marked down \(active check\): HTTP 503', start=start)
    s.log.wait_for(rf'upstream "rw" server {n2} is up \(active check\): HTTP 200', start=start)
    s.log.wait_for(rf'upstream "ro" server {n2} marked down \(active check\): HTTP 503', start=start)
    s.log.wait_for(rf'upstream "ro" server {n1} is up \(active check\): HTTP 200', start=start)

    # The live write session on the demoted node was closed, so its client
    # reconnects, to the new leader.
    assert harness.wait_closed(held) in ("eof", "reset")
    held.close()
    rec = s.wait_records(done + 1)[done]
    assert (rec["upstream"], rec["server"], rec["cause"]) == ("rw", addrs[0], "server_down"), rec
    done += 1

    accepted_by_old_leader = backends[0].counts()[0]
    assert [node_through(s, "rw") for _ in range(4)] == ["node2"] * 4
    assert {node_through(s, "ro") for _ in range(6)} == {"node1", "node3"}
    # Only read sessions reached the old leader from then on.
    recs = s.wait_records(done + 10)[done:]
    assert {r["server"] for r in recs if r["upstream"] == "rw"} == {addrs[1]}, recs
    assert backends[0].counts()[0] - accepted_by_old_leader == \
        sum(1 for r in recs if r["server"] == addrs[0]), recs
    done += 10

    # A replica further behind than ?lag= leaves the read pool; its lag
    # recovers and it comes back.
    start = len(s.log.lines)
    n3 = re.escape(addrs[2])
    apis[2].set(lag=2 << 20)
    s.log.wait_for(rf'upstream "ro" server {n3} marked down \(active check\): HTTP 503', start=start)
    assert {node_through(s, "ro") for _ in range(4)} == {"node1"}
    apis[2].set(lag=512 << 10)
    s.log.wait_for(rf'upstream "ro" server {n3} is up \(active check\): HTTP 200', start=start)
    assert {node_through(s, "ro") for _ in range(4)} == {"node1", "node3"}

    # Every write session of the test reached the node that was the leader then.
    recs = s.wait_records(done + 8)
    assert [r["server"] for r in recs if r["upstream"] == "rw"] == \
        [addrs[0]] * 5 + [addrs[1]] * 4, recs


def test_no_leader_refuses_writes_and_reads_continue(sluice, cluster):
    """Between the demotion and the promotion no node answers 200 on
    /primary: a write session is refused (all_down = "fail_closed") rather
    than sent to a replica, and reads go on."""
    db_port, api_port, backends, apis = cluster
    addrs = [f"{h}:{db_port}" for h in NODES]
    s = sluice([listener("rw", "rw"), listener("ro", "ro")],
               {"rw": upstream(*addrs, health=patroni_health(api_port, "/primary")),
                "ro": upstream(*addrs, health=patroni_health(api_port, "/replica?lag=1MB"))})
    assert node_through(s, "rw") == "node1"
    start = len(s.log.lines)
    apis[0].set(state="stopped")  # PostgreSQL stopped on the leader; nobody promoted yet
    s.log.wait_for(rf'upstream "rw" server {re.escape(addrs[0])} marked down', start=start)
    before = [b.counts()[0] for b in backends]
    with s.connect("rw") as c:
        assert harness.wait_closed(c) in ("eof", "reset")
    rec = s.wait_records(2)[1]
    assert (rec["upstream"], rec["cause"]) == ("rw", "no_server"), rec
    assert [b.counts()[0] for b in backends] == before
    assert node_through(s, "ro") in ("node2", "node3")


def test_parse_lag_units_like_patroni():
    assert parse_lag("1048576") == 1 << 20
    assert parse_lag("1024kB") == 1 << 20
    assert parse_lag("1MB") == 1 << 20
    assert parse_lag("2GB") == 2 << 30
    assert parse_lag("ten") is None
