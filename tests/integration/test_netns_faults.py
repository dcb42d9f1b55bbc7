"""Real network faults: peers in network namespaces of their own (a veth
pair each, 10.x addresses, nftables rules inside the namespace), sluice in
the root namespace.

- A server black-holed after its session is established: the session ends
  with the right cause within the configured time (TCP keepalive on an idle
  session, `idle_timeout` on one that keeps sending), and a neighbouring
  session on the same worker keeps moving meanwhile, its bytes whole.
- A client that vanishes without FIN or RST: keepalive ends its session and
  the server side is closed.
- A server whose SYNs are dropped: `connect_timeout` moves the session to
  the next server.

Skipped, with the reason, where namespaces cannot be created (not root, no
nft). Every namespace and veth pair is removed by the fixture, whatever the
test did."""

from __future__ import annotations

import socket
import threading
import time

import pytest

import harness
import neighbour
import netns
from harness import listener, upstream

REASON = netns.unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

# Keepalive as short as the kernel allows: idle 1 s, then 2 probes 1 s
# apart, so a silent peer is dropped about 3 s after the last byte.
FAST_KEEPALIVE = {"tcp_keepalive_idle": "1s", "tcp_keepalive_interval": "1s", "tcp_keepalive_count": 2}
KEEPALIVE_IDLE_S = 1.0
KEEPALIVE_PROBES_S = 2.0  # count x interval
KEEPALIVE_DEAD_S = KEEPALIVE_IDLE_S + KEEPALIVE_PROBES_S
# sluice sets the server leg's keepalive this long after connecting (so that
# short sessions never pay for it).
SERVER_KEEPALIVE_DELAY_S = 3.0
IDLE_TIMEOUT_S = 2.0
# idle_timeout with bytes still queued: one more look a quarter later.
IDLE_RECHECK_S = IDLE_TIMEOUT_S / 4
# Each end must come within this of the moment it is due: room for a busy
# two-core machine, far below what a missed timer would take (the next
# timeout, or the kernel's own defaults: minutes to hours).
LATE_S = 3.0
# How long the tests wait before giving up (so that a late end is reported
# with its time rather than as a hang).
END_DEADLINE_S = 15.0


@pytest.fixture
def namespaces():
    """make() -> a created netns.Namespace; all removed at the end."""
    made: list[netns.Namespace] = []

    def make():
        ns = netns.Namespace()
        made.append(ns)
        return ns.create()

    yield make
    problems = [p for ns in made for p in ns.destroy()]
    assert not problems, problems


def far_record(s: harness.Sluice) -> dict:
    (rec,) = s.wait_records(1, timeout=END_DEADLINE_S, pred=lambda r: r["listener"] == "far")
    return rec


def push_until_closed(sock: socket.socket, give_up: float) -> threading.Thread:
    """Sends from a thread until the socket fails or `give_up` seconds pass."""
    def run():
        block = b"p" * 65536
        deadline = time.monotonic() + give_up
        try:
            while time.monotonic() < deadline:
                sock.send(block)
        except OSError:
            pass
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("detect", ["keepalive", "idle_timeout"])
def test_black_holed_server_ends_its_session_and_spares_the_neighbour(
        sluice, backends, namespaces, detect):
    ns = namespaces()
    with ns.entered():
        far = backends(harness.echo_handler, name="far", host=ns.inside)
    if detect == "keepalive":
        # An idle session: only keepalive can tell that the server is gone.
        far_opts, cause, at_least = dict(FAST_KEEPALIVE), "server_reset", KEEPALIVE_DEAD_S - 1.0
    else:
        # A client that keeps sending into a server that takes nothing:
        # retransmissions would take minutes; idle_timeout ends it.
        far_opts = {"tcp_keepalive": False, "idle_timeout": f"{IDLE_TIMEOUT_S:.0f}s"}
        cause, at_least = "idle_timeout", IDLE_TIMEOUT_S - 0.5
    source = backends(neighbour.source, name="near")
    s = sluice([listener("far", "far", **far_opts), listener("near", "near")],
               {"far": upstream(far), "near": upstream(source)})

    meter = neighbour.Meter(s.connect("near"))
    c = s.connect("far", timeout=END_DEADLINE_S)
    try:
        c.sendall(b"hello\n")
        assert harness.recv_exact(c, 6) == b"hello\n"
        t_connected = time.monotonic()
        before = meter.measure()

        ns.drop_everything()
        t_fault = time.monotonic()
        if detect == "keepalive":
            # The probes start once the server leg has its keepalive and the
            # session has been silent for the keepalive idle time.
            due = max(t_connected + SERVER_KEEPALIVE_DELAY_S, t_fault + KEEPALIVE_IDLE_S) \
                + KEEPALIVE_PROBES_S - t_fault
        else:
            # The client's bytes still move for a moment after the fault,
            # until the queues towards the dead server are full.
            due = IDLE_TIMEOUT_S + IDLE_RECHECK_S
        pusher = push_until_closed(c, END_DEADLINE_S) if detect == "idle_timeout" else None
        time.sleep(0.2)
        during = meter.measure()

        how = harness.wait_closed(c, timeout=END_DEADLINE_S)
        took = time.monotonic() - t_fault
        if pusher:
            pusher.join(END_DEADLINE_S)
    finally:
        c.close()
        meter.stop()
    rec = far_record(s)
    print(f"{detect}: ended {took:.2f} s after the fault, due after {due:.2f} s ({how}, cause {rec['cause']})")
    assert rec["cause"] == cause, rec
    assert at_least <= took <= due + LATE_S, \
        f"ended {took:.1f}s after the fault ({how}), due after {due:.1f}s, cause {rec['cause']}"
    neighbour.assert_kept_moving(before, during, f"a black-holed server ({detect})")


def test_vanished_client_is_cleaned_up_by_keepalive(sluice, backends, namespaces):
    ns = namespaces()
    be = backends(harness.echo_handler, name="be")
    # The listener is on the root end of the namespace's veth pair.
    s = sluice([listener("far", listen=f"{ns.outside}:0", **FAST_KEEPALIVE)], {"up": upstream(be)})
    host, port = s.addr("far")
    with ns.entered():
        c = harness.connect(host, port, timeout=END_DEADLINE_S)
    try:
        c.sendall(b"ping\n")
        assert harness.recv_exact(c, 5) == b"ping\n"
        assert be.counts() == (1, 1)

        # The client's host is gone: no FIN, no RST, nothing answers.
        ns.drop_everything()
        t_fault = time.monotonic()
        rec = far_record(s)
        took = time.monotonic() - t_fault
        print(f"vanished client: session ended {took:.2f} s after the fault, due after {KEEPALIVE_DEAD_S:.2f} s, "
              f"cause {rec['cause']}")
        assert rec["cause"] == "client_reset", rec
        assert KEEPALIVE_DEAD_S - 1.0 <= took <= KEEPALIVE_DEAD_S + LATE_S, \
            f"ended {took:.1f}s after the fault, due after {KEEPALIVE_DEAD_S:.1f}s"
        # The server's side of the session is closed too.
        harness.wait_until(lambda: be.counts()[1] == 0, timeout=END_DEADLINE_S,
                           what="the backend's connection to be closed")
    finally:
        c.close()


def test_dropped_syns_move_the_session_to_the_next_server(sluice, backends, namespaces):
    ns = namespaces()
    with ns.entered():
        silent = backends(harness.banner_handler, name="silent", host=ns.inside)
    ns.drop_syns()
    good = backends(harness.banner_handler, name="good")
    # The silent server's weight makes it the first choice.
    s = sluice([listener(connect_timeout="500ms", tries=2)],
               {"up": upstream(silent, good, weights=[100, 1])})

    t0 = time.monotonic()
    assert harness.banner_of(s) == b"good"
    took = time.monotonic() - t0
    (rec,) = s.wait_records(1)
    assert rec["tries"] == "2" and rec["server"] == good.address, rec
    # Waited out connect_timeout on the silent one, and not much longer.
    assert 450 <= int(rec["connect_ms"]) <= 500 + 1000 * LATE_S, rec
    assert took <= 0.5 + LATE_S, f"served after {took:.2f}s with connect_timeout=500ms"
    assert silent.counts()[0] == 0

    # The silent server is now left out (max_fails = 1): the next session
    # goes straight to the good one.
    assert harness.banner_of(s) == b"good"
    recs = s.wait_records(2)
    assert recs[1]["tries"] == "1" and recs[1]["server"] == good.address, recs[1]
