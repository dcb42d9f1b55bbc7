"""Acknowledged writes across failovers, counted with real databases.

A steady writer sends one write every few milliseconds, through sluice and,
beside it, straight to the database (what a client without sluice does),
while a failover happens: a planned and an unplanned Redis Sentinel
failover, a PostgreSQL standby promoted beside a live primary (split
brain), a MariaDB switchover, and each again with a binary upgrade of
sluice (SIGUSR2) in the middle. Every write is unique (its own key or row);
afterwards the writes each writer saw acknowledged are looked up on the
surviving primary, and the missing ones are the writes lost.

The figures are printed (pytest -s) and go into docs/reliability.md. The
bounds asserted are the ones the project promises: at most 5 writes lost in
a planned Sentinel failover, none sent to a fenced PostgreSQL primary after
its fence, none lost to an upgrade, no session cut by it."""

from __future__ import annotations

import os
import re
import signal
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

import dbpeers
import harness
import mariadb_peers
from dbpeers import PgConn, RespConn
from test_sentinel import MASTER, REDIS_SENTINEL, Cluster, SwitchWatcher, call
from test_upgrade import install, pid_alive

PERIOD = 0.002           # one write every 2 ms, per writer
SETTLE_WRITES = 150      # acknowledged before the failover starts
AFTER_WRITES = 150       # acknowledged on the new primary before the end
DEADLINE = 60.0          # generous: the databases' own failover is in it


# --------------------------------------------------------------------------
# writers
# --------------------------------------------------------------------------

class Writer(threading.Thread):
    """One write every PERIOD on one connection, reconnecting after any
    error. Each attempt has its own sequence number; an attempt counts only
    when the server acknowledged it. Subclasses say how to connect and how
    to write `seq`, returning which server took it."""

    def __init__(self, name: str):
        super().__init__(daemon=True, name=name)
        self.acked: list[tuple[int, float, object]] = []  # (seq, monotonic time, server)
        self.errors: list[tuple[float, str]] = []
        self.stopping = threading.Event()
        self.seq = 0
        self.conn = None

    def connect(self):
        raise NotImplementedError

    def write(self, seq: int):
        raise NotImplementedError

    def close_conn(self):
        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass
        self.conn = None

    def run(self):
        next_at = time.monotonic()
        while not self.stopping.is_set():
            self.seq += 1
            seq = self.seq
            try:
                if self.conn is None:
                    self.conn = self.connect()
                server = self.write(seq)
                self.acked.append((seq, time.monotonic(), server))
            except (OSError, AssertionError, dbpeers.PgError, ValueError) as e:
                self.errors.append((time.monotonic(), str(e)[:120]))
                self.close_conn()
            next_at = max(next_at + PERIOD, time.monotonic())
            time.sleep(max(0.0, next_at - time.monotonic()))
        self.close_conn()

    def stop(self):
        self.stopping.set()
        self.join(timeout=30)

    def count(self) -> int:
        return len(self.acked)

    def wait_acked(self, n: int, timeout: float = DEADLINE):
        want = self.count() + n
        harness.wait_until(lambda: self.count() >= want, timeout=timeout,
                           what=f"{self.name}: {n} more acknowledged writes (errors: {self.errors[-3:]})")

    def longest_gap_ms(self) -> float:
        times = [t for _, t, _ in self.acked]
        return max((b - a for a, b in zip(times, times[1:])), default=0.0) * 1000


class RedisWriter(Writer):
    """INCR w:<seq> (a key per write, so each one can be looked up)."""

    def __init__(self, name: str, address, prefix: str):
        super().__init__(name)
        self.address = address  # (host, port), or a callable giving it
        self.prefix = prefix

    def connect(self):
        host, port = self.address() if callable(self.address) else self.address
        return RespConn(host, port, timeout=10.0)

    def write(self, seq: int):
        got = self.conn.call("INCR", f"{self.prefix}:{seq}")
        if got != 1:
            raise AssertionError(f"INCR answered {got!r}")
        return None

    def lost_on(self, port: int) -> list[int]:
        """Acknowledged writes that redis-server on `port` does not have."""
        seqs = [s for s, _, _ in self.acked]
        missing = []
        with RespConn("127.0.0.1", port, timeout=30.0) as c:
            for i in range(0, len(seqs), 500):
                chunk = seqs[i:i + 500]
                values = c.call("MGET", *[f"{self.prefix}:{s}" for s in chunk])
                missing += [s for s, v in zip(chunk, values) if v is None]
        return missing


class PgWriter(Writer):
    """INSERT INTO writes VALUES (<seq>) RETURNING the port of the server that took it."""

    def __init__(self, name: str, address, table: str):
        super().__init__(name)
        self.address = address
        self.table = table

    def connect(self):
        host, port = self.address
        return PgConn(host, port, timeout=10.0)

    def write(self, seq: int):
        rows = self.conn.query(f"INSERT INTO {self.table} VALUES ({seq}) RETURNING current_setting('port')")
        return int(rows[0][0])

    def lost_on(self, port: int) -> list[int]:
        with PgConn("127.0.0.1", port, timeout=30.0) as c:
            have = {int(r[0]) for r in c.query(f"SELECT n FROM {self.table}")}
        return [s for s, _, _ in self.acked if s not in have]


class MariaWriter(Writer):
    """INSERT ... RETURNING through a `mariadb` client fed on its stdin
    (batch mode, one client process per connection, a new one when the
    connection is lost); a write counts once its RETURNING row is printed,
    which happens only when the INSERT succeeded."""

    LOST = re.compile(r"ERROR (2002|2003|2006|2013)")

    def __init__(self, name: str, address, table: str):
        super().__init__(name)
        self.address = address
        self.table = table

    def _spawn(self):
        host, port = self.address
        return subprocess.Popen(
            [mariadb_peers.MARIADB, "--no-defaults", "-h", host, "-P", str(port), "-u", "app",
             "--password=app-secret", "-N", "-B", "-n", "--force", "--connect-timeout=10"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)

    def run(self):
        next_at = time.monotonic()
        while not self.stopping.is_set():
            proc = self._spawn()
            lost = threading.Event()
            reader = threading.Thread(target=self._read, args=(proc, lost), daemon=True)
            reader.start()
            while not self.stopping.is_set() and not lost.is_set() and proc.poll() is None:
                self.seq += 1
                try:
                    proc.stdin.write(f"INSERT INTO {self.table} VALUES ({self.seq}, @@server_id) "
                                     f"RETURNING n, server;\n")
                    proc.stdin.flush()
                except OSError:
                    break
                next_at = max(next_at + PERIOD, time.monotonic())
                time.sleep(max(0.0, next_at - time.monotonic()))
            try:
                proc.stdin.close()
            except OSError:
                pass
            if lost.is_set():
                proc.kill()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            reader.join(timeout=10)
            if not self.stopping.is_set():
                time.sleep(PERIOD)

    def _read(self, proc, lost: threading.Event):
        for line in proc.stdout:
            m = re.fullmatch(r"(\d+)\t(\d+)", line.strip())
            if m:
                self.acked.append((int(m.group(1)), time.monotonic(), int(m.group(2))))
            elif line.strip():
                self.errors.append((time.monotonic(), line.strip()[:120]))
                if self.LOST.search(line):
                    lost.set()

    def lost_on(self, server: mariadb_peers.MariaDb) -> list[int]:
        out = server.sql(f"SELECT n FROM {self.table}")
        have = {int(x) for x in out.split()} if out else set()
        return [s for s, _, _ in self.acked if s not in have]


def report(kind: str, through: Writer, lost: list[int], direct: Writer | None = None,
           direct_lost: list[int] | None = None):
    line = (f"\n[lost writes] {kind}: through sluice {through.count()} acknowledged, {len(lost)} lost, "
            f"longest pause {through.longest_gap_ms():.0f} ms")
    if direct is not None:
        line += (f"; straight to the database {direct.count()} acknowledged, {len(direct_lost)} lost, "
                 f"longest pause {direct.longest_gap_ms():.0f} ms")
    print(line, end="")


# --------------------------------------------------------------------------
# sluice, upgradable
# --------------------------------------------------------------------------

class UpgradableSluice:
    """sluice from a copy of the binary under test, with a pid_file, so that
    SIGUSR2 can start the next build in its place; follows the serving
    process."""

    def __init__(self, tmp_path: Path, config_text: str):
        self.bin = tmp_path / "bin" / "sluice"
        self.bin.parent.mkdir(exist_ok=True)
        shutil.copy2(harness.sluice_bin(), self.bin)
        self.pid_file = tmp_path / "sluice.pid"
        self.access_log = tmp_path / "access.log"
        self.config = tmp_path / "sluice.toml"
        self.config.write_text(config_text.replace("@ACCESS@", str(self.access_log))
                               .replace("@PID@", str(self.pid_file)))
        self.proc = subprocess.Popen([str(self.bin), "-c", str(self.config)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
        self.log = harness.LineLog(self.proc.stdout)
        m = self.log.wait_for(r'listener "main" listening on (?P<addr>\S+)', timeout=harness.START_TIMEOUT)
        self.addr = harness.split_addr(m.group("addr"))
        m = self.log.wait_for(r"admin API listening on (?P<addr>\S+)", timeout=harness.START_TIMEOUT)
        self.admin = harness.split_addr(m.group("addr"))
        harness.wait_until(lambda: self.serving_pid() == self.proc.pid, what="the pid_file")
        self.pids = [self.proc.pid]

    def serving_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def upgrade(self):
        """Installs the next build and sends SIGUSR2; returns at once."""
        install(self.bin, harness.sluice_next_bin())
        before = self.serving_pid()
        os.kill(before, signal.SIGUSR2)
        return before

    def wait_upgraded(self, before: int):
        harness.wait_until(lambda: self.serving_pid() not in (None, before), timeout=30,
                           what="a new process serves")
        self.pids.append(self.serving_pid())
        harness.wait_until(lambda: not pid_alive(before), timeout=30, what="the old process exits")

    def records(self) -> list[dict]:
        if not self.access_log.exists():
            return []
        return [harness.parse_access_line(l) for l in self.access_log.read_text().splitlines() if "cause=" in l]

    def status(self) -> dict:
        import json
        import urllib.request
        with urllib.request.urlopen(f"http://{self.admin[0]}:{self.admin[1]}/status", timeout=10) as r:
            return json.loads(r.read())

    def stop(self):
        for pid in self.pids:
            if pid_alive(pid):
                os.kill(pid, signal.SIGTERM)
        harness.wait_until(lambda: not any(pid_alive(p) for p in self.pids), timeout=15, what="sluice exits")
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)
        self.log.join()


def config(upstream: str, health: str = "") -> str:
    return f"""
[global]
workers = 2
access_log = "@ACCESS@"
pid_file = "@PID@"
shutdown_timeout = "2s"
upgrade_timeout = "10s"

[admin]
listen = "127.0.0.1:0"

[[listener]]
name = "main"
listen = "127.0.0.1:0"
upstream = "db"
tries = 1

[upstream.db]
queue = 200
queue_timeout = "20s"
{upstream}
{health}
"""


# Causes a failover (or an upgrade) may end a writer's session with; a
# session the upgrade itself cut would end otherwise (shutdown, reset).
FAILOVER_CAUSES = {"fenced", "server_down", "server_closed", "client_closed", "server_reset", "client_reset"}


def check_upgrade(s: UpgradableSluice):
    """Nothing the upgrade did cut a session: every session that had moved
    bytes ended by the failover, or by its client, and the old process
    handed the rest over; no client was left waiting in the old process's
    queue. (Clients refused while no server was the primary, no_server or
    connect_failed, moved nothing.)"""
    records = s.records()
    bad = [r for r in records if r.get("cause") not in FAILOVER_CAUSES
           and (r.get("bytes_in", "0") != "0" or r.get("bytes_out", "0") != "0")]
    assert not bad, bad
    left = [r for r in records if r.get("cause") == "queue_timeout"]
    assert not left, left
    assert not s.log.matches(r"\[critical\]|live handles"), s.log.text()


# --------------------------------------------------------------------------
# Redis Sentinel
# --------------------------------------------------------------------------

@pytest.fixture
def cluster(tmp_path):
    why = dbpeers.redis_missing()
    if why:
        pytest.skip(why)
    if REDIS_SENTINEL is None:
        pytest.skip("redis-sentinel not found")
    c = None
    try:
        c = Cluster(tmp_path / "redis")
        c.wait_ready()
        yield c
    finally:
        if c is not None:
            c.stop()


class SentinelFollower:
    """What a Sentinel-aware client does without sluice: it asks the first
    sentinel for the master and switches when that sentinel announces
    +switch-master."""

    def __init__(self, cluster: Cluster):
        self.port = cluster.master.port
        self.conn = RespConn("127.0.0.1", cluster.sentinels[0].port, timeout=DEADLINE)
        self.conn.call("SUBSCRIBE", "+switch-master")
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def _follow(self):
        try:
            while True:
                msg = self.conn.reply()
                if msg[0] == b"message" and msg[1] == b"+switch-master":
                    fields = msg[2].decode().split()
                    if fields[0] == MASTER:
                        self.port = int(fields[4])
        except (OSError, AssertionError):
            return

    def address(self):
        return ("127.0.0.1", self.port)

    def close(self):
        self.conn.close()


def sentinel_failover(cluster: Cluster, tmp_path: Path, planned: bool, upgrade: bool):
    sentinels = ", ".join(f'"{s.address}"' for s in cluster.sentinels)
    s = UpgradableSluice(tmp_path, config(f'sentinel = {{ addresses = [{sentinels}], master = "{MASTER}" }}',
                                          '[upstream.db.health]\ntype = "redis"\nrole = "primary"\ninterval = "200ms"\n'))
    follower = SentinelFollower(cluster)
    through = RedisWriter("through sluice", s.addr, "s")
    direct = RedisWriter("straight to redis", follower.address, "d")
    old, new = cluster.master.port, cluster.replica.port
    try:
        through.start()
        direct.start()
        through.wait_acked(SETTLE_WRITES)
        direct.wait_acked(SETTLE_WRITES)
        watcher = SwitchWatcher(cluster.sentinels[-1].port)
        try:
            if planned:
                # Led by the last listed sentinel: the one sluice heard of last.
                assert call(cluster.sentinels[-1].port, "SENTINEL", "FAILOVER", MASTER) == "OK"
            else:
                cluster.master.proc.send_signal(signal.SIGKILL)
                cluster.master.proc.wait(timeout=10)
            before = s.upgrade() if upgrade else None
            _, fields = watcher.wait()
        finally:
            watcher.close()
        assert int(fields[4]) == new, fields
        if before is not None:
            s.wait_upgraded(before)
        through.wait_acked(AFTER_WRITES)
        direct.wait_acked(AFTER_WRITES)
    finally:
        through.stop()
        direct.stop()
        follower.close()
    lost, direct_lost = through.lost_on(new), direct.lost_on(new)
    kind = ("planned" if planned else "unplanned (master killed)") + (" + upgrade" if upgrade else "")
    report(f"Redis Sentinel {kind}", through, lost, direct, direct_lost)
    if upgrade:
        check_upgrade(s)
    s.stop()
    return s, through, lost, direct, direct_lost


@pytest.mark.parametrize("upgrade", [False, True], ids=["", "upgrade"])
def test_sentinel_planned_failover_loses_at_most_5_writes(cluster, tmp_path, upgrade):
    s, through, lost, _, _ = sentinel_failover(cluster, tmp_path, planned=True, upgrade=upgrade)
    assert len(lost) <= 5, f"{len(lost)} acknowledged writes lost: {lost[:20]}"
    # The old master's sessions were closed as fenced.
    assert any(r.get("cause") == "fenced" for r in s.records()), s.records()[-5:]


@pytest.mark.parametrize("upgrade", [False, True], ids=["", "upgrade"])
def test_sentinel_unplanned_failover(cluster, tmp_path, upgrade):
    _, through, lost, _, direct_lost = sentinel_failover(cluster, tmp_path, planned=False, upgrade=upgrade)
    # A killed master takes nothing with it that it had not replicated
    # (loopback replication is sub-millisecond): sluice adds no loss.
    assert len(lost) <= max(5, len(direct_lost)), lost[:20]


# --------------------------------------------------------------------------
# PostgreSQL: a standby promoted beside a live primary
# --------------------------------------------------------------------------

class StandbyServer(dbpeers.PgServer):
    READY = r"database system is ready to accept (read-only )?connections"


@pytest.fixture
def pg_primary_standby():
    why = dbpeers.pg_missing()
    if why:
        pytest.skip(why)
    root = dbpeers.make_pg_root()
    started: list[dbpeers.PgServer] = []
    try:
        primary_cluster = dbpeers.PgCluster(root, "primary")
        hba = primary_cluster.datadir / "pg_hba.conf"
        hba.write_text("host  replication all 127.0.0.1/32 trust\n" + hba.read_text())
        primary = dbpeers.PgServer(primary_cluster)
        started.append(primary)
        dbpeers.psql(primary.port, "CREATE TABLE through_sluice (n int); CREATE TABLE direct (n int)")
        standby_cluster = dbpeers.PgCluster.__new__(dbpeers.PgCluster)
        standby_cluster.name = "standby"
        standby_cluster.datadir = root / "standby"
        standby_cluster.sockdir = root / "standby.sock"
        standby_cluster.sockdir.mkdir()
        shutil.chown(standby_cluster.sockdir, dbpeers.PG_USER, dbpeers.PG_USER)
        r = subprocess.run(
            [dbpeers.RUNUSER, "-u", dbpeers.PG_USER, "--", str(dbpeers.PG_BIN / "pg_basebackup"),
             "-h", "127.0.0.1", "-p", str(primary.port), "-U", dbpeers.PG_USER,
             "-D", str(standby_cluster.datadir), "-R", "-X", "stream", "--no-sync"],
            cwd=root, env=dbpeers.clean_env(), stdin=subprocess.DEVNULL, capture_output=True,
            text=True, timeout=120)
        assert r.returncode == 0, f"pg_basebackup: {r.stdout}\n{r.stderr}"
        standby = StandbyServer(standby_cluster)
        started.append(standby)
        yield primary, standby
    finally:
        for srv in reversed(started):
            srv.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("upgrade", [False, True], ids=["", "upgrade"])
def test_postgres_standby_promoted_beside_a_live_primary(pg_primary_standby, tmp_path, upgrade):
    primary, standby = pg_primary_standby
    health = ('[upstream.db.health]\ntype = "postgres"\nrole = "primary"\nsslmode = "disable"\n'
              'interval = "200ms"\ntimeout = "2s"\nrise = 1\nfall = 1\njitter = "0%"\n')
    s = UpgradableSluice(tmp_path, config(f'servers = [{{ address = "{primary.address}" }}, '
                                          f'{{ address = "{standby.address}" }}]', health))
    through = PgWriter("through sluice", s.addr, "through_sluice")
    direct = PgWriter("straight to the old primary", ("127.0.0.1", primary.port), "direct")
    try:
        through.start()
        direct.start()
        through.wait_acked(SETTLE_WRITES)
        direct.wait_acked(SETTLE_WRITES)
        promoted_at = time.monotonic()
        assert dbpeers.psql(standby.port, "SELECT pg_promote()").stdout.strip() == "t"
        before = s.upgrade() if upgrade else None
        # sluice sends every new write to the promoted node.
        harness.wait_until(lambda: through.acked and through.acked[-1][2] == standby.port, timeout=DEADLINE,
                           what="writes reach the promoted standby")
        if before is not None:
            s.wait_upgraded(before)
        through.wait_acked(AFTER_WRITES)
    finally:
        through.stop()
        direct.stop()
    lost, direct_lost = through.lost_on(standby.port), direct.lost_on(standby.port)
    report("PostgreSQL standby promoted beside a live primary" + (" + upgrade" if upgrade else ""),
           through, lost, direct, direct_lost)
    first_on_new = next(t for _, t, port in through.acked if port == standby.port)
    late = [seq for seq, t, port in through.acked if port == primary.port and t > first_on_new]
    assert not late, f"writes acknowledged by the fenced primary after the switch: {late[:20]}"
    # Nothing sluice sent after the fence reached the old primary.
    print(f" (switch {(first_on_new - promoted_at) * 1000:.0f} ms after pg_promote())", end="")
    assert any(r.get("cause") == "fenced" for r in s.records()), s.records()[-5:]
    assert re.search(rf"server {re.escape(primary.address)} fenced", s.log.text()), s.log.text()
    if upgrade:
        check_upgrade(s)
    s.stop()
    # sluice never loses more than the old primary kept for itself.
    assert len(lost) <= len(direct_lost)


# --------------------------------------------------------------------------
# MariaDB switchover
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def template(tmp_path_factory):
    why = mariadb_peers.missing()
    if why:
        pytest.skip(why)
    return mariadb_peers.install_template(tmp_path_factory.mktemp("mariadb"))


@pytest.mark.parametrize("upgrade", [False, True], ids=["", "upgrade"])
def test_mariadb_switchover(template, tmp_path, upgrade):
    primary = mariadb_peers.make_primary(template, tmp_path / "primary")
    replica = None
    try:
        # The writers' account has no privilege that read_only lets through.
        primary.sql("CREATE USER 'app'@'%' IDENTIFIED BY 'app-secret';"
                    "GRANT INSERT, SELECT ON app.* TO 'app'@'%';"
                    "CREATE TABLE app.through_sluice (n INT, server INT); CREATE TABLE app.direct (n INT, server INT);")
        replica = mariadb_peers.make_replica(template, tmp_path / "replica", primary, server_id=2)
        pw = tmp_path / "monitor.pw"
        pw.write_text(mariadb_peers.MONITOR_PASSWORD + "\n")
        health = (f'[upstream.db.health]\ntype = "mysql"\nrole = "primary"\nuser = "{mariadb_peers.MONITOR_USER}"\n'
                  f'password_file = "{pw}"\ninterval = "200ms"\ntimeout = "2s"\nrise = 1\nfall = 1\njitter = "0%"\n')
        s = UpgradableSluice(tmp_path, config(f'servers = [{{ address = "{primary.address}" }}, '
                                              f'{{ address = "{replica.address}" }}]', health))
        through = MariaWriter("through sluice", s.addr, "app.through_sluice")
        direct = MariaWriter("straight to the old primary", ("127.0.0.1", primary.port), "app.direct")
        try:
            through.start()
            direct.start()
            through.wait_acked(SETTLE_WRITES)
            direct.wait_acked(SETTLE_WRITES)
            # The switchover: the primary stops taking writes, the replica
            # catches up and is promoted, the old primary follows it.
            primary.sql("SET GLOBAL read_only = 1")
            before = s.upgrade() if upgrade else None
            count = "SELECT (SELECT COUNT(*) FROM app.through_sluice) + (SELECT COUNT(*) FROM app.direct)"
            harness.wait_until(lambda: replica.sql(count) == primary.sql(count), timeout=DEADLINE,
                               what="the replica to catch up")
            replica.sql("STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0")
            primary.sql(f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={replica.port}, "
                        f"MASTER_USER='{mariadb_peers.REPL_USER}', MASTER_PASSWORD='{mariadb_peers.REPL_PASSWORD}', "
                        "MASTER_USE_GTID=current_pos; START SLAVE")
            try:
                harness.wait_until(lambda: through.acked and through.acked[-1][2] == 2, timeout=DEADLINE,
                                   what=f"writes reach the new primary (errors: {through.errors[-3:]})")
            except harness.Timeout as e:
                raise AssertionError(f"{e}\nsluice's log:\n{s.log.text()[-8000:]}") from None
            if before is not None:
                s.wait_upgraded(before)
            through.wait_acked(AFTER_WRITES)
        finally:
            through.stop()
            direct.stop()
        lost, direct_lost = through.lost_on(replica), direct.lost_on(replica)
        report("MariaDB switchover" + (" + upgrade" if upgrade else ""), through, lost, direct, direct_lost)
        assert not lost, lost[:20]
        if upgrade:
            check_upgrade(s)
        s.stop()
    finally:
        if replica is not None:
            replica.stop()
        primary.stop()
