"""Binary upgrade (SIGUSR2, POST /upgrade): the new process takes the
listening sockets over and every live session, the old one exits once it
holds none; a new binary that fails leaves the old one serving
(docs/operations.md, "Upgrading the binary")."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

import harness
from harness import wait_until

LISTENING_RX = r'listener "(?P<name>[^"]+)" listening on (?P<addr>\S+)'


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def install(binary: Path, source: Path) -> None:
    """Installs `source` at `binary` the way a package manager does: a new
    file renamed over the old one (the running process keeps its inode)."""
    tmp = binary.with_name(binary.name + ".new")
    shutil.copy2(source, tmp)
    os.rename(tmp, binary)


def install_script(binary: Path, text: str) -> None:
    tmp = binary.with_name(binary.name + ".new")
    tmp.write_text(text)
    tmp.chmod(0o755)
    os.rename(tmp, binary)


class Instance:
    """sluice started from a copy of the binary under test, with a pid_file and
    an admin API; follows the serving process across upgrades."""

    def __init__(self, tmp_path: Path, backend_addr: str, workers: int = 1,
                 extra_listeners: str = "", upgrade_timeout: str = "5s", log_level: str = "info", route: str = 'upstream = "up"',
                 extra_global: str = "", server_extra: str = "", extra_upstream: str = "", env: dict | None = None):
        self.dir = tmp_path
        self.bin = tmp_path / "bin" / "sluice"
        self.bin.parent.mkdir()
        shutil.copy2(harness.sluice_bin(), self.bin)
        self.pid_file = tmp_path / "sluice.pid"
        self.access_log = tmp_path / "access.log"
        self.config = tmp_path / "sluice.toml"
        self.text = f"""
[global]
workers = {workers}
access_log = "{self.access_log}"
pid_file = "{self.pid_file}"
upgrade_timeout = "{upgrade_timeout}"
shutdown_timeout = "2s"
log_level = "{log_level}"
{extra_global}

[admin]
listen = "127.0.0.1:0"

[[listener]]
name = "main"
listen = "127.0.0.1:0"
{route}
{extra_listeners}
[upstream.up]
{extra_upstream}
servers = [{{ address = "{backend_addr}"{server_extra} }}]
"""
        self.config.write_text(self.text)
        self.proc = subprocess.Popen([str(self.bin), "-c", str(self.config)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path,
                                     env=dict(os.environ, **(env or {})))
        self.log = harness.LineLog(self.proc.stdout)
        self.addrs = {}
        m = self.log.wait_for(LISTENING_RX, timeout=harness.START_TIMEOUT)
        self.addrs[m.group("name")] = harness.split_addr(m.group("addr"))
        m = self.log.wait_for(r"admin API listening on (?P<addr>\S+)", timeout=harness.START_TIMEOUT)
        self.admin = harness.split_addr(m.group("addr"))
        wait_until(lambda: self.serving_pid() == self.proc.pid, what="pid_file names the first process")
        self.pids = [self.proc.pid]

    def serving_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def addr(self, name="main"):
        return self.addrs[name]

    def admin_request(self, method: str, path: str, body: str | None = None):
        c = http.client.HTTPConnection(*self.admin, timeout=10)
        try:
            c.request(method, path, body=body)
            r = c.getresponse()
            return r.status, json.loads(r.read() or b"null")
        finally:
            c.close()

    def version(self) -> str:
        """The version the serving process reports in /status."""
        status, body = self.admin_request("GET", "/status")
        assert status == 200, body
        return body["version"]

    def upgrade(self, via_http: bool = False) -> int:
        """Upgrades and waits until a new process serves; returns its PID."""
        before = self.serving_pid()
        if via_http:
            status, body = self.admin_request("POST", "/upgrade")
            assert status == 202, body
        else:
            os.kill(before, signal.SIGUSR2)
        wait_until(lambda: self.serving_pid() not in (None, before), timeout=30, what="a new process serves")
        pid = self.serving_pid()
        self.pids.append(pid)
        return pid

    def state(self) -> dict:
        """/status's "upgrade" of the process that answers (the serving one)."""
        status, body = self.admin_request("GET", "/status")
        assert status == 200, body
        return body["upgrade"]

    def settle(self, old: int):
        """Waits until the old process `old` has exited and the serving one
        says so: the next upgrade may begin."""
        wait_until(lambda: not pid_alive(old), timeout=30, what=f"old process {old} exits")
        wait_until(lambda: self.state()["state"] == "took_over", timeout=15, what="the hand-over is over")

    def stop(self):
        for pid in self.pids:
            if pid_alive(pid):
                os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not any(pid_alive(p) for p in self.pids), timeout=15, what="every process exited")
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)
        # The process that served last removed its pid_file at exit.
        assert not self.pid_file.exists()
        assert not self.log.matches(r"live handles|\[critical\]|\[error\] (?!upgrade failed)"), \
            self.log.matches(r"live handles|\[critical\]|\[error\]")

    def records(self):
        if not self.access_log.exists():
            return []
        return [harness.parse_access_line(l) for l in self.access_log.read_text().splitlines() if l.strip()]


@pytest.fixture
def instance(tmp_path, backends):
    made = []

    def make(handler=harness.echo_handler, **kw):
        b = backends(handler)
        inst = Instance(tmp_path, b.address, **kw)
        made.append(inst)
        return inst

    yield make
    for inst in made:
        try:
            inst.stop()
        finally:
            # Kept beside the instance's files, for a failure's post-mortem.
            (inst.dir / "sluice.log").write_text("\n".join(inst.log.lines))


class ShortClients:
    """Steady short connections (connect, echo, close) until stopped; every
    failure is kept."""

    def __init__(self, addr, threads=2):
        self.addr = addr
        self.stop_flag = threading.Event()
        self.ok = 0
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(threads)]
        for t in self.threads:
            t.start()

    def run(self, i):
        n = 0
        while not self.stop_flag.is_set():
            n += 1
            payload = f"short {i} {n}\n".encode() * 10
            try:
                with socket.create_connection(self.addr, timeout=10) as s:
                    s.sendall(payload)
                    s.shutdown(socket.SHUT_WR)
                    got = harness.recv_all(s)
                if got != payload:
                    raise AssertionError(f"echo mismatch: {len(got)} of {len(payload)} bytes")
                with self.lock:
                    self.ok += 1
            except Exception as e:  # noqa: BLE001 -- every kind of failure counts
                with self.lock:
                    self.failures.append(repr(e))

    def finish(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join(30)
        return self.ok, self.failures


def echo_roundtrip(sock: socket.socket, data: bytes) -> None:
    sock.sendall(data)
    assert harness.recv_exact(sock, len(data)) == data


@pytest.mark.parametrize("workers", [1, 2])
def test_upgrade_keeps_every_connection_and_exits_the_old_process(instance, workers):
    inst = instance(workers=workers)
    old = inst.serving_pid()
    long_plain = harness.connect(*inst.addr())
    echo_roundtrip(long_plain, b"before\n")
    clients = ShortClients(inst.addr())
    wait_until(lambda: clients.ok >= 20, timeout=30, what="short clients running")
    before = inst.version()
    install(inst.bin, harness.sluice_next_bin())
    new = inst.upgrade()
    assert new != old
    # A build with another version string serves now, and said so.
    assert inst.version() == before + "+next"
    inst.log.wait_for(rf"new process {new} \(sluice {re.escape(before)}\+next\) checked its configuration", timeout=10)
    # The old process's executable is the file that was replaced; the new
    # one runs the installed file.
    assert os.readlink(f"/proc/{new}/exe") == str(inst.bin)
    ok_at_upgrade = clients.ok
    wait_until(lambda: clients.ok >= ok_at_upgrade + 20, timeout=30, what="short clients after the upgrade")
    # The old process hands the long session over and exits while it is
    # still open; it carries on in the new one.
    wait_until(lambda: not pid_alive(old), timeout=30, what="the old process exits")
    assert inst.proc.wait(timeout=10) == 0, "the old process's exit status"
    echo_roundtrip(long_plain, b"after\n" * 1000)
    status, body = inst.admin_request("GET", "/status")
    assert status == 200 and body["pid"] == new
    assert body["connections"] >= 1
    long_plain.close()
    ok, failures = clients.finish()
    if failures:
        (inst.dir / "sluice.log").write_text("\n".join(inst.log.lines))
    assert not failures, failures[:5]
    # One record per session: the short ones and the long one.
    wait_until(lambda: len(inst.records()) == ok + 1, timeout=15,
               what=f"{ok + 1} access records (have {len(inst.records())})")
    assert inst.serving_pid() == new


def test_post_upgrade_twice_and_again(instance):
    inst = instance()
    pids = {inst.serving_pid()}
    for via_http in (True, False, True):
        install(inst.bin, harness.sluice_bin())
        before = inst.serving_pid()
        pids.add(inst.upgrade(via_http=via_http))
        # The next upgrade once this one's hand-over is over: one sent while
        # the new process still receives is refused (one at a time).
        inst.settle(before)
        with harness.connect(*inst.addr()) as s:
            echo_roundtrip(s, b"x" * 100)
    assert len(pids) == 4
    for pid in list(pids)[:-1]:
        if pid != inst.serving_pid():
            wait_until(lambda p=pid: not pid_alive(p), timeout=15, what=f"old process {pid} exits")


def test_once_pid_file_names_the_new_process_the_old_one_answers_no_admin_request(instance):
    """A script that reads pid_file and then asks the admin API must reach
    the process pid_file names: the new process names itself only after the
    old one stopped answering on the shared admin socket."""
    inst = instance()
    stale = []
    for _ in range(10):
        install(inst.bin, harness.sluice_bin())
        before = inst.serving_pid()
        stop = threading.Event()
        named = threading.Event()

        def ask():
            # Requests one after another while the upgrade runs; each one
            # sent after pid_file changed must be answered by the new process.
            while not stop.is_set():
                sent_after_change = named.is_set()
                try:
                    status, body = inst.admin_request("GET", "/status")
                except OSError:
                    continue
                if sent_after_change and status == 200 and body["pid"] == before:
                    stale.append(body["pid"])

        askers = [threading.Thread(target=ask, daemon=True) for _ in range(2)]
        for t in askers:
            t.start()
        try:
            os.kill(before, signal.SIGUSR2)
            deadline = time.monotonic() + 30
            while inst.serving_pid() in (None, before) and time.monotonic() < deadline:
                time.sleep(0.0005)
            named.set()
            new = inst.serving_pid()
            assert new not in (None, before), "no new process named itself"
            inst.pids.append(new)
            time.sleep(0.3)
        finally:
            stop.set()
            for t in askers:
                t.join(timeout=15)
        inst.settle(before)
    assert not stale, f"{len(stale)} request(s) sent after pid_file named the new process were answered by the old one"


def failed_upgrade_keeps_serving(inst: Instance, why_rx: str, wait: float = 30):
    serving = inst.serving_pid()
    long_plain = harness.connect(*inst.addr())
    echo_roundtrip(long_plain, b"before\n")
    clients = ShortClients(inst.addr())
    wait_until(lambda: clients.ok >= 10, timeout=30, what="short clients running")
    os.kill(serving, signal.SIGUSR2)
    inst.log.wait_for(r"upgrade failed, this process serves on: " + why_rx, timeout=wait)
    ok_then = clients.ok
    try:
        wait_until(lambda: clients.ok >= ok_then + 10, timeout=30, what="short clients after the failed upgrade")
    except harness.Timeout as e:
        with clients.lock:
            failures = clients.failures[-3:]
        raise AssertionError(f"{e}; last client failures {failures}; sluice's log ends:\n" +
                             "\n".join(inst.log.lines[-150:])) from None
    ok, failures = clients.finish()
    assert not failures, failures[:5]
    echo_roundtrip(long_plain, b"after\n")
    assert inst.serving_pid() == serving
    status, body = inst.admin_request("GET", "/status")
    assert body["pid"] == serving and body["upgrade"]["state"] == "failed", body
    long_plain.close()


def test_new_binary_that_crashes(instance):
    inst = instance()
    install_script(inst.bin, "#!/bin/sh\necho 'broken build' >&2\nexit 1\n")
    failed_upgrade_keeps_serving(inst, r".*exited with status 1 before taking over")
    install(inst.bin, harness.sluice_bin())
    inst.upgrade()


def test_new_binary_missing(instance):
    inst = instance()
    inst.bin.unlink()
    failed_upgrade_keeps_serving(inst, r"cannot start .*")
    install(inst.bin, harness.sluice_bin())
    inst.upgrade()


def test_config_error_at_upgrade(instance):
    inst = instance()
    install(inst.bin, harness.sluice_bin())
    inst.config.write_text(inst.text + "\n[global.nonsense]\n")
    failed_upgrade_keeps_serving(inst, r".*exited with status 1 before taking over")
    inst.config.write_text(inst.text)
    inst.upgrade()


def test_new_binary_that_hangs(instance):
    inst = instance(upgrade_timeout="2s")
    install_script(inst.bin, "#!/bin/sh\nexec sleep 600\n")
    failed_upgrade_keeps_serving(inst, r".*did not take over within upgrade_timeout 2s")
    install(inst.bin, harness.sluice_bin())
    inst.upgrade()


HELLO_OTHER_FORMAT = r'''#!/usr/bin/python3
import os, socket, struct
fd = int(os.environ["SLUICE_UPGRADE_FD"])
s = socket.socket(fileno=fd)
# magic "SLUP", format version 999, kind hello, no fields
s.send(struct.pack("<IIi", 0x50554c53, 999 | (1 << 16), 0))
s.settimeout(10)
print("refusal:", s.recv(65536)[12:].decode(errors="replace"), flush=True)
'''


def test_other_handover_format_is_refused(instance):
    inst = instance()
    install_script(inst.bin, HELLO_OTHER_FORMAT)
    failed_upgrade_keeps_serving(inst, r"the new binary speaks hand-over format 999, this one format \d+: refused")
    install(inst.bin, harness.sluice_bin())
    inst.upgrade()


@pytest.mark.parametrize("splice", ["off", "pipe"])
def test_bulk_transfer_moves_whole(instance, splice):
    # The stream moves at a quiet moment; a busy machine may take a while
    # to give it one, and the old process must not close it meanwhile.
    inst = instance(extra_listeners=f'splice = "{splice}"\n', extra_global='upgrade_finish_timeout = "300s"')
    old = inst.serving_pid()
    # 1 GiB, the size the hand-over is promised for: a saturated stream
    # moves only at a quiet moment, and a longer one has fewer of them
    # (a few seconds per mode on loopback).
    total = 1 << 30
    block = os.urandom(1 << 16)
    sent_hash = hashlib.sha256()
    got_hash = hashlib.sha256()
    got = [0]
    errors = []
    sock = harness.connect(*inst.addr())
    sock.settimeout(60)

    def reader():
        try:
            while got[0] < total:
                data = sock.recv(1 << 18)
                if not data:
                    raise AssertionError(f"EOF after {got[0]} of {total} bytes")
                got_hash.update(data)
                got[0] += len(data)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    sent = 0
    upgraded = False
    while sent < total:
        sock.sendall(block)
        sent_hash.update(block)
        sent += len(block)
        if not upgraded and sent >= total // 4:
            install(inst.bin, harness.sluice_next_bin())
            os.kill(old, signal.SIGUSR2)
            upgraded = True
    t.join(600)
    assert not t.is_alive(), f"reader still running after 600 s: {got[0]} of {total} bytes"
    assert not errors, errors
    assert got[0] == total and got_hash.hexdigest() == sent_hash.hexdigest()
    # The transfer went on in the new process: the old one is gone while
    # the session is still open.
    wait_until(lambda: inst.serving_pid() != old, timeout=30, what="a new process serves")
    inst.pids.append(inst.serving_pid())
    wait_until(lambda: not pid_alive(old), timeout=30, what="the old process exits")
    echo_roundtrip(sock, b"still here\n")
    sock.close()
    wait_until(lambda: len(inst.records()) == 1, timeout=15, what="one access record")
    rec = inst.records()[0]
    assert int(rec["bytes_in"]) == total + len(b"still here\n"), rec


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# ThreadSanitizer makes a round ten times slower: 25 rounds there (every
# round takes the same paths between threads); the default build and
# AddressSanitizer run all 100, whose flat descriptors and memory this
# test is also about.
SOAK_ROUNDS = 25 if "TSAN_OPTIONS" in os.environ else 100
SOAK_SESSIONS = 1000


def patient_echo(backend, conn):
    """Echoes as harness.echo_handler does, with no idle limit of its own."""
    conn.settimeout(None)
    harness.echo_handler(backend, conn)


def test_soak_upgrades_back_and_forth(instance):
    """100 upgrades, alternating the build under test and one with another
    version string, with 1 000 live sessions that move every time: each
    round the new version serves, the old process exits (so it handed every
    session over), sampled sessions still echo; at the end every session
    echoes, each has one access record, and the serving process's
    descriptors and memory stay flat."""
    harness.raise_nofile(4 * SOAK_SESSIONS + 1024)
    # Moving 1 000 sessions may take longer than upgrade_timeout's 5 s
    # on a sanitized build; the deadline is not what this test tries.
    # The sessions idle for many rounds: longer than the test backend's
    # usual 60 s idle limit on a slow (sanitized, busy) machine.
    inst = instance(patient_echo, workers=2, extra_global='upgrade_finish_timeout = "60s"')
    first = inst.version()
    builds = [(harness.sluice_next_bin(), first + "+next"), (harness.sluice_bin(), first)]
    sessions = []
    for i in range(SOAK_SESSIONS):
        s = harness.connect(*inst.addr())
        echo_roundtrip(s, f"session {i}\n".encode())
        sessions.append(s)
    fds, rss = [], []
    for round_ in range(SOAK_ROUNDS):
        old = inst.serving_pid()
        binary, version = builds[round_ % 2]
        install(inst.bin, binary)
        new = inst.upgrade()
        wait_until(lambda: not pid_alive(old), timeout=60, what=f"old process {old} exits (round {round_})")
        assert inst.version() == version, f"round {round_}"
        # A different tenth of the sessions each round.
        for i in range(round_ % 10, SOAK_SESSIONS, 10):
            echo_roundtrip(sessions[i], f"round {round_}\n".encode())
        fds.append(fd_count(new))
        rss.append(rss_kb(new))
    for i, s in enumerate(sessions):
        echo_roundtrip(s, f"end {i}\n".encode())
    # Flat: every process holds the same sessions, so the same descriptors;
    # memory as the early rounds (after allocators warmed up), give or take.
    print(f"soak: descriptors {fds[2]}..{max(fds[2:])}, RSS {rss[2]}..{max(rss[2:])} KiB")
    assert max(fds[2:]) <= fds[2] + 4, fds
    assert max(rss[2:]) <= rss[2] * 1.5 + 4096, rss
    for s in sessions:
        s.close()
    wait_until(lambda: len(inst.records()) == SOAK_SESSIONS, timeout=60,
               what="one access record per session")
    recs = inst.records()
    assert all(r["cause"] == "client_closed" for r in recs), {r["cause"] for r in recs}


STREAM_BLOCK = 64 * 1024
STREAM_BLOCKS = 4096  # 256 MiB: more than the slow reader takes in the time allowed


def stream_block(i: int) -> bytes:
    return struct.pack("<Q", i) * (STREAM_BLOCK // 8)


def stream_handler(backend, conn):
    """Streams STREAM_BLOCKS blocks, then waits for the client's FIN: the
    session is never half closed while it may move."""
    try:
        for i in range(STREAM_BLOCKS):
            conn.sendall(stream_block(i))
        while conn.recv(65536):
            pass
    except OSError:
        pass


def test_session_with_bytes_queued_moves_without_waiting(tmp_path, backends):
    """A server that streams to a client slower than itself keeps sluice's
    queue toward the client from emptying for long; such a session moves
    with the queued bytes sent along, so the old process exits at once while
    the stream goes on, and the client gets every byte in order."""
    b = backends(handler=stream_handler)
    inst = Instance(tmp_path, b.address)
    try:
        sock = harness.connect(*inst.addr())
        fast = threading.Event()
        got = {"n": 0, "sha": hashlib.sha256(), "error": None}

        def reader():
            try:
                while got["n"] < STREAM_BLOCK * STREAM_BLOCKS:
                    chunk = sock.recv(1024 if not fast.is_set() else 1 << 20)
                    if not chunk:
                        break
                    got["sha"].update(chunk)
                    got["n"] += len(chunk)
                    if not fast.is_set():
                        time.sleep(0.01)
            except Exception as e:  # noqa: BLE001 -- reported below
                got["error"] = repr(e)

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        # The stream gets far ahead of the reader: every buffer on the way
        # fills, and sluice's queue toward the client stays full.
        wait_until(lambda: got["n"] >= 16 * 1024, timeout=30, what="the stream has begun")
        time.sleep(2)
        old = inst.serving_pid()
        try:
            install(inst.bin, harness.sluice_next_bin())
            inst.upgrade()
            serving_at = got["n"]
            wait_until(lambda: not pid_alive(old), timeout=60,
                       what=f"the old process exits while the stream goes on ({got['n']} bytes read)")
            exited_at = got["n"]
        finally:
            fast.set()
        # The session did not wait for the reader to make room: the old
        # process left before the reader took another 256 KiB (at its pace
        # of 100 KB/s, 2.6 s). A session that must first empty its queue
        # waits for the kernel's send buffer to drain by a third: 1 to 4 MB
        # read here before sessions carried their pending bytes.
        assert exited_at - serving_at < 256 * 1024, (serving_at, exited_at)
        assert exited_at < STREAM_BLOCK * STREAM_BLOCKS, "the stream ended before the old process"
        t.join(120)
        assert not t.is_alive() and got["error"] is None, got
        want = hashlib.sha256()
        for i in range(STREAM_BLOCKS):
            want.update(stream_block(i))
        assert got["n"] == STREAM_BLOCK * STREAM_BLOCKS and got["sha"].hexdigest() == want.hexdigest()
        sock.close()
        wait_until(lambda: len(inst.records()) == 1, timeout=15, what="one access record")
        rec = inst.records()[0]
        assert int(rec["bytes_out"]) == STREAM_BLOCK * STREAM_BLOCKS, rec
    finally:
        inst.stop()


def test_tls_preread_session_moves_with_its_sni(instance, tmp_path, backends):
    """A session routed by its ClientHello (preread = "tls") moves like any
    other: the TLS stream between client and server goes on, and its one
    access record keeps the SNI learnt before the move."""
    import ssl
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=db.example",
                    "-keyout", str(key), "-out", str(cert), "-days", "1"], check=True, capture_output=True)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)

    def tls_echo(backend, conn):
        with server_ctx.wrap_socket(conn, server_side=True) as t:
            while True:
                data = t.recv(65536)
                if not data:
                    break
                t.sendall(data)

    b = backends(tls_echo, name="tls")
    (tmp_path / "tls").mkdir()
    inst = Instance(tmp_path / "tls", b.address, extra_listeners='preread = "tls"\n',
                    route='default_upstream = "up"')
    try:
        client_ctx = ssl.create_default_context(cafile=str(cert))
        raw = harness.connect(*inst.addr())
        t = client_ctx.wrap_socket(raw, server_hostname="db.example")
        echo_roundtrip(t, b"hello over tls\n")
        old = inst.serving_pid()
        install(inst.bin, harness.sluice_next_bin())
        inst.upgrade()
        wait_until(lambda: not pid_alive(old), timeout=30, what="the old process exits")
        assert inst.proc.wait(timeout=10) == 0
        assert inst.version().endswith("+next")
        echo_roundtrip(t, b"still over tls\n" * 100)
        t.close()
        wait_until(lambda: len(inst.records()) == 1, timeout=15, what="one access record")
        assert inst.records()[0]["sni"] == "db.example", inst.records()
    finally:
        inst.stop()


def test_server_drain_and_weight_carry_over(instance):
    inst = instance()
    addr = inst.text.split('address = "')[1].split('"')[0]
    assert inst.admin_request("PUT", f"/upstreams/up/servers/{addr}/weight", body="7")[0] == 200
    assert inst.admin_request("POST", f"/upstreams/up/servers/{addr}/drain")[0] == 200
    install(inst.bin, harness.sluice_bin())
    new = inst.upgrade()
    status, body = inst.admin_request("GET", "/status")
    assert body["pid"] == new
    srv = [s for u in body["upstreams"] if u["name"] == "up" for s in u["servers"]][0]
    assert (srv["weight"], srv["admin"]) == (7, "drain"), srv


def test_passive_down_server_stays_down_after_upgrade(tmp_path, backends):
    """A server that passive health took out (max_fails failed connects) is
    still out in the new process, for the rest of its fail_timeout: the new
    process does not send clients to it to find out again."""
    live = backends().address
    (tmp_path / "p").mkdir()
    inst = Instance(tmp_path / "p", live, route='upstream = "pas"', extra_listeners=f'''
[upstream.pas]
max_fails = 1
fail_timeout = "60s"
balance = "round_robin"
servers = [{{ address = "127.0.0.1:{harness.dead_port("127.0.0.1")}" }}, {{ address = "{live}" }}]
''')
    try:
        passive_down_carries_over(inst, live)
    finally:
        inst.stop()


def passive_down_carries_over(inst: Instance, live: str):
    def dead_server():
        body = inst.admin_request("GET", "/status")[1]
        return [s for u in body["upstreams"] if u["name"] == "pas" for s in u["servers"] if s["address"] != live][0]

    # Connections go round; the dead server fails a connect (the session is
    # retried on the live one) and passive health takes it out.
    for i in range(4):
        with harness.connect(*inst.addr()) as s:
            echo_roundtrip(s, f"before {i}\n".encode())
    wait_until(lambda: dead_server()["passive"] == "down", timeout=15, what="passive health took the server out")
    failures = dead_server()["passive_failures"]
    install(inst.bin, harness.sluice_bin())
    new = inst.upgrade()
    srv = dead_server()
    assert inst.admin_request("GET", "/status")[1]["pid"] == new
    assert srv["passive"] == "down", srv
    assert srv["passive_failures"] == failures, srv
    # Still down: the new process does not try it again within fail_timeout.
    for i in range(4):
        with harness.connect(*inst.addr()) as s:
            echo_roundtrip(s, f"after {i}\n".encode())
    srv = dead_server()
    assert srv["passive"] == "down" and srv["passive_failures"] == failures, srv


def served(sock: socket.socket) -> bool:
    """True when an echo comes back, False when sluice closed the connection."""
    try:
        sock.sendall(b"ping\n")
        return harness.recv_exact(sock, 5) == b"ping\n"
    except (ConnectionError, OSError, AssertionError, EOFError):
        return False


def test_client_limit_counts_carry_over(instance):
    """client_max_connections stays exact across an upgrade: the sessions a
    client had open in the old process count against it in the new one."""
    inst = instance(extra_listeners="client_max_connections = 2\n")
    held = [harness.connect(*inst.addr()) for _ in range(2)]
    try:
        assert all(served(s) for s in held)
        extra = harness.connect(*inst.addr())
        assert not served(extra), "a third connection got in before the upgrade"
        extra.close()
        old = inst.serving_pid()
        install(inst.bin, harness.sluice_bin())
        inst.upgrade()
        wait_until(lambda: not pid_alive(old), timeout=30, what="the old process exits")
        assert all(served(s) for s in held)
        extra = harness.connect(*inst.addr())
        assert not served(extra), "a third connection got in after the upgrade"
        extra.close()
        # One leaves: the next one is served again.
        n = len(inst.records())
        held.pop().close()
        wait_until(lambda: len(inst.records()) > n, timeout=15, what="the closed session's record")
        again = harness.connect(*inst.addr())
        held.append(again)
        assert served(again)
    finally:
        for s in held:
            s.close()


def test_client_rate_limit_buckets_carry_over(instance):
    """client_rate_limit stays in force across an upgrade: a client that has
    used up its allowance is still refused by the new process, until its
    bucket refills (it does not start again with a full one)."""
    # "2/m": a bucket of one token that refills in 30 s, far longer than an
    # upgrade takes even on a busy machine (checked below, not assumed).
    inst = instance(extra_listeners='client_rate_limit = "2/m"\n')
    used = time.monotonic()
    with harness.connect(*inst.addr()) as s:
        assert served(s), "the first connection was refused"
    with harness.connect(*inst.addr()) as s:
        assert not served(s), "a second connection got in before the upgrade"
    old = inst.serving_pid()
    install(inst.bin, harness.sluice_next_bin())
    new = inst.upgrade()
    wait_until(lambda: not pid_alive(old), timeout=30, what="the old process exits")
    with harness.connect(*inst.addr()) as s:
        refused_after = not served(s)
    took = time.monotonic() - used
    assert took < 25, f"the upgrade took {took:.1f}s: the bucket may have refilled, nothing shown"
    assert refused_after, "the new process gave the client a fresh allowance"
    # Refused for its rate (a refusal has no access record; the error log
    # names the cause), once by each process.
    inst.log.wait_for(r"connection from 127\.0\.0\.1:\d+ refused \(rate_limited\)", count=2)
    inst.log.wait_for(r"the client_rate_limit buckets of 1 client address\(es\) carried over")
    assert inst.admin_request("GET", "/status")[1]["pid"] == new
    # Once the bucket has refilled (30 s after the allowance was used), the
    # client is served again, by the new process.
    def served_again():
        with harness.connect(*inst.addr()) as s:
            return served(s)
    wait_until(served_again, timeout=90, interval=1, what="the client served again after the refill")
    assert time.monotonic() - used >= 29, "served again before its bucket could refill"


HANDOVER_FORMAT = 5  # src/upgrade/channel.hpp, kFormatVersion


def handover_message(kind: int, fields: list[bytes], version: int = HANDOVER_FORMAT) -> bytes:
    """One hand-over datagram: magic "SLUP", version | kind << 16, the field
    count, then each field's length and bytes."""
    body = struct.pack("<III", 0x50554c53, version | (kind << 16), len(fields))
    for f in fields:
        body += struct.pack("<I", len(f)) + f
    return body


@pytest.mark.parametrize("fields,why", [
    ([b"main", b"not an address", b"0", b"10"], "entry 1 is not an address, tokens and age"),
    ([b"main", b"::ffff:127.0.0.1", b"0", b"10", b"::1", b"-1", b"10"], "entry 2 is not an address, tokens and age"),
    ([b"main", b"::ffff:127.0.0.1", b"500"], "3 fields"),
    ([b"main"], "1 fields"),
], ids=["address", "tokens", "cut-short", "empty"])
def test_malformed_client_message_is_refused(tmp_path, backends, fields, why):
    """A new process handed a client message it cannot read refuses the
    hand-over (and so starts nothing) rather than guess."""
    proc, ours = start_taking_over(tmp_path, backends)
    try:
        ours.send(handover_message(9, fields))
        out, _ = proc.communicate(timeout=harness.START_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ours.close()
    text = out.decode(errors="replace")
    assert proc.returncode != 0, text
    assert f"upgrade: a malformed client message: {why}" in text, text
    assert "listening on" not in text, text


def test_client_message_for_another_listener_is_ignored(tmp_path, backends):
    proc, ours = start_taking_over(tmp_path, backends)
    try:
        ours.send(handover_message(9, [b"gone", b"::ffff:127.0.0.1", b"0", b"10"]))
        ours.send(handover_message(9, [b"main", b"::ffff:127.0.0.2", b"0", b"10"]))
        ours.send(handover_message(5, []))  # go
        ready = ours.recv(65536)
        assert ready[:8] == struct.pack("<II", 0x50554c53, HANDOVER_FORMAT | (6 << 16)), ready
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=harness.START_TIMEOUT)
        ours.close()
    text = out.decode(errors="replace")
    assert "the client_rate_limit buckets of 1 client address(es) carried over" in text, text
    assert "listening on" in text, text


def start_taking_over(tmp_path: Path, backends):
    """sluice started as the new process of an upgrade, with this test as
    the serving process at the other end of the channel; returns it and our
    end once its hello has come."""
    config = tmp_path / "sluice.toml"
    config.write_text(f"""
[[listener]]
name = "main"
listen = "127.0.0.1:0"
upstream = "up"
client_rate_limit = "2/m"

[upstream.up]
servers = [{{ address = "{backends().address}" }}]
""")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    env = dict(os.environ, SLUICE_UPGRADE_FD=str(theirs.fileno()))
    proc = subprocess.Popen([str(harness.sluice_bin()), "-c", str(config)], pass_fds=[theirs.fileno()], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    theirs.close()
    try:
        ours.settimeout(harness.START_TIMEOUT)
        hello = ours.recv(65536)
        assert hello[:8] == struct.pack("<II", 0x50554c53, HANDOVER_FORMAT | (1 << 16)), hello
    except BaseException:
        proc.kill()
        proc.wait()
        ours.close()
        raise
    return proc, ours


def test_more_client_buckets_than_one_message_holds_carry_over(instance):
    """1 500 limited client addresses take several client messages: every
    bucket arrives, the first, a middle and the last one alike."""
    inst = instance(extra_listeners='client_rate_limit = "1/h"\n')
    n = 1500
    sources = [f"127.1.{i // 250}.{i % 250 + 1}" for i in range(n)]
    for src in sources:
        with socket.create_connection(inst.addr(), timeout=10, source_address=(src, 0)):
            pass
    wait_until(lambda: len(inst.records()) == n, timeout=60, what=f"{n} access records")
    old = inst.serving_pid()
    install(inst.bin, harness.sluice_next_bin())
    inst.upgrade()
    sent = inst.log.wait_for(rf"handed over the client_rate_limit buckets of {n} client address\(es\) in (\d+) message")
    assert int(sent.group(1)) >= 2, sent.group(0)
    inst.log.wait_for(rf"the client_rate_limit buckets of {n} client address\(es\) carried over")
    wait_until(lambda: not pid_alive(old), timeout=30, what="the old process exits")
    for src in (sources[0], sources[n // 2], sources[-1]):
        with socket.create_connection(inst.addr(), timeout=10, source_address=(src, 0)) as s:
            assert not served(s), f"{src} got a fresh allowance"
    # An address not seen before has its full bucket.
    with socket.create_connection(inst.addr(), timeout=10, source_address=("127.2.0.1", 0)) as s:
        assert served(s)
