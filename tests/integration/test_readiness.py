"""Readiness for a front tier (docs/scale-out.md, docs/operations.md):
GET /ready, POST /healthcheck/fail and /healthcheck/ok, and SIGTERM with
[global] shutdown_delay, against real sockets. Whatever readiness says, the
listeners keep accepting until the graceful stop begins, and no live
session is cut by any of it."""

from __future__ import annotations

import signal
import time

import harness
from harness import listener, upstream
from test_admin import (admin_sluice, echo_ok, metric, metrics, open_to, proxied,  # noqa: F401  (fixture)
                        request, status)

STOP_BEGINS_RX = r"shutdown_delay over: graceful stop begins|graceful stop begins now|received SIGTERM: graceful stop"


def ready_status(s) -> int:
    return request(s, "GET", "/ready").status


def assert_ready(s, want: bool) -> None:
    r = request(s, "GET", "/ready")
    assert r.status == (200 if want else 503), r
    assert r.json()["ready"] is want, r
    doc = status(s)
    assert doc["readiness"]["ready"] is want, doc["readiness"]
    _, m = metrics(s)
    assert metric(m, "sluice_ready") == (1 if want else 0)


def refused_soon(s, timeout: float = harness.EVENT_TIMEOUT) -> bool:
    """Connects until a connection is refused (the listener closed) or the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            c = s.connect(timeout=2)
        except (ConnectionRefusedError, ConnectionResetError):
            return True
        c.close()
        time.sleep(0.02)
    return False


def stop_keeps_held_session(s, held) -> None:
    """Once the graceful stop has begun: new clients are refused, /ready
    says 503, the held session still works; then it ends, sluice exits 0,
    and no session was cut."""
    try:
        assert refused_soon(s), "new connections were still accepted after the graceful stop began"
        assert ready_status(s) == 503
        echo_ok(held)
        assert s.running()
    finally:
        held.close()
    assert s.wait_exit(timeout=harness.EVENT_TIMEOUT) == 0
    recs = s.access_records()
    assert recs and {r["cause"] for r in recs} == {"client_closed"}, recs


def test_healthcheck_fail_and_ok_by_hand(admin_sluice, backends):
    a = backends(harness.banner_handler, name="A")
    s = admin_sluice([listener()], {"up": upstream(a)})
    assert_ready(s, True)
    held = open_to(s, "A")
    try:
        r = request(s, "POST", "/healthcheck/fail")
        assert r.status == 200 and r.json()["ready"] is False, r
        assert_ready(s, False)
        reason = request(s, "GET", "/ready").error()
        assert "healthcheck/fail" in reason, reason
        assert "healthcheck/fail" in status(s)["readiness"]["reason"]
        s.log.wait_for(r"admin: readiness off by POST /healthcheck/fail from 127\.0\.0\.1:\d+", timeout=5)
        # Not ready changes nothing on the data path: new clients are served,
        # the live session goes on.
        for _ in range(3):
            assert proxied(s)[0] == "A"
        echo_ok(held)
        # Twice is the same as once.
        assert request(s, "POST", "/healthcheck/fail").status == 200
        assert_ready(s, False)

        r = request(s, "POST", "/healthcheck/ok")
        assert r.status == 200 and r.json()["ready"] is True, r
        assert_ready(s, True)
        assert proxied(s)[0] == "A"
        echo_ok(held)
    finally:
        held.close()
    recs = s.wait_records(5)
    assert {r["cause"] for r in recs} == {"client_closed"}, recs


def test_healthcheck_posts_need_the_token_and_ready_does_not(admin_sluice, backends, tmp_path):
    a = backends(harness.banner_handler, name="A")
    token_file = tmp_path / "admin.token"
    token_file.write_text("t0ken\n")
    s = admin_sluice([listener()], {"up": upstream(a)},
                     admin={"listen": "127.0.0.1:0", "token_file": str(token_file)})
    # A front tier's probe carries no secret.
    assert ready_status(s) == 200
    assert request(s, "POST", "/healthcheck/fail").status == 401
    assert request(s, "POST", "/healthcheck/fail", token="wrong").status == 401
    assert ready_status(s) == 200
    assert request(s, "POST", "/healthcheck/fail", token="t0ken").status == 200
    assert ready_status(s) == 503
    assert request(s, "POST", "/healthcheck/ok").status == 401
    assert ready_status(s) == 503
    assert request(s, "POST", "/healthcheck/ok", token="t0ken").status == 200
    assert ready_status(s) == 200
    # Only GET /ready is open.
    assert request(s, "GET", "/status").status == 401
    assert request(s, "POST", "/ready").status == 401


def test_sigterm_with_shutdown_delay_keeps_accepting_then_stops(admin_sluice, backends):
    delay = 4.0
    a = backends(harness.banner_handler, name="A")
    s = admin_sluice([listener()], {"up": upstream(a)},
                     global_={"shutdown_delay": f"{delay:.0f}s", "shutdown_timeout": "30s"})
    held = open_to(s, "A")
    try:
        t0 = time.monotonic()
        s.signal(signal.SIGTERM)
        s.log.wait_for(r"received SIGTERM: not ready", timeout=5)
        assert_ready(s, False)
        assert "shutdown_delay" in request(s, "GET", "/ready").error()
        # The front tier may not have noticed yet: whoever it still sends is served.
        served = 0
        for _ in range(3):
            if s.log.matches(STOP_BEGINS_RX):
                break
            assert proxied(s)[0] == "A"
            served += 1
        assert served > 0, f"the {delay}s delay was over before one connection could be tried"
        echo_ok(held)
        # Becoming ready again is refused while stopping.
        r = request(s, "POST", "/healthcheck/ok")
        assert r.status == 409, r
        assert ready_status(s) == 503

        s.log.wait_for(r"shutdown_delay over: graceful stop begins", timeout=delay + harness.EVENT_TIMEOUT)
        assert time.monotonic() - t0 >= delay - 0.2, "the stop began before shutdown_delay passed"
    except BaseException:
        held.close()
        raise
    stop_keeps_held_session(s, held)


def test_second_sigterm_during_the_delay_begins_the_stop_at_once(admin_sluice, backends):
    a = backends(harness.banner_handler, name="A")
    # A delay no test waits for: only the second signal can end it.
    s = admin_sluice([listener()], {"up": upstream(a)},
                     global_={"shutdown_delay": "10m", "shutdown_timeout": "30s"})
    held = open_to(s, "A")
    try:
        s.signal(signal.SIGTERM)
        s.log.wait_for(r"received SIGTERM: not ready", timeout=5)
        assert ready_status(s) == 503
        assert proxied(s)[0] == "A"
        assert not s.log.matches(STOP_BEGINS_RX)

        s.signal(signal.SIGTERM)
        s.log.wait_for(r"received SIGTERM again during shutdown_delay: graceful stop begins now", timeout=5)
    except BaseException:
        held.close()
        raise
    # A graceful stop, not the hard one a third signal asks for.
    stop_keeps_held_session(s, held)


def test_without_shutdown_delay_sigterm_stops_at_once(admin_sluice, backends):
    a = backends(harness.banner_handler, name="A")
    s = admin_sluice([listener()], {"up": upstream(a)}, global_={"shutdown_timeout": "30s"})
    held = open_to(s, "A")
    try:
        s.signal(signal.SIGTERM)
        s.log.wait_for(r"received SIGTERM: graceful stop", timeout=5)
        assert "stopping" in request(s, "GET", "/ready").error()
    except BaseException:
        held.close()
        raise
    stop_keeps_held_session(s, held)
