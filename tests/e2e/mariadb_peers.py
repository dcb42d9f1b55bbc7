"""Real MariaDB servers for the tests: a primary and replicas with real
replication, each on 127.0.0.1 and a free port, in its own data directory.

One data directory is made per test session with mariadb-install-db and
copied for each server (installing takes seconds; a copy does not). Every
server is started here and stopped here, by its PID.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import dbpeers
import harness

MARIADBD = shutil.which("mariadbd", path="/usr/sbin:/usr/bin")
MARIADB = shutil.which("mariadb")
INSTALL_DB = shutil.which("mariadb-install-db")

# The account the health check logs in with, and the one replication uses.
MONITOR_USER = "monitor"
MONITOR_PASSWORD = "monitor-secret"
REPL_USER = "repl"
REPL_PASSWORD = "repl-secret"


def missing() -> str | None:
    for name, path in (("mariadbd", MARIADBD), ("mariadb", MARIADB), ("mariadb-install-db", INSTALL_DB)):
        if path is None:
            return f"{name} not found (Debian packages mariadb-server, mariadb-client)"
    return None


def install_template(root: Path) -> Path:
    """A fresh data directory with the system tables, to copy from."""
    datadir = root / "template"
    r = subprocess.run([INSTALL_DB, "--no-defaults", f"--datadir={datadir}", "--user=root",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    return datadir


class MariaDb:
    """One mariadbd. `server_id` tells the servers apart through a proxy."""

    READY = r"ready for connections"

    def __init__(self, template: Path, workdir: Path, server_id: int):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.datadir = self.workdir / "data"
        shutil.copytree(template, self.datadir)
        self.server_id = server_id
        self.proc: subprocess.Popen | None = None
        self.log: harness.LineLog | None = None
        dbpeers.start_on_free_port(self, f"mariadbd {server_id}")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _start(self) -> bool:
        self.proc = subprocess.Popen(
            [MARIADBD, "--no-defaults", f"--datadir={self.datadir}", "--user=root",
             f"--port={self.port}", "--bind-address=127.0.0.1", f"--socket={self.workdir}/sock",
             f"--pid-file={self.workdir}/pid", "--skip-name-resolve", f"--server-id={self.server_id}",
             "--log-bin=bin", "--innodb-buffer-pool-size=16M", "--max-connections=50",
             "--log-error=", "--skip-log-error"],
            cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.log = harness.LineLog(self.proc.stdout)
        try:
            self.log.wait_for(self.READY, timeout=60)
        except harness.Timeout:
            return False
        return True

    def sql(self, query: str, user: str = "root", password: str | None = None, port: int | None = None,
            check: bool = True) -> str:
        """Runs `query` with the mariadb client (batch mode, no column names);
        `port` sends it somewhere else, e.g. through sluice."""
        argv = [MARIADB, "--no-defaults", "-h", "127.0.0.1", "-P", str(port or self.port), "-u", user,
                "--connect-timeout=10", "-N", "-B", "-e", query]
        if password is not None:
            argv.insert(-2, f"--password={password}")
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        if check:
            assert r.returncode == 0, f"{query}: {r.stderr}"
        return r.stdout.strip() if r.returncode == 0 else r.stderr.strip()

    def stop(self, timeout: float = 30.0):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.log:
            self.log.join()
        if self.proc.stdout:
            self.proc.stdout.close()


def make_primary(template: Path, workdir: Path) -> MariaDb:
    """A writable server with the monitor and replication accounts."""
    p = MariaDb(template, workdir, server_id=1)
    p.sql(f"CREATE USER '{MONITOR_USER}'@'%' IDENTIFIED BY '{MONITOR_PASSWORD}';"
          f"GRANT REPLICA MONITOR ON *.* TO '{MONITOR_USER}'@'%';"
          f"CREATE USER '{REPL_USER}'@'%' IDENTIFIED BY '{REPL_PASSWORD}';"
          f"GRANT REPLICATION SLAVE ON *.* TO '{REPL_USER}'@'%';"
          "CREATE DATABASE app; CREATE TABLE app.writes (n INT, server INT);")
    return p


def make_replica(template: Path, workdir: Path, primary: MariaDb, server_id: int, delay_s: int = 0) -> MariaDb:
    """A read-only server replicating from `primary` from its first binlog
    event (both start from the same template), so it gets the accounts too."""
    r = MariaDb(template, workdir, server_id=server_id)
    r.sql(f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={primary.port}, "
          f"MASTER_USER='{REPL_USER}', MASTER_PASSWORD='{REPL_PASSWORD}', MASTER_USE_GTID=no, "
          f"MASTER_LOG_FILE='bin.000001', MASTER_LOG_POS=4, MASTER_DELAY={delay_s};"
          "START SLAVE; SET GLOBAL read_only = 1;")
    harness.wait_until(lambda: r.sql("SELECT COUNT(*) FROM mysql.user WHERE user = 'monitor'", check=False) == "1",
                       timeout=60 + delay_s, what="the replica to copy the accounts")
    return r


def replication_running(server: MariaDb) -> bool:
    out = server.sql("SHOW SLAVE STATUS\\G", check=False)
    return "Slave_IO_Running: Yes" in out and "Slave_SQL_Running: Yes" in out


def wait_caught_up(replica: MariaDb, primary: MariaDb, timeout: float = 30.0):
    want = primary.sql("SELECT COUNT(*) FROM app.writes")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if replica.sql("SELECT COUNT(*) FROM app.writes", check=False) == want:
            return
        time.sleep(0.1)
    raise harness.Timeout("the replica did not catch up")
