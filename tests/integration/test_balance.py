"""least_conn and round_robin pick servers as specified, seen from real backends."""

from __future__ import annotations

import collections

import pytest

import harness
from harness import listener, upstream


def open_session(s) -> tuple[object, str]:
    """Connects and returns (socket, banner) once the backend has accepted."""
    c = s.connect()
    try:
        return c, harness.recv_line(c).decode()
    except BaseException:
        c.close()
        raise


def short_session(s, done_before: int) -> str:
    """One connect/banner/close; waits until sluice has logged it as ended so
    that the next pick sees an active count of zero for it."""
    c, name = open_session(s)
    c.close()
    s.wait_records(done_before + 1)
    return name


# Active counts are shared by all workers, so least_conn is exact with several.
WORKERS = pytest.mark.parametrize("workers", [1, 2], ids=["1worker", "2workers"])


@WORKERS
def test_least_conn_avoids_the_busy_server(sluice, backends, workers):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = sluice([listener()], {"up": upstream(a, b, balance="least_conn")},
               global_={"workers": workers})
    held, busy = open_session(s)
    try:
        other = "B" if busy == "A" else "A"
        picks = [short_session(s, i) for i in range(6)]
        assert picks == [other] * 6
        # The held session is still served.
        held.sendall(b"x")
        assert harness.recv_exact(held, 1) == b"x"
    finally:
        held.close()


def test_least_conn_is_the_default(sluice, backends):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = sluice([listener()], {"up": upstream(a, b)})
    held, busy = open_session(s)
    try:
        other = "B" if busy == "A" else "A"
        assert [short_session(s, i) for i in range(4)] == [other] * 4
    finally:
        held.close()


@WORKERS
def test_least_conn_weights_split_active_sessions(sluice, backends, workers):
    heavy = backends(harness.banner_handler, name="heavy")
    light = backends(harness.banner_handler, name="light")
    s = sluice([listener()], {"up": upstream(heavy, light, balance="least_conn",
                                            weights=[2, 1])},
               global_={"workers": workers})
    held = []
    try:
        for _ in range(3):
            held.append(open_session(s))
        names = collections.Counter(n for _, n in held)
        assert names == {"heavy": 2, "light": 1}
        assert heavy.counts()[1] == 2 and light.counts()[1] == 1

        # Three more (6 held, 4:2 is again exactly proportional).
        for _ in range(3):
            held.append(open_session(s))
        assert heavy.counts()[1] == 4 and light.counts()[1] == 2
    finally:
        for c, _ in held:
            c.close()


def test_least_conn_counts_drop_when_sessions_end(sluice, backends):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = sluice([listener()], {"up": upstream(a, b, balance="least_conn")})
    c1, n1 = open_session(s)
    c2, n2 = open_session(s)
    assert {n1, n2} == {"A", "B"}
    c1.close()
    s.wait_records(1)
    try:
        # n1's server is now idle, n2's has one: the next goes to n1's server.
        c3, n3 = open_session(s)
        c3.close()
        assert n3 == n1
    finally:
        c2.close()


def test_round_robin_equal_weights_alternates(sluice, backends):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = sluice([listener()], {"up": upstream(a, b, balance="round_robin")})
    picks = [short_session(s, i) for i in range(8)]
    assert collections.Counter(picks) == {"A": 4, "B": 4}
    assert all(picks[i] != picks[i + 1] for i in range(len(picks) - 1)), picks


def test_round_robin_ignores_active_counts(sluice, backends):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = sluice([listener()], {"up": upstream(a, b, balance="round_robin")})
    held = []
    try:
        for _ in range(4):
            held.append(open_session(s))
        picks = [n for _, n in held]
        assert all(picks[i] != picks[i + 1] for i in range(3)), picks
    finally:
        for c, _ in held:
            c.close()


def test_round_robin_weights_two_to_one(sluice, backends):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    s = sluice([listener()], {"up": upstream(a, b, balance="round_robin", weights=[2, 1])})
    picks = [short_session(s, i) for i in range(12)]
    assert collections.Counter(picks) == {"A": 8, "B": 4}
    # Smooth: every window of three picks is A, A, B in some order.
    for i in range(0, 12, 3):
        assert sorted(picks[i:i + 3]) == ["A", "A", "B"], picks
