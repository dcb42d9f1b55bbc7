"""The admin HTTP API (docs/operations.md, "Admin API, metrics and the status
page"): every endpoint against what the test itself did through the proxy,
authentication, runtime server state, and hostile clients that must never
reach the data path."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse

import pytest

import harness
from fixtures import default_global, stop_all_cleanly
from harness import listener, upstream
from status_rows import StatusPageRows

ADMIN_RX = r"admin API listening on (?P<addr>\S+)"
HTTP_TIMEOUT = 10.0


# --------------------------------------------------------------------------
# sluice with an [admin] table
# --------------------------------------------------------------------------

def render_admin(admin: dict) -> str:
    out = ["[admin]"]
    out += [f"{k} = {harness._toml_value(v)}" for k, v in admin.items()]
    return "\n".join(out) + "\n"


class AdminSluice(harness.Sluice):
    """A Sluice whose file has an [admin] table; knows the admin address."""

    admin_addr: tuple[str, int]
    admin_table: dict
    global_: dict

    def render(self, listeners, upstreams, admin: dict | None = None, **global_) -> str:
        g = default_global(self.access_log)
        g.update(self.global_)
        g.update(global_)
        text = harness.render_config(g, listeners, upstreams)
        return text + "\n" + render_admin(self.admin_table if admin is None else admin)

    def start(self) -> "AdminSluice":
        super().start()
        m = self.log.wait_for(ADMIN_RX, timeout=harness.START_TIMEOUT)
        self.admin_addr = harness.split_addr(m.group("addr"))
        return self


@pytest.fixture
def admin_sluice(tmp_path):
    """make(listeners, upstreams, admin={...}, global_={...}) -> started AdminSluice.

    Each instance gets its own directory (the configuration file's directory
    must hold nothing but what sluice and the test put there)."""
    started: list[AdminSluice] = []

    def make(listeners, upstreams, admin=None, global_=None, start=True, name=None):
        name = name or f"sluice{len(started) + 1}"
        workdir = tmp_path / name
        workdir.mkdir()
        access_log = workdir / "access.log"
        s = AdminSluice(workdir, "", [l["name"] for l in listeners], name=name, access_log=access_log)
        s.admin_table = dict(admin or {"listen": "127.0.0.1:0"})
        s.global_ = dict(global_ or {})
        s.config_path.write_text(s.render(listeners, upstreams))
        started.append(s)
        if start:
            s.start()
        return s

    yield make
    stop_all_cleanly(started)


# --------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------

class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes, what: str):
        self.status = status
        self.headers = headers
        self.body = body
        self.what = what

    def json(self):
        ctype = self.headers.get("content-type", "")
        assert ctype.startswith("application/json"), f"{self.what}: Content-Type {ctype!r}, want application/json"
        try:
            return json.loads(self.body)
        except ValueError:
            raise AssertionError(f"{self.what}: body is not JSON: {self.body[:300]!r}") from None

    def error(self) -> str:
        """The {"error": "..."} every non-200 answer carries."""
        doc = self.json()
        assert isinstance(doc, dict) and isinstance(doc.get("error"), str) and doc["error"], \
            f"{self.what}: {self.status} without {{\"error\": ...}}: {self.body[:300]!r}"
        return doc["error"]

    def __repr__(self):
        return f"<{self.what} -> {self.status} {self.body[:300]!r}>"


def request(s: AdminSluice, method: str, path: str, body: bytes | str | None = None,
            token: str | None = None, headers: dict | None = None,
            timeout: float = HTTP_TIMEOUT) -> Reply:
    host, port = s.admin_addr
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    if isinstance(body, str):
        body = body.encode()
    try:
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
    finally:
        conn.close()
    what = f"{method} {path}"
    assert hdrs.get("connection", "").lower() == "close", f"{what}: no 'Connection: close' in {hdrs}"
    return Reply(r.status, hdrs, data, what)


def get_json(s: AdminSluice, path: str, token: str | None = None):
    r = request(s, "GET", path, token=token)
    assert r.status == 200, r
    return r.json()


def status(s: AdminSluice, token: str | None = None) -> dict:
    return get_json(s, "/status", token=token)


def raw_exchange(addr: tuple[str, int], data: bytes, timeout: float = HTTP_TIMEOUT) -> bytes:
    """Sends `data` from a thread (the server may close before taking it all)
    while reading the answer to EOF. Returns what came back."""
    c = harness.connect(*addr, timeout=timeout)

    def send():
        try:
            c.sendall(data)
        except OSError:
            pass

    t = threading.Thread(target=send, daemon=True)
    t.start()
    buf = bytearray()
    try:
        while True:
            try:
                chunk = c.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            buf += chunk
    finally:
        t.join(timeout)
        c.close()
    return bytes(buf)


def parse_raw(resp: bytes) -> tuple[int, dict[str, str], bytes]:
    m = re.match(rb"HTTP/1\.[01] (\d{3}) [^\r\n]*\r\n", resp)
    assert m, f"not an HTTP response: {resp[:200]!r}"
    head, _, body = resp.partition(b"\r\n\r\n")
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(m.group(1)), headers, body


def assert_error_body(status_code: int, headers: dict[str, str], body: bytes, what: str):
    assert headers.get("connection", "").lower() == "close", f"{what}: no 'Connection: close'"
    assert headers.get("content-type", "").startswith("application/json"), f"{what}: {headers}"
    doc = json.loads(body)
    assert isinstance(doc.get("error"), str) and doc["error"], f"{what}: {status_code} {body!r}"


def server_path(up: str, addr: str, action: str, encode: bool = False) -> str:
    a = urllib.parse.quote(addr, safe="") if encode else addr
    return f"/upstreams/{up}/servers/{a}/{action}"


# --------------------------------------------------------------------------
# Prometheus text
# --------------------------------------------------------------------------

SAMPLE_RX = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?$")
LABEL_RX = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE_RX.match(line)
        assert m, f"unparsable metrics line: {line!r}"
        labels = frozenset(LABEL_RX.findall(m.group(2) or ""))
        key = (m.group(1), labels)
        assert key not in out, f"duplicate series: {line!r}"
        out[key] = float(m.group(3))
    return out


def metric(samples: dict, name: str, **labels) -> float:
    key = (name, frozenset(labels.items()))
    if key not in samples:
        have = [dict(l) for n, l in samples if n == name]
        raise AssertionError(f"no series {name}{labels}; series of that name: {have}")
    return samples[key]


def metrics(s: AdminSluice, token: str | None = None) -> tuple[str, dict]:
    r = request(s, "GET", "/metrics", token=token)
    assert r.status == 200, r
    ctype = r.headers.get("content-type", "")
    assert ctype.startswith("text/plain"), f"/metrics Content-Type {ctype!r}"
    text = r.body.decode()
    return text, parse_metrics(text)


# --------------------------------------------------------------------------
# the proxy side
# --------------------------------------------------------------------------

def proxied(s: harness.Sluice, payload: bytes = b"ping", name: str | None = None) -> tuple[str, int, int]:
    """One session through sluice to a banner backend: reads the banner,
    exchanges `payload`, closes. Returns (banner, bytes sent, bytes received)."""
    c = s.connect(name, timeout=5)
    try:
        banner = harness.recv_line(c)
        c.sendall(payload)
        assert harness.recv_exact(c, len(payload)) == payload
    finally:
        c.close()
    return banner.decode(), len(payload), len(banner) + 1 + len(payload)


def open_to(s: harness.Sluice, want: str, attempts: int = 8) -> socket.socket:
    """A live session whose banner is `want` (others are closed)."""
    for _ in range(attempts):
        c = s.connect(timeout=5)
        if harness.recv_line(c).decode() == want:
            return c
        c.close()
    raise AssertionError(f"no session reached {want} in {attempts} attempts")


def echo_ok(c: socket.socket, msg: bytes = b"still here") -> None:
    c.sendall(msg)
    assert harness.recv_exact(c, len(msg)) == msg


def banners(s: harness.Sluice, n: int) -> list[str]:
    return [proxied(s)[0] for _ in range(n)]


def server_of(doc: dict, up: str, addr: str) -> dict:
    for u in doc["upstreams"]:
        if u["name"] == up:
            for srv in u["servers"]:
                if srv["address"] == addr:
                    return srv
            raise AssertionError(f"upstream {up!r} has no server {addr}: {u['servers']}")
    raise AssertionError(f"no upstream {up!r} in {[u['name'] for u in doc['upstreams']]}")


def listener_of(doc: dict, name: str) -> dict:
    for l in doc["listeners"]:
        if l["name"] == name:
            return l
    raise AssertionError(f"no listener {name!r} in {doc['listeners']}")


def poll(fetch, ok, timeout: float = 5.0, interval: float = 0.05):
    """Fetches until ok(value) (or the deadline); returns the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if ok(value) or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def server_rows(page: str) -> dict[str, dict]:
    """data-server -> {"class", "text"} of each server row of the status page."""
    p = StatusPageRows()
    p.feed(page)
    return p.rows


class Hanging:
    """An admin client that never completes its request (optionally sending
    one more byte every 0.25 s); a thread reads whatever answer comes."""

    def __init__(self, addr: tuple[str, int], first: bytes, trickle: bytes = b""):
        self.sock = harness.connect(*addr, timeout=25)
        self.t0 = time.monotonic()
        self.sock.sendall(first)
        self.answer: bytes | None = None
        self.after: float | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if trickle:
            threading.Thread(target=self._trickle, args=(trickle,), daemon=True).start()

    def _read(self):
        buf = bytearray()
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
        except OSError as e:
            self.error = e
        self.after = time.monotonic() - self.t0
        self.answer = bytes(buf)
        self._stop.set()

    def _trickle(self, data: bytes):
        for i in range(len(data)):
            if self._stop.wait(0.25):
                return
            try:
                self.sock.send(data[i:i + 1])
            except OSError:
                return

    def result(self, within: float = 21.0) -> tuple[bytes | None, float]:
        self._reader.join(max(0.0, self.t0 + within - time.monotonic()))
        return self.answer, self.after if self.after is not None else float("inf")

    def close(self):
        self._stop.set()
        self.sock.close()


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def sluice_version() -> str:
    out = subprocess.run([str(harness.sluice_bin()), "--version"], capture_output=True,
                         stdin=subprocess.DEVNULL, timeout=10)
    m = re.search(r"\d+\.\d+\.\d+\S*", (out.stdout + out.stderr).decode())
    assert m, f"--version printed {out.stdout!r} {out.stderr!r}"
    return m.group(0)


SERVER_FIELDS = {
    "address": str, "weight": int, "effective_weight": (int, float), "backup": bool,
    "state": str, "reason": str, "since_ms": int, "admin": str, "active_check": str,
    "passive": str, "active": int, "total_sessions": int, "failures": int,
    "bytes_in": int, "bytes_out": int, "last_connect_ms": int,
}


# --------------------------------------------------------------------------
# 1. GET /status
# --------------------------------------------------------------------------

def test_status_json_matches_the_sessions_made(admin_sluice, backends):
    a = backends(harness.banner_handler, name="A")
    t_start_ms = time.time() * 1000
    # Two workers: the numbers must be the sum over both.
    s = admin_sluice([listener()], {"up": upstream(a)}, global_={"workers": 2})

    doc = status(s)
    assert doc["version"] == sluice_version()
    assert isinstance(doc["uptime_seconds"], (int, float)) and 0 <= doc["uptime_seconds"] < 60
    assert abs(doc["started_at_ms"] - t_start_ms) < 60_000, doc["started_at_ms"]
    assert doc["config"]["file"] == str(s.config_path)
    assert isinstance(doc["config"]["generation"], int)
    assert abs(doc["config"]["loaded_at_ms"] - t_start_ms) < 60_000
    assert doc["last_reload"]["attempted"] is False, doc["last_reload"]
    assert doc["connections"] == 0
    lst = listener_of(doc, "main")
    assert lst["address"] == "127.0.0.1:%d" % s.port()
    assert (lst["active"], lst["accepted"], lst["bytes_in"], lst["bytes_out"], lst["closed"]) == (0, 0, 0, 0, {})
    [up] = doc["upstreams"]
    assert up["name"] == "up" and up["balance"] == "least_conn"
    srv = server_of(doc, "up", a.address)
    for field, typ in SERVER_FIELDS.items():
        assert field in srv, f"server object lacks {field!r}: {srv}"
        assert isinstance(srv[field], typ) and not (typ is int and isinstance(srv[field], bool)), \
            f"{field} = {srv[field]!r}"
    assert (srv["weight"], srv["backup"], srv["state"], srv["admin"]) == (1, False, "up", "enabled")
    assert (srv["active"], srv["total_sessions"], srv["failures"]) == (0, 0, 0)
    assert srv["since_ms"] == 0, "nothing changed since start"

    # A live session is visible while it lasts.
    c = s.connect(timeout=5)
    assert harness.recv_line(c) == b"A"
    doc = poll(lambda: status(s), lambda d: listener_of(d, "main")["active"] == 1)
    assert listener_of(doc, "main")["active"] == 1
    assert doc["connections"] == 1
    assert server_of(doc, "up", a.address)["active"] == 1
    c.close()
    doc = poll(lambda: status(s), lambda d: listener_of(d, "main")["accepted"] == 1
               and sum(listener_of(d, "main")["closed"].values()) == 1)
    sent, received = 0, 2  # the live session above got "A\n"

    for i in range(4):
        _, out, back = proxied(s, f"hello number {i}".encode() * (i + 1))
        sent += out
        received += back

    def done(d):
        srv = server_of(d, "up", a.address)
        return srv["total_sessions"] == 5 and srv["bytes_out"] == received and d["connections"] == 0 \
            and listener_of(d, "main")["closed"].get("client_closed") == 5

    doc = poll(lambda: status(s), done)
    lst = listener_of(doc, "main")
    srv = server_of(doc, "up", a.address)
    assert lst["accepted"] == 5, lst
    assert lst["active"] == 0 and doc["connections"] == 0, doc
    assert lst["closed"] == {"client_closed": 5}, lst["closed"]
    assert (lst["bytes_in"], lst["bytes_out"]) == (sent, received), lst
    assert srv["total_sessions"] == 5, srv
    assert (srv["bytes_in"], srv["bytes_out"]) == (sent, received), srv
    assert srv["active"] == 0 and srv["failures"] == 0, srv
    assert srv["last_connect_ms"] >= t_start_ms - 1000, srv
    # The access log agrees with the API.
    recs = s.wait_records(5)
    assert sum(int(r["bytes_in"]) for r in recs) == sent
    assert sum(int(r["bytes_out"]) for r in recs) == received

    u1 = status(s)["uptime_seconds"]
    time.sleep(0.3)
    u2 = status(s)["uptime_seconds"]
    assert 0.2 <= u2 - u1 < 5, (u1, u2)


# --------------------------------------------------------------------------
# 2. GET /metrics
# --------------------------------------------------------------------------

def test_metrics_agree_with_the_sessions_and_pass_promtool(admin_sluice, backends):
    a = backends(harness.banner_handler, name="A")
    dead = f"127.0.0.1:{harness.dead_port()}"
    # A is in two upstreams: two series.
    s = admin_sluice([listener(), listener(name="dead", upstream="gone", tries=1),
                      listener(name="twin", upstream="up2")],
                     {"up": upstream(a), "gone": upstream(dead, max_fails=0), "up2": upstream(a)},
                     global_={"workers": 2})
    n = 5
    sent = received = 0
    for i in range(n):
        _, out, back = proxied(s, b"x" * (100 * (i + 1)))
        sent += out
        received += back
    for _ in range(2):
        assert proxied(s, b"twin", name="twin")[0] == "A"
    # One session that cannot connect: a failure, cause connect_failed.
    c = s.connect("dead", timeout=5)
    assert harness.wait_closed(c, timeout=5) in ("eof", "reset")
    c.close()

    srv = {"upstream": "up", "server": a.address}

    def settled(m):
        return m[1].get(("sluice_server_bytes_out_total", frozenset(srv.items()))) == received and \
            m[1].get(("sluice_listener_closed_total",
                      frozenset({"listener": "twin", "cause": "client_closed"}.items()))) == 2 and \
            m[1].get(("sluice_connections", frozenset())) == 0 and \
            m[1].get(("sluice_listener_closed_total",
                      frozenset({"listener": "dead", "cause": "connect_failed"}.items()))) == 1

    text, m = poll(lambda: metrics(s), settled)
    assert metric(m, "sluice_listener_accepted_total", listener="main") == n
    assert metric(m, "sluice_listener_accepted_total", listener="dead") == 1
    assert metric(m, "sluice_listener_closed_total", listener="main", cause="client_closed") == n
    assert metric(m, "sluice_listener_closed_total", listener="dead", cause="connect_failed") == 1
    others = {dict(k[1])["cause"]: v for k, v in m.items() if k[0] == "sluice_listener_closed_total"
              and dict(k[1]).get("listener") == "main" and dict(k[1])["cause"] != "client_closed"}
    assert not any(others.values()), f"causes that did not happen: {others}"
    assert metric(m, "sluice_listener_active_sessions", listener="main") == 0
    assert metric(m, "sluice_listener_bytes_in_total", listener="main") == sent
    assert metric(m, "sluice_listener_bytes_out_total", listener="main") == received
    assert metric(m, "sluice_connections") == 0
    assert metric(m, "sluice_server_sessions_total", **srv) == n
    assert metric(m, "sluice_server_active_sessions", **srv) == 0
    assert metric(m, "sluice_server_failures_total", **srv) == 0
    assert metric(m, "sluice_server_bytes_in_total", **srv) == sent
    assert metric(m, "sluice_server_bytes_out_total", **srv) == received
    assert metric(m, "sluice_server_up", **srv) == 1
    assert metric(m, "sluice_server_weight", **srv) == 1
    assert metric(m, "sluice_server_effective_weight", **srv) == 1
    assert metric(m, "sluice_server_failures_total", upstream="gone", server=dead) == 1
    twin = {"upstream": "up2", "server": a.address}
    assert metric(m, "sluice_server_sessions_total", **twin) == 2
    assert metric(m, "sluice_server_bytes_in_total", **twin) == 2 * len(b"twin")
    assert metric(m, "sluice_server_connect_seconds_count", **twin) == 2
    assert metric(m, "sluice_listener_accepted_total", listener="twin") == 2
    # The connect histogram: one observation per successful connect.
    assert metric(m, "sluice_server_connect_seconds_count", **srv) == n
    total = metric(m, "sluice_server_connect_seconds_sum", **srv)
    assert 0 <= total < n * 1.0, total
    buckets = sorted(((float(dict(k[1])["le"]), v) for k, v in m.items()
                      if k[0] == "sluice_server_connect_seconds_bucket"
                      and {x: y for x, y in k[1] if x != "le"} == srv))
    assert len(buckets) >= 2 and buckets[-1][0] == float("inf"), buckets
    assert buckets[-1][1] == n
    assert all(x[1] <= y[1] for x, y in zip(buckets, buckets[1:])), f"buckets not cumulative: {buckets}"
    # Process gauges.
    version = sluice_version()
    assert metric(m, "sluice_build_info", version=version) == 1
    assert abs(metric(m, "sluice_start_time_seconds") - time.time()) < 60
    doc = status(s)
    assert metric(m, "sluice_config_generation") == doc["config"]["generation"]
    assert metric(m, "sluice_config_last_reload_successful") == 1
    for name in ("sluice_accept_pauses_total", "sluice_local_errors_total"):
        assert metric(m, name) == 0
    # Declared types.
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    for name, typ in [("sluice_listener_accepted_total", "counter"), ("sluice_server_sessions_total", "counter"),
                      ("sluice_listener_closed_total", "counter"), ("sluice_server_up", "gauge"),
                      ("sluice_connections", "gauge"), ("sluice_server_connect_seconds", "histogram"),
                      ("sluice_build_info", "gauge"), ("sluice_reloads_total", "counter")]:
        assert types.get(name) == typ, f"# TYPE {name} is {types.get(name)!r}, want {typ}"

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus); values were checked")
    res = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)
    assert res.returncode == 0, f"promtool check metrics: {res.returncode}\n{res.stdout.decode()}" \
                                f"{res.stderr.decode()}"

    # Counters survive a reload, and the reload is counted.
    s.config_path.write_text(s.config_path.read_text() + "\n# reloaded\n")
    r = request(s, "POST", "/reload")
    assert r.status == 200, r
    _, m2 = metrics(s)
    assert metric(m2, "sluice_listener_accepted_total", listener="main") == n
    assert metric(m2, "sluice_listener_closed_total", listener="main", cause="client_closed") == n
    assert metric(m2, "sluice_server_sessions_total", **srv) == n
    assert metric(m2, "sluice_server_connect_seconds_count", **srv) == n
    assert metric(m2, "sluice_reloads_total", result="ok") == 1
    assert metric(m2, "sluice_config_generation") == doc["config"]["generation"] + 1


# --------------------------------------------------------------------------
# 3. POST /reload
# --------------------------------------------------------------------------

def test_reload_through_the_api(admin_sluice, backends):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = admin_sluice([listener()], {"up": upstream(a)})
    assert proxied(s)[0] == "A"
    gen0 = status(s)["config"]["generation"]

    good = s.render([listener()], {"up": upstream(b)})
    s.config_path.write_text(good)
    r = request(s, "POST", "/reload")
    assert r.status == 200, r
    doc = r.json()
    assert doc["ok"] is True and doc["generation"] == gen0 + 1, doc
    assert isinstance(doc.get("message"), str), doc
    assert banners(s, 3) == ["B"] * 3
    st = status(s)
    assert st["config"]["generation"] == gen0 + 1
    assert st["last_reload"]["attempted"] is True and st["last_reload"]["ok"] is True, st["last_reload"]
    s.log.wait_for(r"reload succeeded")

    # An unknown key on line 2, column 1 ([global] is the first table).
    lines = good.split("\n")
    assert lines[0] == "[global]"
    bad = "\n".join([lines[0], "wrkers = 2"] + lines[1:])
    s.config_path.write_text(bad)
    r = request(s, "POST", "/reload")
    assert r.status == 400, r
    doc = r.json()
    assert doc["ok"] is False, doc
    assert doc["error"].startswith(f"{s.config_path}:2:1: "), doc["error"]
    assert "wrkers" in doc["error"]
    # The running configuration is unchanged and keeps proxying.
    assert banners(s, 3) == ["B"] * 3
    st = status(s)
    assert st["config"]["generation"] == gen0 + 1
    lr = st["last_reload"]
    assert lr["attempted"] is True and lr["ok"] is False, lr
    assert f"{s.config_path}:2:1:" in lr["message"], lr
    assert isinstance(lr["origin"], str) and lr["origin"], lr
    assert abs(lr["time_ms"] - time.time() * 1000) < 60_000, lr
    _, m = metrics(s)
    assert metric(m, "sluice_config_last_reload_successful") == 0
    assert metric(m, "sluice_reloads_total", result="ok") == 1
    assert metric(m, "sluice_reloads_total", result="error") == 1
    s.log.wait_for(r"reload failed")

    # The same through SIGHUP: /status says where the attempt came from.
    s.reload(bad, expect_ok=False)
    lr = status(s)["last_reload"]
    assert (lr["ok"], lr["origin"]) == (False, "SIGHUP"), lr
    assert f"{s.config_path}:2:1:" in lr["message"], lr

    # A syntax error names its place too.
    s.config_path.write_text(good + "\n[[listener]\n")
    r = request(s, "POST", "/reload")
    assert r.status == 400, r
    line = good.count("\n") + 2
    assert re.match(rf"{re.escape(str(s.config_path))}:{line}:\d+: ", r.json()["error"]), r.json()["error"]

    # The admin address changes only with a restart, and the answer says so.
    s.config_path.write_text(s.render([listener()], {"up": upstream(b)},
                                      admin={"listen": f"127.0.0.1:{harness.dead_port()}"}))
    r = request(s, "POST", "/reload")
    assert r.status == 200, r
    assert "restart" in r.json()["message"], r.json()
    assert status(s)["config"]["generation"] == gen0 + 2

    # No file at all.
    moved = s.config_path.with_suffix(".away")
    s.config_path.rename(moved)
    r = request(s, "POST", "/reload")
    assert r.status == 400, r
    assert r.json()["error"].startswith(f"{s.config_path}: "), r.json()
    moved.rename(s.config_path)
    assert banners(s, 2) == ["B"] * 2

    # Fixed again: back to normal.
    s.config_path.write_text(s.render([listener()], {"up": upstream(a)}))
    r = request(s, "POST", "/reload")
    assert r.status == 200 and r.json()["generation"] == gen0 + 3, r
    assert banners(s, 2) == ["A"] * 2
    assert status(s)["last_reload"]["ok"] is True


# --------------------------------------------------------------------------
# 4. PUT /config
# --------------------------------------------------------------------------

def test_put_config_writes_the_file_and_applies_it(admin_sluice, backends):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = admin_sluice([listener()], {"up": upstream(a)})
    assert proxied(s)[0] == "A"
    gen0 = status(s)["config"]["generation"]
    s.wait_records(1)  # the access log exists before the directory is listed
    files_before = set(os.listdir(s.workdir))

    body = "# written through the admin API\n" + s.render([listener()], {"up": upstream(b)})
    r = request(s, "PUT", "/config", body=body, headers={"Content-Type": "application/toml"})
    assert r.status == 200, r
    doc = r.json()
    assert isinstance(doc, dict) and doc.get("ok", True) is True, doc
    assert s.config_path.read_text() == body
    assert banners(s, 3) == ["B"] * 3
    assert status(s)["config"]["generation"] == gen0 + 1
    # Written atomically: no temporary file left beside it; a restart would
    # load the same file.
    assert set(os.listdir(s.workdir)) == files_before, set(os.listdir(s.workdir)) ^ files_before
    res = harness.run_check(s.config_path)
    assert res.returncode == 0, res.stderr.decode()

    # Invalid: a type error at a known line and column of the body.
    lines = body.split("\n")
    i = lines.index("workers = 1")
    lines[i] = 'workers = "x"'
    r = request(s, "PUT", "/config", body="\n".join(lines))
    assert r.status == 400, r
    err = r.error()
    # The body (not the file on disk) with its line and column.
    assert err.startswith(f"PUT /config body:{i + 1}:{len('workers = ') + 1}: "), err
    assert "workers" in err
    assert s.config_path.read_text() == body, "an invalid body touched the file"
    assert banners(s, 2) == ["B"] * 2
    assert status(s)["config"]["generation"] == gen0 + 1

    # Not TOML at all, and empty: refused the same way.
    for bad in ("[[listener]\nname = 1\n", ""):
        r = request(s, "PUT", "/config", body=bad)
        assert r.status == 400, r
        r.error()
        assert s.config_path.read_text() == body
    assert set(os.listdir(s.workdir)) == files_before
    assert banners(s, 2) == ["B"] * 2

    # Just under the 1 MiB limit is fine.
    big = body + "#" + "x" * (1024 * 1024 - len(body) - 100) + "\n"
    r = request(s, "PUT", "/config", body=big)
    assert r.status == 200, r
    assert s.config_path.read_text() == big
    body = big
    gen0 += 1

    # Valid but cannot be applied (a listener address in use): the running
    # configuration and the file stay as they were.
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        clash = "# clash\n" + s.render([listener(), listener(name="extra", listen=f"127.0.0.1:{port}")],
                                       {"up": upstream(a)})
        r = request(s, "PUT", "/config", body=clash)
        assert 400 <= r.status < 600, r
        err = r.error()
        assert str(port) in err, err
    finally:
        taken.close()
    assert s.config_path.read_text() == body, "a configuration that could not be applied was written"
    assert set(os.listdir(s.workdir)) == files_before, set(os.listdir(s.workdir)) ^ files_before
    assert banners(s, 2) == ["B"] * 2
    doc = status(s)
    assert doc["config"]["generation"] == gen0 + 1
    assert [l["name"] for l in doc["listeners"]] == ["main"], doc["listeners"]


# --------------------------------------------------------------------------
# 5. drain, disable, enable, weight
# --------------------------------------------------------------------------

def two_servers(admin_sluice, backends, **up_kw):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = admin_sluice([listener()], {"up": upstream(a, b, balance="round_robin", **up_kw)})
    return s, a, b


def test_drain_keeps_live_sessions_and_enable_restores(admin_sluice, backends):
    s, a, b = two_servers(admin_sluice, backends)
    live = open_to(s, "A")
    try:
        r = request(s, "POST", server_path("up", a.address, "drain"))
        assert r.status == 200, r
        doc = r.json()
        assert doc["address"] == a.address and doc["state"] == "drained", doc
        echo_ok(live)
        assert banners(s, 6) == ["B"] * 6
        echo_ok(live)
        srv = server_of(status(s), "up", a.address)
        assert srv["state"] == "drained" and srv["active"] == 1, srv
        assert srv["since_ms"] > 0, srv
        _, m = metrics(s)
        assert metric(m, "sluice_server_up", upstream="up", server=a.address) == 0

        # Percent-encoded address works the same.
        r = request(s, "POST", server_path("up", a.address, "enable", encode=True))
        assert r.status == 200, r
        assert r.json()["state"] == "up"
        got = banners(s, 6)
        assert "A" in got and "B" in got, got
        echo_ok(live)
    finally:
        live.close()
    recs = s.wait_records(13)
    assert {r["cause"] for r in recs} == {"client_closed"}, recs


def test_disable_closes_live_sessions(admin_sluice, backends):
    s, a, b = two_servers(admin_sluice, backends)
    live_a = open_to(s, "A")
    live_b = open_to(s, "B")
    try:
        r = request(s, "POST", server_path("up", a.address, "disable"))
        assert r.status == 200, r
        assert r.json()["state"] == "disabled", r.json()
        harness.wait_closed(live_a, timeout=5)
        echo_ok(live_b)
        recs = s.wait_records(1, pred=lambda r: r["cause"] == "server_drained")
        assert [r["server"] for r in recs] == [a.address], recs
        assert banners(s, 4) == ["B"] * 4
        doc = poll(lambda: status(s), lambda d: server_of(d, "up", a.address)["active"] == 0)
        assert listener_of(doc, "main")["closed"].get("server_drained") == 1, listener_of(doc, "main")
        srv = server_of(doc, "up", a.address)
        assert srv["state"] == "disabled" and srv["active"] == 0, srv
        _, m = metrics(s)
        assert metric(m, "sluice_listener_closed_total", listener="main", cause="server_drained") == 1

        r = request(s, "POST", server_path("up", a.address, "enable"))
        assert r.status == 200 and r.json()["state"] == "up", r
        got = banners(s, 4)
        assert "A" in got, got
        echo_ok(live_b)
    finally:
        live_a.close()
        live_b.close()


def test_weight_changes_and_bad_weights(admin_sluice, backends):
    s, a, b = two_servers(admin_sluice, backends)
    r = request(s, "PUT", server_path("up", a.address, "weight"), body="3")
    assert r.status == 200, r
    assert r.json()["weight"] == 3, r.json()
    assert server_of(status(s), "up", a.address)["weight"] == 3
    r = request(s, "PUT", server_path("up", a.address, "weight"), body='{"weight":5}')
    assert r.status == 200 and r.json()["weight"] == 5, r
    _, m = metrics(s)
    assert metric(m, "sluice_server_weight", upstream="up", server=a.address) == 5
    assert metric(m, "sluice_server_effective_weight", upstream="up", server=a.address) == 5
    assert server_of(status(s), "up", a.address)["effective_weight"] == 5
    got = banners(s, 12)
    assert got.count("A") >= 2 * got.count("B"), f"weight 5:1 not in effect: {got}"

    for bad in ("0", "5000", "1001", "abc", "", "-1", "2.5", '{"weight":0}', '{"weight":1001}'):
        r = request(s, "PUT", server_path("up", a.address, "weight"), body=bad)
        assert r.status == 400, (bad, r)
        r.error()
    assert server_of(status(s), "up", a.address)["weight"] == 5
    assert server_of(status(s), "up", b.address)["weight"] == 1
    # A chunked body is still a body (http-parser decodes it).
    code, _, body = parse_raw(raw_exchange(s.admin_addr, (
        "PUT %s HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n4\r\n0\r\n\r\n"
        % server_path("up", b.address, "weight")).encode()))
    assert code == 200 and json.loads(body)["weight"] == 4, (code, body)
    assert server_of(status(s), "up", b.address)["weight"] == 4
    # Weight is PUT only.
    r = request(s, "POST", server_path("up", a.address, "weight"), body="3")
    assert r.status == 405, r
    assert "PUT" in r.headers.get("allow", ""), r.headers


def test_runtime_state_survives_reload(admin_sluice, backends):
    s, a, b = two_servers(admin_sluice, backends)
    gen0 = status(s)["config"]["generation"]
    # A session on A that lives through every reload below: it holds the
    # first configuration, and with it A's old state, until the end.
    live = open_to(s, "A")
    assert request(s, "POST", server_path("up", a.address, "drain")).status == 200
    assert request(s, "PUT", server_path("up", b.address, "weight"), body="7").status == 200

    # The same file with a comment more: a new generation, the same servers.
    s.config_path.write_text(s.config_path.read_text() + "\n# reloaded\n")
    r = request(s, "POST", "/reload")
    assert r.status == 200 and r.json()["generation"] == gen0 + 1, r
    doc = status(s)
    assert server_of(doc, "up", a.address)["state"] == "drained"
    assert server_of(doc, "up", b.address)["weight"] == 7
    assert banners(s, 5) == ["B"] * 5

    # The file changes B's weight: the runtime weight gives way to it.
    s.config_path.write_text(s.render([listener()], {"up": upstream(a, b, balance="round_robin",
                                                                    weights=[1, 2])}))
    assert request(s, "POST", "/reload").status == 200
    doc = status(s)
    assert server_of(doc, "up", b.address)["weight"] == 2
    assert server_of(doc, "up", a.address)["state"] == "drained"

    # Removed by a reload, the drain is forgotten.
    s.config_path.write_text(s.render([listener()], {"up": upstream(b, balance="round_robin")}))
    assert request(s, "POST", "/reload").status == 200
    r = request(s, "POST", server_path("up", a.address, "enable"))
    assert r.status == 404, r
    s.config_path.write_text(s.render([listener()], {"up": upstream(a, b, balance="round_robin")}))
    assert request(s, "POST", "/reload").status == 200
    assert server_of(status(s), "up", a.address)["state"] == "up"
    assert "A" in banners(s, 4)
    echo_ok(live)  # never cut by the reloads
    live.close()


def test_unknown_paths_and_wrong_methods(admin_sluice, backends):
    a = backends(harness.banner_handler, name="A")
    servers = [a]
    v6 = None
    if harness.ipv6_available():
        v6 = backends(harness.banner_handler, name="V6", host="::1")
        servers.append(v6)
    s = admin_sluice([listener()], {"up": upstream(*servers)})

    cases = [
        ("POST", server_path("nope", a.address, "drain"), 404),
        ("POST", server_path("up", f"127.0.0.1:{harness.dead_port()}", "drain"), 404),
        ("POST", server_path("up", "not-an-address", "drain"), 404),
        ("POST", server_path("up", a.address, "explode"), 404),
        ("GET", "/nothing-here", 404),
        ("GET", "/statusx", 404),
        ("GET", server_path("up", a.address, "drain"), 405),
        ("DELETE", server_path("up", a.address, "enable"), 405),
        ("GET", "/reload", 405),
        ("GET", "/config", 405),
        ("POST", "/status", 405),
        ("POST", "/metrics", 405),
        ("PUT", "/", 405),
    ]
    allow = {"/reload": "POST", "/config": "PUT", "/status": "GET", "/metrics": "GET", "/": "GET"}
    for method, path, want in cases:
        r = request(s, method, path)
        assert r.status == want, r
        r.error()
        if want == 405:
            key = path if path in allow else None
            expected = allow[key] if key else ("PUT" if path.endswith("/weight") else "POST")
            assert expected in r.headers.get("allow", ""), (r, r.headers)

    # Percent-encoded or not, both name the same server.
    for encode in (False, True):
        r = request(s, "POST", server_path("up", a.address, "drain", encode=encode))
        assert r.status == 200 and r.json()["address"] == a.address, r
        r = request(s, "POST", server_path("up", a.address, "enable", encode=encode))
        assert r.status == 200 and r.json()["state"] == "up", r
    if v6 is not None:
        assert v6.address.startswith("[::1]:")
        for encode in (False, True):
            r = request(s, "POST", server_path("up", v6.address, "drain", encode=encode))
            assert r.status == 200 and r.json()["address"] == v6.address, r
        assert banners(s, 3) == ["A"] * 3
    # Nothing above hurt the proxy.
    assert proxied(s)[0] in ("A", "V6")
    assert server_of(status(s), "up", a.address)["state"] == "up"


def test_status_page_lists_every_server(admin_sluice, backends):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = admin_sluice([listener()], {"up": upstream(a, b)})
    assert request(s, "POST", server_path("up", b.address, "drain")).status == 200
    r = request(s, "GET", "/")
    assert r.status == 200, r
    assert r.headers.get("content-type", "").startswith("text/html"), r.headers
    page = r.body.decode()
    rows = server_rows(page)
    assert set(rows) == {a.address, b.address}, rows
    assert "state-up" in rows[a.address]["class"].split(), rows
    assert "state-drained" in rows[b.address]["class"].split(), rows
    assert "drained" in rows[b.address]["text"], rows
    # It refreshes every 5 s: by its script, or without one by <meta refresh>.
    assert re.search(r'<noscript><meta http-equiv="refresh" content="5', page, re.I), "no 5 s refresh"
    assert "setTimeout" in page and "5000" in page, "no scripted 5 s refresh"
    assert not re.search(r"<script[^>]*\bsrc=", page, re.I), "external script"
    assert not re.search(r'(src|href)="(https?:)?//', page), "external asset"

    # Text from the file (here, in a reload error) is escaped on the page.
    good = s.config_path.read_text()
    lines = good.split("\n")
    s.config_path.write_text("\n".join([lines[0], '"<b id=x>bold</b>" = 1'] + lines[1:]))
    r = request(s, "POST", "/reload")
    assert r.status == 400 and "bold" in r.json()["error"], r
    page = request(s, "GET", "/").body.decode()
    assert "bold" in page, "the failed reload is not on the page"
    assert "<b id=x>" not in page, "file contents reach the page unescaped"


def test_drain_is_per_upstream(admin_sluice, backends):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = admin_sluice([listener(), listener(name="other", upstream="up2")],
                     {"up": upstream(a, b), "up2": upstream(a)})
    assert request(s, "POST", server_path("up", a.address, "drain")).status == 200
    assert banners(s, 3) == ["B"] * 3
    assert proxied(s, name="other")[0] == "A"
    doc = status(s)
    assert server_of(doc, "up", a.address)["state"] == "drained"
    assert server_of(doc, "up2", a.address)["state"] == "up"
    r = request(s, "PUT", server_path("up2", a.address, "weight"), body="9")
    assert r.status == 200, r
    doc = status(s)
    assert server_of(doc, "up2", a.address)["weight"] == 9
    assert server_of(doc, "up", a.address)["weight"] == 1


# --------------------------------------------------------------------------
# 6. authentication
# --------------------------------------------------------------------------

def test_token_is_required_when_configured(admin_sluice, backends, tmp_path):
    a = backends(harness.banner_handler, name="A")
    token_file = tmp_path / "admin.token"
    token_file.write_text("  s3cret-Tok3n\n")
    s = admin_sluice([listener()], {"up": upstream(a)},
                     admin={"listen": "127.0.0.1:0", "token_file": str(token_file)})

    r = request(s, "GET", "/status")
    assert r.status == 401, r
    assert r.headers.get("www-authenticate", "").startswith("Bearer"), r.headers
    r.error()
    # No credentials at all is what a browser sends before its login: info.
    s.log.wait_for(r"\[info\] admin: a request without credentials from 127\.0\.0\.1:\d+", timeout=5)
    assert request(s, "GET", "/status", token="wrong").status == 401
    s.log.wait_for(r"\[warning\] admin: unauthorized request from 127\.0\.0\.1:\d+", timeout=5)
    for path in ("/metrics", "/", "/reload"):
        assert request(s, "GET" if path != "/reload" else "POST", path).status == 401
    for auth in ("Bearer wrong", "Bearer s3cret-Tok3n-and-more", "Bearer s3cret-tok3n",
                 "Basic s3cret-Tok3n", "s3cret-Tok3n", "Bearer"):
        r = request(s, "GET", "/status", headers={"Authorization": auth})
        assert r.status == 401, (auth, r)
    # Unauthorized drain does nothing.
    assert request(s, "POST", server_path("up", a.address, "drain")).status == 401
    assert request(s, "POST", server_path("up", a.address, "drain"), token="nope").status == 401

    assert status(s, token="s3cret-Tok3n")["listeners"][0]["name"] == "main"
    assert server_of(status(s, token="s3cret-Tok3n"), "up", a.address)["state"] == "up"
    metrics(s, token="s3cret-Tok3n")
    assert request(s, "GET", "/", token="s3cret-Tok3n").status == 200
    assert request(s, "GET", "/status", headers={"authorization": "Bearer s3cret-Tok3n"}).status == 200

    # The warning is rate-limited: a burst does not flood the log.
    before = len(s.log.matches(r"admin: unauthorized request"))
    for _ in range(50):
        assert request(s, "GET", "/status", token="bad").status == 401
    time.sleep(0.2)
    logged = len(s.log.matches(r"admin: unauthorized request")) - before
    assert logged <= 10, f"{logged} warnings for 50 unauthorized requests"

    # The token is read again on reload.
    token_file.write_text("new-token\n")
    r = request(s, "POST", "/reload", token="s3cret-Tok3n")
    assert r.status == 200, r
    assert request(s, "GET", "/status", token="s3cret-Tok3n").status == 401
    assert request(s, "GET", "/status", token="new-token").status == 200
    assert proxied(s)[0] == "A"


def test_public_admin_listen_needs_a_token(tmp_path, backends):
    a = backends(harness.banner_handler, name="A")
    base = harness.render_config(default_global(tmp_path / "access.log"), [listener()], {"up": upstream(a)})
    bad = tmp_path / "public.toml"
    bad.write_text('[admin]\nlisten = "0.0.0.0:0"\n\n' + base)
    res = harness.run_check(bad)
    out = (res.stdout + res.stderr).decode()
    assert res.returncode == 1, out
    assert f"{bad}:2:10: [admin]:" in out, out
    assert "token_file" in out, out

    token = tmp_path / "t.token"
    token.write_text("tok\n")
    good = tmp_path / "public-with-token.toml"
    good.write_text(f'[admin]\nlisten = "0.0.0.0:0"\ntoken_file = "{token}"\n\n' + base)
    res = harness.run_check(good)
    assert res.returncode == 0, (res.stdout + res.stderr).decode()

    empty = tmp_path / "empty.token"
    empty.write_text(" \n")
    bad2 = tmp_path / "empty-token.toml"
    bad2.write_text(f'[admin]\nlisten = "127.0.0.1:0"\ntoken_file = "{empty}"\n\n' + base)
    res = harness.run_check(bad2)
    assert res.returncode == 1 and f"{bad2}:3:14:" in (res.stdout + res.stderr).decode(), res


# --------------------------------------------------------------------------
# 7. hostile clients
# --------------------------------------------------------------------------

def test_hostile_admin_clients_never_reach_the_proxy(admin_sluice, backends):
    a = backends(harness.banner_handler, name="A")
    s = admin_sluice([listener()], {"up": upstream(a)})
    assert proxied(s)[0] == "A"
    status(s)
    base_fds = fd_count(s.pid)
    body_before = s.config_path.read_text()

    # A slow client: half a request, then silence. It must get 408 once its
    # headers are 3 s late (10 s when only its body is missing); meanwhile
    # everything else goes on. Both count from accept: a client that trickles
    # a byte now and then gets the same.
    hanging = {
        "half a request": Hanging(s.admin_addr, b"GET /status HTTP/1.1\r\nHost: x\r\n"),
        "a trickle": Hanging(s.admin_addr, b"GET /status HTTP/1.1\r\n", trickle=b"X-Slow: " + b"a" * 200),
        "a missing body": Hanging(s.admin_addr, b"PUT /upstreams/up/servers/%s/weight HTTP/1.1\r\n"
                                  b"Host: 127.0.0.1\r\nContent-Length: 10\r\n\r\n3" % a.address.encode()),
    }
    assert status(s)["listeners"][0]["name"] == "main"
    assert proxied(s)[0] == "A"

    # 70 KiB of headers.
    head = b"GET /status HTTP/1.1\r\nHost: x\r\n" + \
        b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 1000) for i in range(70)) + b"\r\n"
    code, hdrs, body = parse_raw(raw_exchange(s.admin_addr, head))
    assert code == 431, (code, body[:200])
    assert_error_body(code, hdrs, body, "70 KiB of headers")

    # Garbage.
    for junk in (b"\x00\xffGARBAGE\r\n\r\n", b"GET /status HTTP/1.1\r\nContent-Length: -1\r\n\r\n"):
        code, hdrs, body = parse_raw(raw_exchange(s.admin_addr, junk))
        assert code == 400, (junk, code, body[:200])
        assert_error_body(code, hdrs, body, repr(junk))

    # One request per connection: a second one sent along is not answered.
    resp = raw_exchange(s.admin_addr, b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n"
                                      b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert resp.count(b"HTTP/1.1 ") == 1 and b"sluice_build_info" not in resp, resp[:300]
    code, hdrs, body = parse_raw(resp)
    assert code == 200 and json.loads(body)["listeners"][0]["name"] == "main"

    # A body over 1 MiB.
    big = b"x" * (1024 * 1024 + 65536)
    code, hdrs, body = parse_raw(raw_exchange(
        s.admin_addr, b"PUT /config HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % len(big) + big))
    assert code == 413, (code, body[:200])
    assert_error_body(code, hdrs, body, "1 MiB + 64 KiB body")
    assert s.config_path.read_text() == body_before

    def slow_client_answered(what: str, within: tuple[float, float]):
        h = hanging.pop(what)
        try:
            answer, waited = h.result()
        finally:
            h.close()
        assert answer, f"{what}: never answered (or closed without an answer: {h.error!r})"
        code, hdrs, body = parse_raw(answer)
        assert code == 408, (what, code, body[:200])
        assert_error_body(code, hdrs, body, what)
        assert within[0] <= waited <= within[1], f"{what}: 408 after {waited:.1f}s, want {within}"

    # Headers late: answered before the crowd below would close them to make room.
    slow_client_answered("half a request", (2.5, 7.0))
    slow_client_answered("a trickle", (2.5, 7.0))

    # 200 admin connections at once: at most 64 are kept, the oldest idle
    # ones are closed to make room; the proxy does not notice. The client
    # whose headers are in and whose body is late keeps its place.
    socks: list[socket.socket] = []
    refused = 0
    for _ in range(200):
        try:
            socks.append(harness.connect(*s.admin_addr, timeout=5))
        except OSError:
            refused += 1
    try:
        assert proxied(s)[0] == "A"
        closed: set[int] = set()
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and len(closed) + refused < 200 - 64:
            for i, c in enumerate(socks):
                if i in closed:
                    continue
                c.setblocking(False)
                try:
                    if c.recv(4096) == b"":
                        closed.add(i)
                except BlockingIOError:
                    pass
                except OSError:
                    closed.add(i)
            time.sleep(0.05)
        kept = len(socks) - len(closed)
        assert kept <= 64, f"{kept} of 200 admin connections still open (limit 64)"
        assert proxied(s)[0] == "A"
    finally:
        for c in socks:
            c.close()

    # The body that never came.
    slow_client_answered("a missing body", (9.0, 13.0))
    assert request(s, "GET", server_path("up", a.address, "weight")).status == 405
    assert server_of(status(s), "up", a.address)["weight"] == 1

    # The limits are not lower than documented either: 60 KiB of headers
    # pass, and with 63 idle connections open a 64th is served.
    head = b"GET /status HTTP/1.1\r\nHost: x\r\n" + \
        b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 1000) for i in range(60)) + b"\r\n"
    code, _, body = parse_raw(raw_exchange(s.admin_addr, head))
    assert code == 200, (code, body[:200])
    idle = [harness.connect(*s.admin_addr, timeout=5) for _ in range(63)]
    try:
        time.sleep(0.2)
        r = request(s, "GET", "/status")
        assert r.status == 200, r
    finally:
        for c in idle:
            c.close()

    # After all this: alive, proxying, answering, and no descriptor leaked.
    assert s.running()
    assert proxied(s)[0] == "A"
    assert status(s)["listeners"][0]["accepted"] >= 5
    fds = poll(lambda: fd_count(s.pid), lambda n: n <= base_fds + 2)
    assert fds <= base_fds + 2, f"{fds} descriptors, {base_fds} before the hostile clients"


def test_route_check_and_duration_metrics_pass_promtool(admin_sluice, backends):
    """Per-route sessions and bytes (the configured routes, never the client's
    names), session durations per listener and checks per server, and the
    GET /upstreams/U[/servers/ADDR] documents that agree with them."""
    import ssl

    a = backends(harness.banner_handler, name="A")
    s = admin_sluice([listener(name="tls", upstream=None, preread="tls", default_upstream="up",
                               routes=[{"sni": "db.example.com", "upstream": "up"},
                                       {"sni": "*.example.org", "upstream": "up"}])],
                     {"up": upstream(a, health={"type": "tcp", "interval": "200ms", "timeout": "3s"})})
    # A ClientHello for db.example.com: routed by its route, whatever the
    # handshake then makes of a server that is not TLS.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    c = s.connect("tls", timeout=5)
    try:
        with ctx.wrap_socket(c, server_hostname="db.example.com") as t:
            t.recv(1)
    except (ssl.SSLError, OSError):
        pass
    c.close()
    # Names no route has: all on the default route, no series of their own.
    for name in (b"plain\n", b"again\n"):
        c = s.connect("tls", timeout=5)
        c.sendall(name)
        assert harness.recv_line(c) == b"A"
        assert harness.recv_line(c) + b"\n" == name  # the echo: every byte has been delivered
        c.close()

    srv = {"upstream": "up", "server": a.address}
    route = {"listener": "tls", "upstream": "up"}

    def settled(m):
        return m[1].get(("sluice_connections", frozenset())) == 0 and \
            m[1].get(("sluice_server_check_success", frozenset(srv.items()))) == 1

    text, m = poll(lambda: metrics(s), settled, timeout=20)
    assert metric(m, "sluice_route_sessions_total", route="db.example.com", **route) == 1
    assert metric(m, "sluice_route_sessions_total", route="*.example.org", **route) == 0
    assert metric(m, "sluice_route_sessions_total", route="(default)", **route) == 2
    assert metric(m, "sluice_route_bytes_in_total", route="(default)", **route) == len(b"plain\nagain\n")
    assert metric(m, "sluice_route_bytes_out_total", route="(default)", **route) == \
        2 * len(b"A\n") + len(b"plain\nagain\n")
    routes = {dict(k[1])["route"] for k in m if k[0] == "sluice_route_sessions_total"}
    assert routes == {"db.example.com", "*.example.org", "(default)"}, routes
    assert metric(m, "sluice_listener_session_seconds_count", listener="tls") == 3
    assert metric(m, "sluice_listener_session_seconds_bucket", listener="tls", le="+Inf") == 3
    assert metric(m, "sluice_server_check_success", **srv) == 1
    assert metric(m, "sluice_server_check_failures_total", **srv) == 0
    assert metric(m, "sluice_server_check_seconds_count", **srv) >= 1
    assert metric(m, "sluice_server_peak_sessions", **srv) >= 1
    assert metric(m, "sluice_server_downtime_seconds_total", **srv) >= 0
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    for name, typ in [("sluice_listener_session_seconds", "histogram"), ("sluice_server_check_seconds", "histogram"),
                      ("sluice_route_sessions_total", "counter"), ("sluice_server_check_success", "gauge")]:
        assert types.get(name) == typ, f"# TYPE {name} is {types.get(name)!r}, want {typ}"

    doc = get_json(s, "/upstreams/up")
    assert doc["name"] == "up" and [x["address"] for x in doc["servers"]] == [a.address], doc
    one = get_json(s, f"/upstreams/up/servers/{urllib.parse.quote(a.address, safe='')}")
    assert one["last_check"]["type"] == "tcp" and one["last_check"]["result"] == "pass", one
    assert one["total_sessions"] == 3 and one["peak_active"] >= 1, one
    tls = status(s)["listeners"][0]
    assert [r["sni"] for r in tls["routes"]] == ["db.example.com", "*.example.org"], tls
    assert tls["default_route"]["sessions"] == 2, tls
    assert request(s, "GET", "/upstreams/nope").status == 404
    assert request(s, "GET", "/upstreams/up/servers/127.0.0.1:1").status == 404

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus); values were checked")
    res = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)
    assert res.returncode == 0, f"promtool check metrics: {res.returncode}\n{res.stdout.decode()}" \
                                f"{res.stderr.decode()}"
