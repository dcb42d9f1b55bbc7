"""Binary upgrade with a real PostgreSQL session open: one `psql` connection
through sluice carries on across SIGUSR2, on the same server backend, while
the old process exits (docs/operations.md, "Upgrading the binary")."""

from __future__ import annotations

import os
import signal
import subprocess
import threading

import pytest

import dbpeers
import harness
from harness import wait_until
from test_upgrade import Instance, install, pid_alive


@pytest.fixture
def pg_server():
    why = dbpeers.pg_missing()
    if why:
        pytest.skip(why)
    with dbpeers.pg_cluster_pair() as (a, _b), dbpeers.pg_servers((a,)) as (srv,):
        yield srv


class Psql:
    """One interactive psql connection, fed queries on its stdin; each answer
    is read back from its stdout by a tag the query prints."""

    def __init__(self, host: str, port: int):
        env = dbpeers.clean_env(PGSSLMODE="disable", PGGSSENCMODE="disable", PGCONNECT_TIMEOUT="10")
        self.proc = subprocess.Popen(
            [str(dbpeers.PG_BIN / "psql"), "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1",
             "-h", host, "-p", str(port), "-U", dbpeers.PG_USER, "-d", "postgres"],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.log = harness.LineLog(self.proc.stdout)
        self.n = 0

    def scalar(self, sql: str) -> str:
        self.n += 1
        tag = f"answer{self.n}"
        self.proc.stdin.write(f"select '{tag}:' || ({sql})::text;\n".encode())
        self.proc.stdin.flush()
        return self.log.wait_for(rf"^{tag}:(.*)$", timeout=30).group(1)

    def scalar_after(self, statement: str, sql: str) -> str:
        """Runs `statement`, then answers `sql` as scalar() does: the answer
        comes only once the statement has succeeded."""
        self.proc.stdin.write(f"{statement};\n".encode())
        return self.scalar(sql)

    def close(self) -> int:
        if self.proc.poll() is None:
            self.proc.stdin.write(b"\\q\n")
            self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
            raise


def test_psql_session_survives_an_upgrade(tmp_path, pg_server):
    inst = Instance(tmp_path, pg_server.address)
    psql = None
    try:
        host, port = inst.addr()
        psql = Psql(host, port)
        backend = psql.scalar("select pg_backend_pid()")
        assert backend.isdigit(), psql.log.text()
        assert psql.scalar("select 6 * 7") == "42"
        old = inst.serving_pid()
        install(inst.bin, harness.sluice_next_bin())
        os.kill(old, signal.SIGUSR2)
        wait_until(lambda: inst.serving_pid() not in (None, old), timeout=30, what="a new process serves")
        inst.pids.append(inst.serving_pid())
        # The old process hands the idle psql session over and exits while it
        # is still open.
        wait_until(lambda: not pid_alive(old), timeout=30, what="the old process exits")
        assert inst.proc.wait(timeout=10) == 0, "the old process's exit status"
        # Same connection, same backend: the server never saw a new session.
        assert psql.scalar("select pg_backend_pid()") == backend
        assert psql.scalar("select count(*) from generate_series(1, 1000)") == "1000"
        assert psql.close() == 0, psql.log.text()
        psql = None
        wait_until(lambda: len(inst.records()) == 1, timeout=15, what="one access record")
        # psql's \q sends Terminate and closes at once; PostgreSQL closes
        # on Terminate. Which end's close sluice reads first is a race: both
        # are a clean end, neither an error nor a cut.
        assert inst.records()[0]["cause"] in ("client_closed", "server_closed"), inst.records()
    finally:
        if psql is not None:
            psql.proc.kill()
            psql.proc.wait(timeout=5)
        inst.stop()


def test_writes_through_upgrades_are_all_kept(tmp_path, pg_server):
    """Four psql sessions insert one row at a time while sluice is upgraded
    twice (a build with another version string, then back): every insert
    PostgreSQL acknowledged is in the table, no session is cut, and each
    stays on its own server backend throughout."""
    inst = Instance(tmp_path, pg_server.address)
    sessions: list[Psql] = []
    try:
        host, port = inst.addr()
        setup = Psql(host, port)
        setup.proc.stdin.write(b"create table if not exists upgrade_writes (writer int, n int);\n"
                               b"truncate upgrade_writes;\n")
        setup.proc.stdin.flush()
        assert setup.scalar("select count(*) from upgrade_writes") == "0"
        assert setup.close() == 0
        sessions = [Psql(host, port) for _ in range(4)]
        backends = [p.scalar("select pg_backend_pid()") for p in sessions]
        acknowledged = [0] * len(sessions)
        errors: list[str] = []
        stop = threading.Event()

        def write(i: int) -> None:
            p = sessions[i]
            try:
                while not stop.is_set():
                    n = acknowledged[i] + 1
                    # The tag comes back only once the insert committed
                    # (ON_ERROR_STOP ends psql at a failed statement).
                    assert p.scalar_after(f"insert into upgrade_writes values ({i}, {n})", "'ok'") == "ok"
                    acknowledged[i] = n
            except Exception as e:  # noqa: BLE001 -- reported below
                errors.append(f"writer {i}: {e!r}")

        writers = [threading.Thread(target=write, args=(i,), daemon=True) for i in range(len(sessions))]
        for t in writers:
            t.start()
        for binary in (harness.sluice_next_bin(), harness.sluice_bin()):
            wait_until(lambda: min(acknowledged) >= 20 or errors, timeout=60, what="writes going on")
            at_upgrade = list(acknowledged)
            old = inst.serving_pid()
            install(inst.bin, binary)
            inst.upgrade()
            inst.settle(old)
            wait_until(lambda: all(a >= b + 20 for a, b in zip(acknowledged, at_upgrade)) or errors, timeout=60,
                       what="writes going on after the upgrade")
        stop.set()
        for t in writers:
            t.join(60)
        assert not errors, errors
        for i, p in enumerate(sessions):
            assert p.scalar("select pg_backend_pid()") == backends[i], f"session {i} moved to another backend"
            assert p.scalar(f"select count(*) from upgrade_writes where writer = {i}") == str(acknowledged[i])
            assert p.scalar(f"select count(distinct n) from upgrade_writes where writer = {i}") == str(acknowledged[i])
        for p in sessions:
            assert p.close() == 0, p.log.text()
        sessions = []
        wait_until(lambda: len(inst.records()) == 5, timeout=15, what="one access record per session")
        assert all(r["cause"] in ("client_closed", "server_closed") for r in inst.records()), inst.records()
    finally:
        for p in sessions:
            p.proc.kill()
            p.proc.wait(timeout=5)
        inst.stop()
