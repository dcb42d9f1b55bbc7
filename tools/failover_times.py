#!/usr/bin/env python3
"""Failover detection times: how long after a database's role change the
first session through sluice lands on the new primary.

For each kind (PostgreSQL, MariaDB, Redis) the tool starts a primary and a
replica with real replication (the end-to-end tests' helpers,
tests/e2e/dbpeers.py and mariadb_peers.py), and one sluice in front of both
with a role check (`role = "primary"`) and otherwise the default check
settings (interval 2s, timeout 1s, rise 2, fall 3, jitter 10%). Then, N times:
it demotes the primary and promotes the replica, takes the moment the
promotion returned as zero, and opens one session after another through
sluice (a new connection every 50 ms, each asking the server which port it
listens on) until one lands on the new primary. The next run switches back,
after a random pause so the change falls anywhere in the check schedule.

- PostgreSQL: the primary is stopped (fast shutdown), the standby promoted
  with `SELECT pg_promote()`; the old primary then comes back as a standby
  of the new one (standby.signal).
- MariaDB: `SET GLOBAL read_only = 1` on the primary, the replica catches
  up, `STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0` on it; the
  old primary then replicates from the new one.
- Redis: `REPLICAOF NO ONE` on the replica, then `REPLICAOF` the new
  master on the old one.

Printed per kind: every run's time to the first session on the new primary,
and to the last session that still reached the old primary after the change
(if any did), then the median and the maximum. Every process started here is
stopped here, by its PID.

    tools/failover_times.py --sluice build/sluice --runs 10
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for sub in ("tests/integration", "tests/e2e"):
    sys.path.insert(0, str(REPO / sub))

import dbpeers  # noqa: E402
import harness  # noqa: E402
import mariadb_peers as mp  # noqa: E402

POLL_S = 0.05  # pause between two sessions through sluice
RUN_LIMIT_S = 30.0  # a run that sees no session on the new primary by then failed
SETTLE_S = 3.0  # after a run: the old primary follows the new one, sluice sees both again


class Failed(Exception):
    pass


@contextlib.contextmanager
def stopped_on_error(pair):
    """A pair that fails while starting stops what it had started."""
    try:
        yield
    except BaseException:
        pair.stop()
        raise


# --------------------------------------------------------------------------
# The three kinds of pair. Each has `servers` (two, the primary first at the
# start), `health` (the check table, role included), `ask(port)` (which
# server a new session through that port reached: "127.0.0.1:PORT", or None
# when the session failed), `switch(old, new)` (the role change; returns
# the monotonic time the new primary was promoted) and `follow(old, new)`
# (the old primary replicates from the new one; returns when it does).

class PostgresPair:
    name = "PostgreSQL"

    class Node(dbpeers.PgServer):
        # A standby says "ready to accept read-only connections".
        READY = r"database system is ready to accept (read-only )?connections"

    def __init__(self, workdir: Path):
        why = dbpeers.pg_missing()
        if why:
            raise Failed(why)
        self.root = dbpeers.make_pg_root()
        self.servers = []
        with stopped_on_error(self):
            a = dbpeers.PgCluster(self.root, "a")
            with open(a.datadir / "pg_hba.conf", "a") as f:
                f.write("host  replication all 127.0.0.1/32 trust\n")
            self.servers.append(self.Node(a))
            b = self._standby_cluster("b", self.servers[0])
            self.servers.append(self.Node(b))
            self._wait_streaming(self.servers[1], self.servers[0])
        self.health = {"type": "postgres", "role": "primary", "user": dbpeers.PG_USER, "sslmode": "disable"}

    def _standby_cluster(self, name: str, primary) -> dbpeers.PgCluster:
        c = dbpeers.PgCluster.__new__(dbpeers.PgCluster)
        c.name, c.datadir, c.sockdir = name, self.root / name, self.root / f"{name}.sock"
        c.sockdir.mkdir()
        shutil.chown(c.sockdir, dbpeers.PG_USER, dbpeers.PG_USER)
        r = subprocess.run(
            [dbpeers.RUNUSER, "-u", dbpeers.PG_USER, "--", str(dbpeers.PG_BIN / "pg_basebackup"),
             "-h", "127.0.0.1", "-p", str(primary.port), "-U", dbpeers.PG_USER, "-D", str(c.datadir),
             "-R", "-X", "stream", "-c", "fast"],
            cwd=self.root, env=dbpeers.clean_env(), stdin=subprocess.DEVNULL, capture_output=True,
            text=True, timeout=120)
        if r.returncode != 0:
            raise Failed(f"pg_basebackup exited {r.returncode}: {r.stderr.strip()}")
        return c

    def _wait_streaming(self, standby, primary):
        harness.wait_until(
            lambda: dbpeers.psql(primary.port, "select count(*) from pg_stat_replication "
                                 "where state = 'streaming'", check=False).stdout.strip() == "1",
            timeout=60, interval=0.2, what=f"the standby on {standby.port} to stream")

    def ask(self, port: int) -> str | None:
        with dbpeers.PgConn("127.0.0.1", port, timeout=2) as c:
            return f"127.0.0.1:{c.scalar('select inet_server_port()')}"

    def switch(self, old, new) -> float:
        old.stop()
        dbpeers.psql(new.port, "select pg_promote(true, 60)")
        return time.monotonic()

    def follow(self, old, new):
        data = old.cluster.datadir
        (data / "standby.signal").touch()
        shutil.chown(data / "standby.signal", dbpeers.PG_USER, dbpeers.PG_USER)
        with open(data / "postgresql.auto.conf", "a") as f:
            f.write(f"primary_conninfo = 'host=127.0.0.1 port={new.port} user={dbpeers.PG_USER}'\n")
        if not old._start():  # on its old port: sluice's servers stay the same
            raise Failed(f"the old primary did not start as a standby:\n{old.log.text()}")
        self._wait_streaming(old, new)

    def stop(self):
        for s in self.servers:
            s.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class MariaDbPair:
    name = "MariaDB"

    def __init__(self, workdir: Path):
        why = mp.missing()
        if why:
            raise Failed(why)
        self.servers = []
        with stopped_on_error(self):
            template = mp.install_template(workdir)
            self.servers.append(mp.make_primary(template, workdir / "a"))
            self.servers.append(mp.make_replica(template, workdir / "b", self.servers[0], server_id=2))
        pw = workdir / "monitor-password"
        pw.write_text(mp.MONITOR_PASSWORD + "\n")
        self.health = {"type": "mysql", "role": "primary", "user": mp.MONITOR_USER, "password_file": str(pw)}

    def ask(self, port: int) -> str | None:
        r = subprocess.run([mp.MARIADB, "--no-defaults", "-h", "127.0.0.1", "-P", str(port),
                            "-u", mp.MONITOR_USER, f"--password={mp.MONITOR_PASSWORD}",
                            "--connect-timeout=2", "-N", "-B", "-e", "SELECT @@port"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=10)
        return f"127.0.0.1:{r.stdout.strip()}" if r.returncode == 0 else None

    def switch(self, old, new) -> float:
        old.sql("SET GLOBAL read_only = 1")
        harness.wait_until(lambda: self._applied(new) == self._written(old), timeout=30,
                           interval=0.05, what="the replica to catch up")
        new.sql("STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0")
        return time.monotonic()

    @staticmethod
    def _written(server) -> tuple[str, str]:
        file, pos = server.sql("SHOW MASTER STATUS").split("\t")[:2]
        return file, pos

    @staticmethod
    def _replica_status(replica) -> dict[str, str]:
        """SHOW SLAVE STATUS by column name (the helpers' sql() drops the names)."""
        r = subprocess.run([mp.MARIADB, "--no-defaults", "-h", "127.0.0.1", "-P", str(replica.port), "-u", "root",
                            "-B", "-e", "SHOW SLAVE STATUS"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        lines = r.stdout.split("\n")
        return dict(zip(lines[0].split("\t"), lines[1].split("\t"))) if len(lines) > 1 else {}

    def _applied(self, replica) -> tuple[str, str]:
        fields = self._replica_status(replica)
        return fields.get("Relay_Master_Log_File", ""), fields.get("Exec_Master_Log_Pos", "")

    def follow(self, old, new):
        file, pos = self._written(new)  # nothing writes between the promotion and here
        old.sql(f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={new.port}, "
                f"MASTER_USER='{mp.REPL_USER}', MASTER_PASSWORD='{mp.REPL_PASSWORD}', MASTER_USE_GTID=no, "
                f"MASTER_LOG_FILE='{file}', MASTER_LOG_POS={pos}; START SLAVE")
        harness.wait_until(lambda: self._replica_status(old).get("Slave_IO_Running") == "Yes"
                           and self._replica_status(old).get("Slave_SQL_Running") == "Yes", timeout=30, interval=0.1,
                           what="the old primary to replicate")

    def stop(self):
        for s in reversed(self.servers):
            s.stop()


class RedisPair:
    name = "Redis"

    def __init__(self, workdir: Path):
        why = dbpeers.redis_missing()
        if why:
            raise Failed(why)
        self.servers = []
        with stopped_on_error(self):
            self.servers.append(dbpeers.RedisServer(workdir / "a"))
            self.servers.append(dbpeers.RedisServer(workdir / "b"))
            self.follow(self.servers[1], self.servers[0])
        self.health = {"type": "redis", "role": "primary"}

    @staticmethod
    def _call(server, *args):
        with dbpeers.RespConn("127.0.0.1", server.port, timeout=5) as c:
            return c.call(*args)

    def ask(self, port: int) -> str | None:
        with dbpeers.RespConn("127.0.0.1", port, timeout=2) as c:
            return f"127.0.0.1:{c.call('CONFIG', 'GET', 'port')[1].decode()}"

    def switch(self, old, new) -> float:
        self._call(new, "REPLICAOF", "NO", "ONE")
        promoted = time.monotonic()
        self._call(old, "REPLICAOF", "127.0.0.1", str(new.port))
        return promoted

    def follow(self, old, new):
        if self._call(old, "ROLE")[0] != b"slave":
            self._call(old, "REPLICAOF", "127.0.0.1", str(new.port))
        harness.wait_until(lambda: b"master_link_status:up" in self._call(old, "INFO", "replication"),
                           timeout=30, interval=0.05, what="the old master to replicate")

    def stop(self):
        for s in self.servers:
            s.stop()


KINDS = {"postgres": PostgresPair, "mysql": MariaDbPair, "redis": RedisPair}


# --------------------------------------------------------------------------

def start_sluice(binary: Path, workdir: Path, pair, name: str, settings: dict) -> harness.Sluice:
    config = harness.render_config(
        {"workers": 1, "log_level": "info", "access_log": "off"},
        [harness.listener("db", "db")],
        {"db": harness.upstream(*(s.address for s in pair.servers), health={**pair.health, **settings})})
    s = harness.Sluice(workdir, config, ["db"], name=name)
    s.start()
    return s


def seconds(text: str) -> float:
    """"2s" or "500ms" in seconds."""
    return float(text[:-2]) / 1000 if text.endswith("ms") else float(text[:-1])


def ask(pair, port: int) -> str | None:
    try:
        return pair.ask(port)
    except Exception:  # refused, closed (no server up), timed out: no answer
        return None


def one_run(pair, port: int, old, new) -> tuple[float, float | None]:
    """Switches old -> new; returns (seconds to the first session on new,
    seconds to the last session that still reached old, or None)."""
    promoted = pair.switch(old, new)
    last_old = None
    while True:
        began = time.monotonic()
        if began - promoted > RUN_LIMIT_S:
            raise Failed(f"no session reached the new primary {new.address} within {RUN_LIMIT_S:.0f}s")
        got = ask(pair, port)
        if got == new.address:
            return began - promoted, last_old
        if got == old.address:
            last_old = began - promoted
        time.sleep(max(0.0, POLL_S - (time.monotonic() - began)))


def measure(kind: str, binary: Path, runs: int, workdir: Path, settings: dict) -> dict:
    pair = KINDS[kind](workdir)
    s = None
    try:
        s = start_sluice(binary, workdir, pair, kind, settings)
        port = s.port("db")
        primary, replica = pair.servers
        harness.wait_until(lambda: ask(pair, port) == primary.address, timeout=30, interval=0.1,
                           what="the first session on the primary")
        times, olds = [], []
        pause = seconds(settings.get("interval", "2s"))
        for i in range(runs):
            time.sleep(random.uniform(0, pause))  # anywhere in the check schedule
            mark = len(s.log.lines)
            new_in, old_last = one_run(pair, port, primary, replica)
            times.append(new_in)
            olds.append(old_last)
            print(f"{pair.name} run {i + 1}: new primary in {new_in:.2f}s, last session on the old one "
                  + (f"{old_last:.2f}s" if old_last is not None else "none") + " after the change; sluice: "
                  + "; ".join(l.split("] ", 1)[-1] for l in s.log.lines[mark:] if "(active check)" in l),
                  file=sys.stderr, flush=True)
            pair.follow(primary, replica)
            primary, replica = replica, primary
            time.sleep(SETTLE_S)
        return {"name": pair.name, "times": times, "olds": olds}
    finally:
        if s is not None:
            s.stop()
        pair.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sluice", default=str(REPO / "build" / "sluice"))
    ap.add_argument("--runs", type=int, default=10, help="role changes per kind (default 10)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated: " + ",".join(KINDS))
    ap.add_argument("--interval", help='the check interval, e.g. "500ms" (default: the default, 2s)')
    ap.add_argument("--rise", type=int, help="passes to come up (default: the default, 2)")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not 1 <= args.runs <= 100:
        ap.error("unknown kind " + ", ".join(bad) if bad else "--runs must be 1..100")
    settings = {}
    if args.interval:
        settings["interval"] = args.interval
    if args.rise:
        settings["rise"] = args.rise
    os.environ["SLUICE_BIN"] = str(Path(args.sluice).resolve())
    results = []
    for kind in kinds:
        workdir = Path(tempfile.mkdtemp(prefix=f"sluice-failover-{kind}-"))
        try:
            results.append(measure(kind, Path(args.sluice), args.runs, workdir, settings))
        except (Failed, AssertionError, subprocess.TimeoutExpired, OSError) as exc:
            print(f"failover_times: {kind}: {exc}", file=sys.stderr)
            results.append({"name": kind, "error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__})
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    written = ", ".join(f"{k} = {v}" for k, v in settings.items())
    print(f"# failover detection, {args.runs} role change(s) per kind, check settings: "
          + (f"{written}, the rest default" if written else "the defaults")
          + " (interval 2s, timeout 1s, rise 2, fall 3, jitter 10%)\n")
    print("| database | first session on the new primary: median | max | "
          "runs where a session still reached the old primary | latest such session |")
    print("|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['name']} | failed: {r['error']} | | | |")
            continue
        olds = [o for o in r["olds"] if o is not None]
        print(f"| {r['name']} | {statistics.median(r['times']):.2f} s | {max(r['times']):.2f} s | "
              f"{len(olds)} of {len(r['olds'])} | " + (f"{max(olds):.2f} s |" if olds else "– |"))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
