"""A graceful stop that meets a second signal, an admin action or a health
event, and reloads that change what only a restart may change (the admin
API's listener and token), an upstream's drain_timeout = "0s", and the error
log's level and destination. Each test reproduces a reported trigger with
real processes on loopback."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import time
from pathlib import Path

import pytest

import harness
from fixtures import default_global
from harness import listener, upstream

ADMIN_RX = r"admin API listening on (?P<addr>\S+)"
WORKER_DONE_RX = r"worker \d+: stopped"


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

class Started:
    """A sluice started from a whole configuration text (with [admin] when
    asked), stopped at the end of the test."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.all: list[harness.Sluice] = []

    def start(self, text: str, listeners: list[str], admin: bool = False, name: str = "s") -> harness.Sluice:
        s = harness.Sluice(self.tmp_path, text, listeners, name=name,
                           access_log=self.tmp_path / f"{name}.access.log")
        self.all.append(s)
        s.start()
        if admin:
            m = s.log.wait_for(ADMIN_RX, timeout=harness.START_TIMEOUT)
            s.admin_addr = harness.split_addr(m.group("addr"))
        return s


@pytest.fixture
def started(tmp_path):
    st = Started(tmp_path)
    yield st
    for s in st.all:
        s.stop()


def config_text(tmp_path: Path, name: str, listeners, upstreams, admin: dict | None = None, **global_) -> str:
    g = default_global(tmp_path / f"{name}.access.log")
    g.update(global_)
    text = harness.render_config(g, listeners, upstreams)
    if admin is not None:
        text += "\n[admin]\n" + "".join(f"{k} = {harness._toml_value(v)}\n" for k, v in admin.items())
    return text


def admin_request(s, method: str, path: str, token: str | None = None, body: bytes | None = None):
    host, port = s.admin_addr
    conn = http.client.HTTPConnection(host, port, timeout=harness.EVENT_TIMEOUT)
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def held_session(s, listener_name: str | None = None) -> socket.socket:
    """A session through `s` that has reached its (echo) server."""
    c = s.connect(listener_name)
    c.sendall(b"ping")
    assert harness.recv_exact(c, 4) == b"ping"
    return c


def still_echoes(c: socket.socket) -> bool:
    try:
        c.sendall(b"again")
        return harness.recv_exact(c, 5) == b"again"
    except (OSError, AssertionError):
        return False


# --------------------------------------------------------------------------
# 1. A graceful stop with workers whose loops have ended
# --------------------------------------------------------------------------

def stopping_with_idle_workers(sluice, backends, workers: int = 4, **kw):
    """Starts `workers` workers, holds one session, sends SIGTERM and waits
    until every worker but the session's has ended its loop."""
    be = backends()
    extra = kw.pop("upstream_extra", {})
    s = sluice([listener()], {"up": upstream(be, **extra)},
               global_={"workers": workers, "shutdown_timeout": "30s", "log_level": "debug", **kw})
    c = held_session(s)
    s.signal(signal.SIGTERM)
    s.log.wait_for(r"stopped accepting; waiting for 1 session")
    s.log.wait_for(WORKER_DONE_RX, count=workers - 1)
    return s, be, c


def test_second_sigterm_during_a_stop_closes_every_session_and_exits_0(sluice, backends):
    s, _, c = stopping_with_idle_workers(sluice, backends)
    s.signal(signal.SIGTERM)
    assert s.wait_exit(harness.EVENT_TIMEOUT) == 0, s.log.text()
    assert harness.wait_closed(c) in ("eof", "reset")
    c.close()
    recs = s.wait_records(1)
    assert [r["cause"] for r in recs] == ["shutdown"], recs
    # The process has exited, but its last lines may still be on their way
    # through the pipe: wait for the line (it fails if it never comes).
    s.log.wait_for(r"received SIGTERM again: closing every session now")


def test_admin_disable_during_a_stop(started, backends, tmp_path):
    be = backends()
    text = config_text(tmp_path, "s", [listener()], {"up": upstream(be)}, admin={"listen": "127.0.0.1:0"},
                       workers=4, shutdown_timeout="30s", log_level="debug")
    s = started.start(text, ["main"], admin=True)
    c = held_session(s)
    s.signal(signal.SIGTERM)
    s.log.wait_for(r"stopped accepting; waiting for 1 session")
    s.log.wait_for(WORKER_DONE_RX, count=3)
    status, body = admin_request(s, "POST", f"/upstreams/up/servers/{be.address}/disable")
    assert status == 200, body
    assert harness.wait_closed(c) in ("eof", "reset")
    c.close()
    assert s.wait_exit(harness.EVENT_TIMEOUT) == 0, s.log.text()
    recs = s.wait_records(1)
    assert [r["cause"] for r in recs] == ["server_drained"], recs


def test_health_on_down_during_a_stop(sluice, backends):
    # The check probes its own port, so that it can fail while the session's
    # server stays.
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    probe.bind(("127.0.0.1", 0))
    probe.listen(64)
    health = {"type": "tcp", "port": probe.getsockname()[1], "interval": "100ms", "timeout": "500ms",
              "fall": 1, "rise": 1, "jitter": "0%", "on_down": "close_sessions"}
    try:
        s, be, c = stopping_with_idle_workers(sluice, backends, upstream_extra={"health": health})
    finally:
        probe.close()
    s.log.wait_for(r"marked down \(active check\)")
    assert harness.wait_closed(c) in ("eof", "reset")
    c.close()
    assert s.wait_exit(harness.EVENT_TIMEOUT) == 0, s.log.text()
    recs = s.wait_records(1)
    assert [r["cause"] for r in recs] == ["server_down"], recs


# --------------------------------------------------------------------------
# 2. The admin API's token stays in force until a restart
# --------------------------------------------------------------------------

def reload_by_signal(s, text: str) -> str:
    """Writes `text`, sends SIGHUP, returns the outcome line."""
    return s.reload(text).group(0)


@pytest.fixture
def token_sluice(started, backends, tmp_path):
    be = backends()
    token = tmp_path / "token"
    token.write_text("first-secret\n")

    def text(admin: dict | None, **g):
        return config_text(tmp_path, "s", [listener()], {"up": upstream(be)}, admin=admin, **g)

    admin = {"listen": "127.0.0.1:0", "token_file": str(token)}
    s = started.start(text(admin), ["main"], admin=True)
    assert admin_request(s, "GET", "/status")[0] == 401
    assert admin_request(s, "GET", "/status", token="first-secret")[0] == 200
    return s, text, admin


def test_reload_without_admin_table_keeps_the_token(token_sluice):
    s, text, _ = token_sluice
    line = reload_by_signal(s, text(None))
    assert "restart" in line and "admin" in line, line
    s.log.wait_for(r"take effect only after a restart: .*admin")
    for path in ("/status", "/metrics"):
        assert admin_request(s, "GET", path)[0] == 401, path
    assert admin_request(s, "POST", "/upstreams/up/servers/127.0.0.1:1/disable")[0] == 401
    assert admin_request(s, "PUT", "/config", body=text(None).encode())[0] == 401
    assert admin_request(s, "GET", "/status", token="first-secret")[0] == 200


def test_reload_without_token_file_keeps_the_token(token_sluice):
    s, text, admin = token_sluice
    line = reload_by_signal(s, text({"listen": admin["listen"]}))
    assert "token_file" in line, line
    assert admin_request(s, "GET", "/status")[0] == 401
    assert admin_request(s, "GET", "/status", token="first-secret")[0] == 200


def test_post_reload_answer_lists_what_waits_for_a_restart(token_sluice):
    s, text, admin = token_sluice
    s.config_path.write_text(text(None, workers=3))
    status, body = admin_request(s, "POST", "/reload", token="first-secret")
    assert status == 200, body
    doc = json.loads(body)
    assert doc["ok"] is True
    assert sorted(doc["restart_required"]) == ["admin", "global.workers"], doc
    assert admin_request(s, "GET", "/status")[0] == 401
    # A reload that changes nothing restart-only says so with an empty list.
    s.config_path.write_text(text(admin))
    status, body = admin_request(s, "POST", "/reload", token="first-secret")
    assert status == 200, body
    assert json.loads(body)["restart_required"] == [], body


def test_put_config_answer_lists_what_waits_for_a_restart(token_sluice):
    s, text, admin = token_sluice
    status, body = admin_request(s, "PUT", "/config", token="first-secret",
                        body=text({"listen": "127.0.0.1:0"}).encode())
    assert status == 200, body
    assert json.loads(body)["restart_required"] == ["admin.token_file"], body
    assert admin_request(s, "GET", "/status")[0] == 401


def test_reload_may_change_the_token_while_the_listener_stays(token_sluice, tmp_path):
    s, text, admin = token_sluice
    other = tmp_path / "token2"
    other.write_text("second-secret")
    reload_by_signal(s, text({**admin, "token_file": str(other)}))
    assert admin_request(s, "GET", "/status", token="first-secret")[0] == 401
    assert admin_request(s, "GET", "/status", token="second-secret")[0] == 200
    assert admin_request(s, "GET", "/status")[0] == 401


def test_new_token_with_a_new_listener_waits_for_a_restart(token_sluice, tmp_path):
    s, text, admin = token_sluice
    other = tmp_path / "token2"
    other.write_text("second-secret")
    line = reload_by_signal(s, text({"listen": "127.0.0.2:0", "token_file": str(other)}))
    assert "admin.listen" in line and "admin.token_file" in line, line
    assert admin_request(s, "GET", "/status", token="second-secret")[0] == 401
    assert admin_request(s, "GET", "/status", token="first-secret")[0] == 200


def test_admin_added_by_a_reload_waits_for_a_restart(sluice, backends, tmp_path):
    be = backends()
    s = sluice([listener()], {"up": upstream(be)})
    text = config_text(tmp_path, "sluice1", [listener()], {"up": upstream(be)}, admin={"listen": "127.0.0.1:0"})
    line = reload_by_signal(s, text)
    assert "restart" in line and "admin" in line, line
    assert not s.log.matches(ADMIN_RX)


# --------------------------------------------------------------------------
# 7. An upstream's drain_timeout = "0s" wins over [global] drain_timeout
# --------------------------------------------------------------------------

def test_upstream_drain_timeout_zero_lets_sessions_finish(sluice, backends, tmp_path):
    a1, a2, b1, b2 = backends(), backends(), backends(), backends()
    listeners = [listener("keep", upstream="keep"), listener("inherit", upstream="inherit")]
    g = {"drain_timeout": "300ms"}
    s = sluice(listeners, {"keep": upstream(a1, drain_timeout="0s"), "inherit": upstream(b1)}, global_=g)
    keep = held_session(s, "keep")
    inherit = held_session(s, "inherit")
    try:
        new = config_text(tmp_path, "sluice1", listeners,
                          {"keep": upstream(a2, drain_timeout="0s"), "inherit": upstream(b2)}, **g)
        s.reload(new)
        s.log.wait_for(rf"upstream \"keep\" server {a1.address} removed; its 1 session\(s\) continue")
        # The inherited 300 ms apply to the other upstream: once its session
        # is cut, so would be this one (the same timer, 30 ms of spread).
        recs = s.wait_records(1)
        assert [r["cause"] for r in recs] == ["server_drained"], recs
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            assert still_echoes(keep), s.access_records()
            time.sleep(0.1)
        assert len(s.access_records()) == 1, s.access_records()
    finally:
        keep.close()
        inherit.close()


def test_removed_upstream_takes_the_new_global_drain_timeout(sluice, backends, tmp_path):
    a1, b1 = backends(), backends()
    s = sluice([listener("keep", upstream="keep"), listener("gone", upstream="gone")],
               {"keep": upstream(a1), "gone": upstream(b1)})
    c = held_session(s, "gone")
    try:
        # The upstream and its listener go; the file's [global] drain_timeout
        # is what the removed upstream would have had.
        new = config_text(tmp_path, "sluice1", [listener("keep", upstream="keep")], {"keep": upstream(a1)},
                          drain_timeout="200ms")
        s.reload(new)
        recs = s.wait_records(1)
        assert [r["cause"] for r in recs] == ["server_drained"], recs
    finally:
        c.close()


# --------------------------------------------------------------------------
# 8. log_level and error_log follow a reload
# --------------------------------------------------------------------------

def test_log_level_follows_a_reload(sluice, backends, tmp_path):
    be = backends()
    dead = f"127.0.0.1:{harness.dead_port()}"
    # max_fails = 0: the dead server stays in the rotation, so that every
    # round tries it.
    ups = {"up": upstream(dead, be, balance="round_robin", max_fails=0)}
    s = sluice([listener()], ups)
    failed_rx = r"connect to 127\.0\.0\.1:\d+ failed"

    def cycle():
        for _ in range(4):
            held_session(s).close()

    def failed_reload(count: int):
        s.config_path.write_text("not toml [")
        s.signal(signal.SIGHUP)
        s.log.wait_for(r"reload failed", count=count)

    cycle()
    failed_reload(1)
    assert not s.log.matches(failed_rx)
    s.reload(config_text(tmp_path, "sluice1", [listener()], ups, log_level="debug"))
    cycle()
    s.log.wait_for(failed_rx)
    # At level error the reload's own success is not logged, so the new
    # configuration names its upstream differently and the access log (which
    # any level keeps) shows when it serves. Only then may the file change
    # again: a reload reads the file when it runs.
    quiet = {"quiet": upstream(dead, be, balance="round_robin", max_fails=0)}
    s.config_path.write_text(config_text(tmp_path, "sluice1", [listener(upstream="quiet")], quiet,
                                         log_level="error"))
    s.signal(signal.SIGHUP)
    s.log.wait_for(r"received SIGHUP: reloading", count=3)
    deadline = time.monotonic() + harness.EVENT_TIMEOUT
    while not [r for r in s.access_records() if r.get("upstream") == "quiet"]:
        assert time.monotonic() < deadline, "the reload to log_level = error never served"
        held_session(s).close()
        time.sleep(0.05)
    # A failed reload (an error) is the marker that the new level is in
    # force: nothing at info or debug shows any more.
    failed_reload(2)
    seen = len(s.log.matches(failed_rx))
    cycle()
    failed_reload(3)
    assert len(s.log.matches(failed_rx)) == seen, s.log.text()
    assert len(s.log.matches(r"reload succeeded")) == 1
    assert len(s.log.matches(r"received SIGHUP: reloading")) == 3


def test_error_log_follows_a_reload(sluice, backends, tmp_path):
    be = backends()
    ups = {"up": upstream(be)}
    s = sluice([listener()], ups)
    first = tmp_path / "error1.log"
    second = tmp_path / "error2.log"

    def wait_in(path: Path, pattern: str, count: int = 1):
        import re
        rx = re.compile(pattern)
        return harness.wait_until(
            lambda: len([l for l in (path.read_text().splitlines() if path.exists() else []) if rx.search(l)])
            >= count, what=f"{pattern!r} in {path.name}")

    s.config_path.write_text(config_text(tmp_path, "sluice1", [listener()], ups, error_log=str(first)))
    s.signal(signal.SIGHUP)
    s.log.wait_for(rf"error log moves to {first}")
    wait_in(first, r"reload succeeded")
    s.signal(signal.SIGUSR1)
    wait_in(first, r"reopening log files")
    s.config_path.write_text(config_text(tmp_path, "sluice1", [listener()], ups, error_log=str(second)))
    s.signal(signal.SIGHUP)
    wait_in(second, r"reload succeeded")
    assert "reload succeeded" not in s.log.text().split(f"error log moves to {first}")[1]
    before = first.read_text()
    s.config_path.write_text(config_text(tmp_path, "sluice1", [listener()], ups))
    s.signal(signal.SIGHUP)
    s.log.wait_for(r"reload succeeded")
    wait_in(second, r"error log moves to stderr")
    assert first.read_text() == before


def test_error_log_that_cannot_be_opened_fails_the_reload(sluice, backends, tmp_path):
    be = backends()
    ups = {"up": upstream(be)}
    s = sluice([listener()], ups)
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    m = s.reload(config_text(tmp_path, "sluice1", [listener()], ups, error_log=str(not_a_dir / "e.log"),
                             log_level="debug"), expect_ok=False)
    assert "error_log" in m.group(0), m.group(0)
    # The error log is still where it was.
    s.signal(signal.SIGUSR1)
    s.log.wait_for(r"reopening log files")
