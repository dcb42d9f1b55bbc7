"""What a binary upgrade promises beyond moving sessions (docs/operations.md,
"Upgrading the binary"; docs/reliability.md): one upgrade at a time, limits
that stay exact while both processes hold sessions, a session closed in the
old process only once the new one has it, a deadline for the old process,
what an operator reads carried over, and a failure that says why."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time

import pytest

import harness
from harness import wait_until
from test_upgrade import Instance, echo_roundtrip, install, pid_alive, served


class HeldBackend:
    """An echo server that, once a client has sent its FIN, keeps the
    connection open (a half-closed session: sluice cannot move it) until
    release(), then sends TAIL and closes."""

    TAIL = b"tail after the client's FIN\n"

    def __init__(self, backends):
        self.release_event = threading.Event()
        self.backend = backends(self.handle, name="held")

    @property
    def address(self) -> str:
        return self.backend.address

    def handle(self, backend, conn):
        while True:
            data = conn.recv(65536)
            if not data:
                break
            conn.sendall(data)
        if self.release_event.wait(120):
            conn.sendall(self.TAIL)

    def release(self):
        self.release_event.set()


def half_closed(inst: Instance, payload: bytes = b"half\n") -> socket.socket:
    """A session the old process cannot hand over: its client sent its FIN."""
    s = harness.connect(*inst.addr())
    echo_roundtrip(s, payload)
    s.shutdown(socket.SHUT_WR)
    return s


def old_process_holds(inst: Instance, old: int, n: int):
    """Waits until the serving (new) process has said what the old one holds."""
    wait_until(lambda: inst.state()["state"] == "receiving", timeout=15, what="the new process receiving")
    assert pid_alive(old)


def status(inst: Instance) -> dict:
    code, body = inst.admin_request("GET", "/status")
    assert code == 200, body
    return body


def server_row(body: dict, upstream: str = "up") -> dict:
    return [s for u in body["upstreams"] if u["name"] == upstream for s in u["servers"]][0]


def listener_row(body: dict, name: str = "main") -> dict:
    return [l for l in body["listeners"] if l["name"] == name][0]


def new_instance(tmp_path, address, **kw) -> Instance:
    d = tmp_path / f"i{len(list(tmp_path.iterdir()))}"
    d.mkdir()
    return Instance(d, address, **kw)


@pytest.fixture
def made():
    instances = []
    yield instances
    for inst in instances:
        try:
            inst.stop()
        finally:
            # Kept beside the instance's files, for a failure's post-mortem.
            (inst.dir / "sluice.log").write_text("\n".join(inst.log.lines))


def test_second_upgrade_while_receiving_is_refused(tmp_path, backends, made):
    """SIGUSR2 and POST /upgrade sent to a process still receiving sessions
    from its predecessor (what `systemctl kill -s USR2` does once MAINPID
    has moved) are refused and say why: no third process starts, no session
    is cut, and every session arrives."""
    held = HeldBackend(backends)
    inst = new_instance(tmp_path, held.address, extra_listeners='fin_timeout = "120s"\n',
                        extra_global='upgrade_finish_timeout = "120s"')
    made.append(inst)
    moving = [harness.connect(*inst.addr()) for _ in range(5)]
    for i, s in enumerate(moving):
        echo_roundtrip(s, f"moving {i}\n".encode())
    stuck = half_closed(inst)
    old = inst.serving_pid()
    install(inst.bin, harness.sluice_next_bin())
    new = inst.upgrade()
    old_process_holds(inst, old, 1)
    state = inst.state()
    assert str(old) in state["message"], state

    os.kill(new, signal.SIGUSR2)
    inst.log.wait_for(r"received SIGUSR2: upgrade refused: this process is still receiving sessions from the "
                      rf"previous one \(process {old} ")
    code, body = inst.admin_request("POST", "/upgrade")
    assert code == 409, body
    assert "still receiving sessions" in body["error"], body
    inst.log.wait_for(r"received POST /upgrade: upgrade refused: this process is still receiving")
    # Nothing was started: one new process in the log, the pid_file unchanged.
    assert len(inst.log.matches(r"upgrade: new process \d+ started")) == 1, inst.log.text()
    assert inst.serving_pid() == new
    assert pid_alive(old), "the old process still holds the half-closed session"

    # The sessions that could move did, and work.
    for i, s in enumerate(moving):
        echo_roundtrip(s, f"after {i}\n".encode() * 50)
    # The one that could not is still served by the old process.
    held.release()
    assert harness.recv_all(stuck) == HeldBackend.TAIL
    stuck.close()
    inst.settle(old)
    assert inst.state()["message"] == f"took over from process {old} with 5 session(s)"
    # Now an upgrade is allowed again.
    install(inst.bin, harness.sluice_bin())
    third = inst.upgrade()
    assert third not in (old, new)
    for s in moving:
        echo_roundtrip(s, b"third\n")
        s.close()
    wait_until(lambda: len(inst.records()) == 6, timeout=15, what="one access record per session")
    assert {r["cause"] for r in inst.records()} <= {"client_closed", "server_closed"}, inst.records()


def queued_reply(s: socket.socket, payload: bytes, wait: float) -> bytes | None:
    """Sends `payload`; the echo if it comes within `wait` seconds, else None."""
    s.sendall(payload)
    s.settimeout(wait)
    try:
        return harness.recv_exact(s, len(payload))
    except (socket.timeout, TimeoutError):
        return None
    finally:
        s.settimeout(harness.EVENT_TIMEOUT)


@pytest.mark.parametrize("first", ["moved", "stuck_in_old"])
def test_max_conns_counts_the_sessions_of_both_processes(tmp_path, backends, made, first):
    """A server with max_conns = 1 holds one session across an upgrade,
    whether the session has moved to the new process or is still in the old
    one: a second client waits in the queue until the first one ends."""
    held = HeldBackend(backends)
    inst = new_instance(tmp_path, held.address, server_extra=", max_conns = 1",
                        extra_upstream='queue = 5\nqueue_timeout = "60s"',
                        extra_listeners='fin_timeout = "120s"\n', extra_global='upgrade_finish_timeout = "120s"')
    made.append(inst)
    if first == "moved":
        a = harness.connect(*inst.addr())
        echo_roundtrip(a, b"first\n")
    else:
        a = half_closed(inst, b"first\n")
    old = inst.serving_pid()
    install(inst.bin, harness.sluice_next_bin())
    new = inst.upgrade()
    if first == "moved":
        inst.settle(old)  # the session is in the new process now
    else:
        old_process_holds(inst, old, 1)
    assert server_row(status(inst))["active"] == 1, status(inst)
    b = harness.connect(*inst.addr())
    # Two seconds is long enough for a slot given wrongly to show: the echo
    # server answers at once.
    assert queued_reply(b, b"second\n", 2.0) is None, "a second session got the server's only slot"
    body = status(inst)
    assert server_row(body)["active"] == 1 and body["pid"] == new, body
    assert [u for u in body["upstreams"] if u["name"] == "up"][0]["queue"]["length"] == 1, body
    # The first session ends: the slot goes to the one waiting.
    held.release()
    if first == "moved":
        a.close()
    else:
        assert harness.recv_all(a) == HeldBackend.TAIL
        a.close()
    assert harness.recv_exact(b, len(b"second\n")) == b"second\n"
    echo_roundtrip(b, b"served\n")
    assert server_row(status(inst))["active"] == 1
    b.close()
    if first == "stuck_in_old":
        inst.settle(old)
    wait_until(lambda: server_row(status(inst))["active"] == 0, what="no session left on the server")


def test_listener_and_client_limits_count_the_old_process_sessions(tmp_path, backends, made):
    """A listener's max_connections and client_max_connections hold for the
    sessions of both processes while the old one still has some."""
    held = HeldBackend(backends)
    inst = new_instance(tmp_path, held.address,
                        extra_listeners='fin_timeout = "120s"\nmax_connections = 3\nclient_max_connections = 2\n',
                        extra_global='upgrade_finish_timeout = "120s"')
    made.append(inst)
    stuck = [half_closed(inst, f"stuck {i}\n".encode()) for i in range(2)]
    old = inst.serving_pid()
    install(inst.bin, harness.sluice_next_bin())
    inst.upgrade()
    old_process_holds(inst, old, 2)
    body = status(inst)
    assert listener_row(body)["active"] == 2, body
    assert body["connections"] == 2, body
    # 127.0.0.1 has its two sessions (in the old process): refused.
    extra = harness.connect(*inst.addr())
    assert not served(extra), "client_max_connections let a third session in"
    extra.close()
    # Another address may: one more reaches the listener's three ...
    other = socket.create_connection(inst.addr(), timeout=10, source_address=("127.0.0.2", 0))
    assert served(other)
    # ... and no more.
    fourth = socket.create_connection(inst.addr(), timeout=10, source_address=("127.0.0.3", 0))
    assert not served(fourth), "max_connections let a fourth session in"
    fourth.close()
    held.release()
    for s in stuck:
        assert harness.recv_all(s) == HeldBackend.TAIL
        s.close()
    inst.settle(old)
    again = harness.connect(*inst.addr())
    assert served(again), "the old process's sessions still count after it has gone"
    again.close()
    other.close()


def test_new_process_dying_mid_handover_leaves_the_unacknowledged_sessions_with_the_old(tmp_path, backends, made):
    """The new process dies after it acknowledged three sessions: those go
    with it, every other one stays with the old process, which passes their
    bytes and accepts new clients again."""
    b = backends()
    inst = new_instance(tmp_path, b.address, env={"SLUICE_TEST_EXIT_AFTER_ADOPTING": "3"})
    made.append(inst)
    sessions = [harness.connect(*inst.addr()) for _ in range(10)]
    for i, s in enumerate(sessions):
        echo_roundtrip(s, f"session {i}\n".encode())
    old = inst.serving_pid()
    install(inst.bin, harness.sluice_next_bin())
    os.kill(old, signal.SIGUSR2)
    # "closed the hand-over channel during the hand-over" with the error
    # when it came as a reset rather than an end of file.
    m = inst.log.wait_for(r"upgrade failed, this process serves on: the new process (\d+) (exited|closed).* during "
                          r"the hand-over(: [^;]*)?; the sessions it had not acknowledged stay here, and this process "
                          r"accepts again", timeout=30)
    inst.log.wait_for(r"test fault: exiting before acknowledging session 4 of the hand-over")
    wait_until(lambda: inst.serving_pid() == old, what="the pid_file names the old process again")
    wait_until(lambda: not pid_alive(int(m.group(1))), what="the new process gone")
    alive = [s for s in sessions if served(s)]
    assert len(alive) == 7, f"{len(alive)} sessions still served"
    for s in alive:
        echo_roundtrip(s, b"still through the old process\n" * 100)
    # Accepting again, on the same sockets, with the admin API.
    with harness.connect(*inst.addr()) as s:
        echo_roundtrip(s, b"new client\n")
    body = status(inst)
    assert body["pid"] == old and body["upgrade"]["state"] == "failed", body["upgrade"]
    assert "had not acknowledged stay here" in body["upgrade"]["message"], body["upgrade"]
    # And it can be upgraded again (this build ignores the fault).
    install(inst.bin, harness.sluice_bin())
    inst.upgrade()
    inst.settle(old)
    for s in alive:
        echo_roundtrip(s, b"moved at last\n")
        s.close()
    for s in sessions:
        s.close()


STALL_SESSIONS = 800


def test_a_new_process_that_stalls_mid_handover_still_gets_every_session(tmp_path, backends, made):
    """The new process's control thread stops reading the hand-over for 3 s
    after the first session (as a process the kernel does not schedule
    would): the channel fills, and the old process waits for room instead of
    giving up. Every session moves, the old process exits long before
    upgrade_finish_timeout, and none is closed with cause upgrade."""
    harness.raise_nofile(4 * STALL_SESSIONS + 1024)
    b = backends()
    inst = new_instance(tmp_path, b.address, env={"SLUICE_TEST_STALL_RECEIVING_MS": "3000"},
                        extra_global='upgrade_finish_timeout = "120s"')
    made.append(inst)
    sessions = []
    for i in range(STALL_SESSIONS):
        s = harness.connect(*inst.addr())
        echo_roundtrip(s, f"session {i}\n".encode())
        sessions.append(s)
    old = inst.serving_pid()
    install(inst.bin, harness.sluice_next_bin())
    inst.upgrade()
    inst.log.wait_for(r"test fault: the control thread stops reading the hand-over for 3000 ms", timeout=30)
    # The channel filled: what this test is about happened.
    inst.log.wait_for(r"worker \d+: the new process has taken no session for \d+ ms", timeout=30)
    # Far less than the deadline: only a hand-over that went on after the
    # stall ends this soon.
    wait_until(lambda: not pid_alive(old), timeout=60, what=f"old process {old} exits")
    for i, s in enumerate(sessions):
        echo_roundtrip(s, f"after the stall {i}\n".encode())
    assert not [r for r in inst.records() if r["cause"] == "upgrade"], "sessions closed at the deadline"
    for s in sessions:
        s.close()


def test_upgrade_finish_timeout_closes_what_never_became_movable(tmp_path, backends, made):
    """The old process does not linger: after upgrade_finish_timeout the
    sessions that never could move are closed with cause upgrade, and it
    exits; those that moved go on."""
    held = HeldBackend(backends)
    inst = new_instance(tmp_path, held.address, extra_listeners='fin_timeout = "120s"\n',
                        extra_global='upgrade_finish_timeout = "2s"')
    made.append(inst)
    moved = harness.connect(*inst.addr())
    echo_roundtrip(moved, b"moves\n")
    stuck = half_closed(inst)
    old = inst.serving_pid()
    install(inst.bin, harness.sluice_next_bin())
    inst.upgrade()
    inst.log.wait_for(r"upgrade: upgrade_finish_timeout 2s passed: closing the 1 session\(s\) that did not move "
                      r"\(cause upgrade\)", timeout=30)
    inst.settle(old)
    # Closed by the old process: no tail, an end.
    assert harness.recv_all(stuck) == b""
    stuck.close()
    wait_until(lambda: len(inst.records()) == 1, what="the closed session's record")
    assert inst.records()[0]["cause"] == "upgrade", inst.records()
    echo_roundtrip(moved, b"still here\n")
    moved.close()
    held.release()
    code, text = inst.admin_request("GET", "/status")
    assert listener_row(text)["closed"].get("upgrade") == 1, listener_row(text)


def test_what_operators_read_carries_over(tmp_path, backends, made):
    """Totals, peaks, a server's state and how long it has held, its time
    down, the configuration generation and the service's uptime go on
    across an upgrade; the process's own uptime starts again beside it."""
    live = backends().address
    dead = f"127.0.0.1:{harness.dead_port('127.0.0.1')}"
    inst = new_instance(tmp_path, live, extra_upstream='balance = "round_robin"\nmax_fails = 1\nfail_timeout = "60s"',
                        server_extra=' }, { address = "' + dead + '"')
    made.append(inst)
    held = [harness.connect(*inst.addr()) for _ in range(3)]
    for s in held:
        echo_roundtrip(s, b"peak\n")
    for i in range(6):
        with harness.connect(*inst.addr()) as s:
            echo_roundtrip(s, f"short {i}\n".encode() * 10)
    held.pop().close()
    # A reload, for the generation (of a changed file: the same bytes would
    # be a no-op that keeps the generation).
    inst.config.write_text(inst.config.read_text() + "\n# reloaded once\n")
    os.kill(inst.serving_pid(), signal.SIGHUP)
    inst.log.wait_for(r"reload succeeded")
    wait_until(lambda: server_row(status(inst))["address"] == live and
               [s for s in status(inst)["upstreams"][0]["servers"] if s["address"] == dead][0]["passive"] == "down",
               what="the dead server marked down")
    wait_until(lambda: len(inst.records()) == 7, what="seven access records")
    time.sleep(1.1)  # so that the service is visibly older than the new process
    before = status(inst)
    old = inst.serving_pid()
    install(inst.bin, harness.sluice_next_bin())
    inst.upgrade()
    after = status(inst)
    assert after["pid"] != old
    assert after["started_at_ms"] == before["started_at_ms"]
    assert after["uptime_seconds"] >= before["uptime_seconds"]
    assert after["process_uptime_seconds"] < after["uptime_seconds"] - 1, after
    assert after["config"]["generation"] == before["config"]["generation"] == 2
    assert after["reloads"] == before["reloads"]
    lb, la = listener_row(before), listener_row(after)
    for key in ("accepted", "bytes_in", "bytes_out", "peak_active"):
        assert la[key] >= lb[key] > 0, (key, lb, la)
    assert la["closed"]["client_closed"] >= lb["closed"]["client_closed"], (lb, la)
    assert before["connections"] == 2
    # Exact once the moves are over (a session counts twice for a moment:
    # in the new process as it arrives, in the old one's report until the
    # next).
    wait_until(lambda: status(inst)["connections"] == 2, what="two connections counted")
    servers_before = {s["address"]: s for s in before["upstreams"][0]["servers"]}
    for s in after["upstreams"][0]["servers"]:
        b = servers_before[s["address"]]
        for key in ("total_sessions", "failures", "bytes_in", "bytes_out", "peak_active", "down_count"):
            assert s[key] >= b[key], (key, b, s)
        assert (s["state"], s["since_ms"]) == (b["state"], b["since_ms"]), (b, s)
        assert s["downtime_seconds"] >= b["downtime_seconds"], (b, s)
    dead_row = [s for s in after["upstreams"][0]["servers"] if s["address"] == dead][0]
    assert dead_row["failures"] >= 1 and dead_row["down_count"] == 1 and dead_row["downtime_seconds"] >= 1, dead_row
    inst.settle(old)
    for s in held:
        s.close()


def test_upgrade_applies_the_file_as_it_is_on_disk(tmp_path, backends, made):
    """An edit not yet reloaded takes effect with the upgrade, as the next
    configuration generation."""
    b1, b2 = backends(name="one"), backends(name="two")
    inst = new_instance(tmp_path, b1.address)
    made.append(inst)
    before = status(inst)["config"]["generation"]
    inst.config.write_text(inst.text.replace(b1.address, b2.address))
    old = inst.serving_pid()
    install(inst.bin, harness.sluice_bin())
    inst.upgrade()
    body = status(inst)
    assert body["config"]["generation"] == before + 1, body["config"]
    assert [s["address"] for s in body["upstreams"][0]["servers"]] == [b2.address]
    with harness.connect(*inst.addr()) as s:
        echo_roundtrip(s, b"to two\n")
    wait_until(lambda: b2.counts()[0] == 1, what="the session reached the server the file names now")
    inst.settle(old)


def test_failed_upgrade_says_why_in_the_old_process(tmp_path, backends, made):
    """A new binary that cannot start says why to the old process, which
    logs it with its level and shows it in /status."""
    inst = new_instance(tmp_path, backends().address)
    made.append(inst)
    serving = inst.serving_pid()
    inst.config.write_text(inst.text.replace("[admin]", "[global.nonsense]\n\n[admin]"))
    install(inst.bin, harness.sluice_bin())
    code, body = inst.admin_request("POST", "/upgrade")
    assert code == 202, body
    line = inst.log.wait_for(r"\[error\] upgrade failed, this process serves on: the new process \d+ exited with "
                             r"status 1 before taking over: critical: (\S+):(\d+):(\d+): (.*)$", timeout=30)
    assert line.group(1) == str(inst.config), line.group(0)
    upgrade = inst.state()
    assert upgrade["state"] == "failed", upgrade
    assert f"{inst.config}:{line.group(2)}:{line.group(3)}: " in upgrade["message"], upgrade
    assert status(inst)["pid"] == serving
    with harness.connect(*inst.addr()) as s:
        echo_roundtrip(s, b"still served\n")


def test_sessions_on_their_way_end_when_the_new_process_finds_their_server_down(tmp_path, backends, made):
    """A check in the new process ends a server's sessions while some of
    them are still on their way from the old one: those end as they arrive,
    with the same cause, instead of carrying on on a server taken out.
    The old process has no check here (the check comes with the upgrade,
    from the edited file), so only the new process can see the server go."""
    b = backends()
    inst = new_instance(tmp_path, b.address, extra_global='upgrade_finish_timeout = "60s"')
    made.append(inst)
    sessions = []
    for i in range(50):
        s = harness.connect(*inst.addr())
        echo_roundtrip(s, f"session {i}\n".encode())
        sessions.append(s)
    # The server stops taking connections; the live ones go on.
    b.sock.close()
    inst.config.write_text(inst.text + '\n[upstream.up.health]\ntype = "tcp"\ninterval = "100ms"\ntimeout = "1s"\n'
                                       'fall = 1\nrise = 1\njitter = "0%"\non_down = "close_sessions"\n')
    old = inst.serving_pid()
    install(inst.bin, harness.sluice_next_bin())
    inst.upgrade()
    inst.settle(old)
    # The new process's first check may come after the hand-over on a slow
    # build: the sessions are asked once it has found the server down.
    inst.log.wait_for(rf"server {re.escape(b.address)} marked down \(active check\)", timeout=30)
    # The line is the control thread's; each worker ends its sessions when
    # it hears of it, a moment later. A session asked in that moment echoes
    # once more and then ends: each must end within the one deadline.
    deadline = time.monotonic() + 20
    ended = []
    for s in sessions:
        try:
            s.sendall(b"still there?\n")
            while True:
                s.settimeout(max(0.1, deadline - time.monotonic()))
                if s.recv(100) == b"":
                    ended.append(True)
                    break
        except socket.timeout:
            ended.append(False)
        except OSError:
            ended.append(True)
        s.close()
    assert all(ended), f"{ended.count(False)} of {len(ended)} session(s) still run on a server found down"
    causes = {r["cause"] for r in inst.records()}
    assert causes == {"server_down"}, causes
