"""Real database servers for the end-to-end tests: PostgreSQL and Redis from
Debian, each on its own loopback port, plus two tiny wire-protocol clients
(enough to hold a session open and ask which server answered).

Every server is started here and stopped here, by the PID of the process we
started (for PostgreSQL, the postmaster that `runuser` forked for us).
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
from pathlib import Path

import harness


# --------------------------------------------------------------------------
# binaries
# --------------------------------------------------------------------------

def _pg_bindir() -> Path | None:
    """The newest /usr/lib/postgresql/VERSION/bin that has a server in it."""
    found = []
    for d in glob.glob("/usr/lib/postgresql/*/bin"):
        try:
            version = int(Path(d).parent.name)
        except ValueError:
            continue
        if all(os.access(os.path.join(d, b), os.X_OK)
               for b in ("initdb", "postgres", "psql", "pgbench")):
            found.append((version, Path(d)))
    return max(found)[1] if found else None


PG_BIN = _pg_bindir()
RUNUSER = shutil.which("runuser")
REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
REDIS_BENCHMARK = shutil.which("redis-benchmark")

PG_USER = "postgres"  # the OS account the server runs as, and the database role


def pg_missing() -> str | None:
    """Why the PostgreSQL tests cannot run here, or None."""
    if PG_BIN is None:
        return "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin"
    if RUNUSER is None:
        return "runuser not found"
    try:
        import pwd
        pwd.getpwnam(PG_USER)
    except KeyError:
        return f"no {PG_USER!r} OS user"
    return None


def redis_missing() -> str | None:
    for name, path in (("redis-server", REDIS_SERVER), ("redis-cli", REDIS_CLI),
                       ("redis-benchmark", REDIS_BENCHMARK)):
        if path is None:
            return f"{name} not found"
    return None


def free_port() -> int:
    """A loopback port that was free a moment ago (bind to 0, then release)."""
    return harness.dead_port("127.0.0.1")


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without PG*/REDIS* variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PG", "REDISCLI"))}
    env.update(extra)
    return env


ADDR_IN_USE = r"[Aa]ddress already in use"
START_TRIES = 5


def start_on_free_port(server, what: str) -> None:
    """Starts `server` (anything with port, _start(), stop() and log) on a
    free port, trying again while the port turns out to be taken already."""
    last = ""
    for _ in range(START_TRIES):
        server.port = free_port()
        if server._start():
            return
        last = server.log.text() if server.log else ""
        server.stop()
        if not re.search(ADDR_IN_USE, last):
            break
    raise AssertionError(f"{what} did not start:\n{last}")


def _child_pids(pid: int) -> list[int]:
    out = []
    for children in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            out += [int(x) for x in Path(children).read_text().split()]
        except (OSError, ValueError):
            pass
    return out


def _signal_pid(pid: int, sig: int):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# --------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------

class PgCluster:
    """A data directory made by initdb, owned by the postgres OS user.

    Lives under a private temporary directory that the postgres user can
    reach (pytest's own temp root is readable by root only)."""

    def __init__(self, root: Path, name: str):
        self.name = name
        self.datadir = root / name
        self.sockdir = root / f"{name}.sock"
        self.sockdir.mkdir()
        shutil.chown(self.sockdir, PG_USER, PG_USER)
        r = subprocess.run(
            [RUNUSER, "-u", PG_USER, "--", str(PG_BIN / "initdb"), "-D", str(self.datadir),
             "-U", PG_USER, "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"],
            cwd=root, env=clean_env(), stdin=subprocess.DEVNULL, capture_output=True,
            text=True, timeout=120)
        if r.returncode != 0:
            raise AssertionError(f"initdb exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        # Trust exactly what the tests use: the socket and 127.0.0.1.
        (self.datadir / "pg_hba.conf").write_text(
            "local all all trust\n"
            "host  all all 127.0.0.1/32 trust\n")
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write("\n# sluice end-to-end tests\n"
                    "listen_addresses = '127.0.0.1'\n"
                    "fsync = off\n"
                    "synchronous_commit = off\n"
                    "full_page_writes = off\n"
                    "shared_buffers = 16MB\n"
                    "max_connections = 40\n"
                    "ssl = off\n")

    def clone(self, name: str) -> "PgCluster":
        """A second cluster: a copy of this one's data directory (cheaper than
        another initdb). Only valid while this cluster's server is stopped."""
        other = PgCluster.__new__(PgCluster)
        other.name = name
        root = self.datadir.parent
        other.datadir = root / name
        other.sockdir = root / f"{name}.sock"
        other.sockdir.mkdir()
        shutil.chown(other.sockdir, PG_USER, PG_USER)
        subprocess.run(["cp", "-a", str(self.datadir), str(other.datadir)],
                       check=True, capture_output=True, timeout=60)
        return other


def make_pg_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="sluice-pg-"))
    os.chmod(root, 0o755)
    shutil.chown(root, PG_USER, PG_USER)
    r = subprocess.run([RUNUSER, "-u", PG_USER, "--", "test", "-w", str(root)],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    if r.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise AssertionError(f"the {PG_USER} user cannot write to {root}; "
                             f"point TMPDIR at a directory it can reach")
    return root


@contextlib.contextmanager
def pg_cluster_pair(prepare=None):
    """Two clusters "a" and "b" (one initdb, copied), removed afterwards.
    `prepare(cluster, name)` may change each before any server starts."""
    root = make_pg_root()
    try:
        a = PgCluster(root, "a")
        b = a.clone("b")
        if prepare:
            prepare(a, "a")
            prepare(b, "b")
        yield a, b
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def pg_servers(clusters):
    """A running server on each cluster, all stopped afterwards, pass or fail."""
    started: list[PgServer] = []
    try:
        for cluster in clusters:
            started.append(PgServer(cluster))
        yield tuple(started)
    finally:
        for srv in started:
            srv.stop()


class PgServer:
    """One postmaster on a cluster, listening on 127.0.0.1:PORT."""

    READY = r"database system is ready to accept connections"

    def __init__(self, cluster: PgCluster):
        self.cluster = cluster
        self.proc: subprocess.Popen | None = None
        self.log: harness.LineLog | None = None
        self.postmaster: int | None = None
        start_on_free_port(self, f"postgres on {cluster.name}")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _start(self) -> bool:
        self.proc = subprocess.Popen(
            [RUNUSER, "-u", PG_USER, "--", str(PG_BIN / "postgres"),
             "-D", str(self.cluster.datadir), "-p", str(self.port),
             "-k", str(self.cluster.sockdir)],
            cwd=self.cluster.datadir.parent, env=clean_env(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.log = harness.LineLog(self.proc.stdout)
        try:
            self.log.wait_for(self.READY, timeout=harness.START_TIMEOUT)
        except harness.Timeout:
            return False
        self.postmaster = self._find_postmaster()
        return True

    def _find_postmaster(self) -> int:
        """The postgres process runuser forked; postmaster.pid names it too."""
        assert self.proc is not None
        kids = _child_pids(self.proc.pid)
        pidfile = self.cluster.datadir / "postmaster.pid"
        pid = int(pidfile.read_text().split("\n", 1)[0])
        assert pid in kids, f"postmaster.pid says {pid}, runuser's children are {kids}"
        return pid

    def _postmaster_guess(self) -> int | None:
        """Before it is ready, the only process runuser forked is postgres."""
        assert self.proc is not None
        kids = _child_pids(self.proc.pid)
        return kids[0] if kids else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0):
        """Fast shutdown (SIGINT to the postmaster), then immediate, then kill."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            pid = self.postmaster or self._postmaster_guess()
            for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGKILL):
                if pid is not None:
                    _signal_pid(pid, sig)
                try:
                    self.proc.wait(timeout=timeout if sig == signal.SIGINT else 5)
                    break
                except subprocess.TimeoutExpired:
                    continue
            if self.proc.poll() is None:  # runuser itself is stuck
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.log:
            self.log.join()
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()


class PgError(AssertionError):
    pass


class PgConn:
    """A minimal PostgreSQL v3 client: trust auth, simple queries, text rows.

    With ssl_request=True it first sends an SSLRequest, records the one-byte
    answer in `ssl_answer` and, on 'N', carries on in clear on the same
    connection, as libpq does with sslmode=prefer."""

    SSL_REQUEST = struct.pack("!ii", 8, 80877103)

    def __init__(self, host: str, port: int, user: str = PG_USER, database: str = "postgres",
                 ssl_request: bool = False, timeout: float = harness.EVENT_TIMEOUT):
        self.sock = harness.connect(host, port, timeout=timeout)
        self.ssl_answer: bytes | None = None
        self.server: int | None = None  # free for callers: which server answered
        self.client = "%s:%d" % self.sock.getsockname()[:2]  # as sluice logs it
        try:
            if ssl_request:
                self.sock.sendall(self.SSL_REQUEST)
                self.ssl_answer = harness.recv_exact(self.sock, 1)
                if self.ssl_answer != b"N":
                    raise PgError(f"SSLRequest answered {self.ssl_answer!r}, expected b'N'")
            params = b"".join(k + b"\0" + v + b"\0" for k, v in (
                (b"user", user.encode()), (b"database", database.encode()),
                (b"application_name", b"sluice-e2e"))) + b"\0"
            body = struct.pack("!i", 196608) + params
            self.sock.sendall(struct.pack("!i", len(body) + 4) + body)
            while True:
                kind, payload = self._read()
                if kind == b"R":
                    code = struct.unpack("!i", payload[:4])[0]
                    if code != 0:
                        raise PgError(f"server asked for authentication method {code}")
                elif kind == b"E":
                    raise PgError(self._error_text(payload))
                elif kind == b"Z":
                    break
        except BaseException:
            self.sock.close()
            raise

    def _read(self) -> tuple[bytes, bytes]:
        head = harness.recv_exact(self.sock, 5)
        length = struct.unpack("!i", head[1:])[0]
        return head[:1], harness.recv_exact(self.sock, length - 4)

    @staticmethod
    def _error_text(payload: bytes) -> str:
        fields = {}
        for part in payload.split(b"\0"):
            if part:
                fields[part[:1]] = part[1:].decode("utf-8", "replace")
        return f"{fields.get(b'S', 'ERROR')}: {fields.get(b'M', '?')}"

    def query(self, sql: str) -> list[tuple[str | None, ...]]:
        body = sql.encode() + b"\0"
        self.sock.sendall(b"Q" + struct.pack("!i", len(body) + 4) + body)
        rows: list[tuple[str | None, ...]] = []
        error = None
        while True:
            kind, payload = self._read()
            if kind == b"D":
                n = struct.unpack("!h", payload[:2])[0]
                pos, row = 2, []
                for _ in range(n):
                    size = struct.unpack("!i", payload[pos:pos + 4])[0]
                    pos += 4
                    if size < 0:
                        row.append(None)
                    else:
                        row.append(payload[pos:pos + size].decode())
                        pos += size
                rows.append(tuple(row))
            elif kind == b"E":
                error = self._error_text(payload)
            elif kind == b"Z":
                break
        if error:
            raise PgError(error)
        return rows

    def scalar(self, sql: str) -> str | None:
        rows = self.query(sql)
        assert len(rows) == 1 and len(rows[0]) == 1, f"{sql!r} returned {rows!r}"
        return rows[0][0]

    def close(self):
        """Terminate and close; safe to call twice."""
        if self.sock.fileno() < 0:
            return
        try:
            self.sock.sendall(b"X" + struct.pack("!i", 4))
        except OSError:
            pass
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def psql(port: int, sql: str, sslmode: str = "disable", check: bool = True,
         timeout: float = 30.0) -> subprocess.CompletedProcess:
    """psql -h 127.0.0.1 -p PORT -U postgres -c SQL, unaligned tuples only."""
    env = clean_env(PGSSLMODE=sslmode, PGGSSENCMODE="disable", PGCONNECT_TIMEOUT="10")
    r = subprocess.run(
        [str(PG_BIN / "psql"), "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1",
         "-h", "127.0.0.1", "-p", str(port), "-U", PG_USER, "-d", "postgres", "-c", sql],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"psql -p {port} -c {sql!r} (sslmode={sslmode}) exited "
                             f"{r.returncode}: {r.stderr.strip()}")
    return r


def pgbench(port: int, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    env = clean_env(PGSSLMODE="disable", PGGSSENCMODE="disable", PGCONNECT_TIMEOUT="10")
    return subprocess.run(
        [str(PG_BIN / "pgbench"), "-h", "127.0.0.1", "-p", str(port), "-U", PG_USER,
         *args, "postgres"],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------

class RedisServer:
    """redis-server on 127.0.0.1:PORT with persistence off, in its own dir."""

    READY = r"Ready to accept connections"

    def __init__(self, workdir: Path, extra: list[str] | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.extra = extra or []  # more command-line options ("--replicaof", host, port)
        self.proc: subprocess.Popen | None = None
        self.log: harness.LineLog | None = None
        start_on_free_port(self, "redis-server")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _start(self) -> bool:
        return self._spawn([REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
                            "--save", "", "--appendonly", "no", "--daemonize", "no",
                            "--dir", str(self.workdir), "--logfile", "", "--loglevel", "notice", *self.extra])

    def _spawn(self, argv: list[str]) -> bool:
        """Starts `argv` in workdir and waits for READY in its output; False
        when it does not come (the port was taken: start_on_free_port tries
        another)."""
        self.proc = subprocess.Popen(argv, cwd=self.workdir, env=clean_env(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.log = harness.LineLog(self.proc.stdout)
        try:
            self.log.wait_for(self.READY, timeout=harness.START_TIMEOUT)
        except harness.Timeout:
            return False
        return True

    def stop(self, timeout: float = 10.0):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            _signal_pid(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _signal_pid(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        if self.log:
            self.log.join()
        if self.proc.stdout:
            self.proc.stdout.close()


def resp_command(*args: bytes | str) -> bytes:
    parts = [a.encode() if isinstance(a, str) else a for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


class RespConn:
    """A minimal RESP2 client, for exact bytes and large values."""

    def __init__(self, host: str, port: int, timeout: float = harness.EVENT_TIMEOUT):
        self.sock = harness.connect(host, port, timeout=timeout)
        self.buf = bytearray()

    def _fill(self):
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise AssertionError(f"EOF from server, unparsed: {bytes(self.buf[:80])!r}")
        self.buf += chunk

    def _line(self) -> bytes:
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 2]
                return line
            self._fill()

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise AssertionError(f"redis error: {rest.decode()}")
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self._exact(n + 2)
            return data[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise AssertionError(f"bad RESP reply line {line[:80]!r}")

    def call(self, *args: bytes | str):
        self.sock.sendall(resp_command(*args))
        return self.reply()

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def redis_cli(port: int, *args: str, input: bytes | None = None,
              timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run([REDIS_CLI, "-h", "127.0.0.1", "-p", str(port), *args],
                          env=clean_env(), input=input,
                          stdin=None if input is not None else subprocess.DEVNULL,
                          capture_output=True, timeout=timeout)


def redis_benchmark(port: int, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([REDIS_BENCHMARK, "-h", "127.0.0.1", "-p", str(port), *args],
                          env=clean_env(), stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=timeout)


def wait_port_closed(port: int, timeout: float = harness.EVENT_TIMEOUT):
    """Waits until nothing accepts on 127.0.0.1:port."""
    def closed():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return False
        except OSError:
            return True
    harness.wait_until(closed, timeout=timeout, what=f"port {port} to close")

