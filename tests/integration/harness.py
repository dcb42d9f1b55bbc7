"""Helpers for running the real sluice binary against real loopback peers.

Everything binds port 0 on loopback, every wait has a deadline, and every
process or thread started here is stopped by the fixture that created it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, Iterable

REPO = Path(__file__).resolve().parents[2]

# Deadlines. They only matter when something is broken, so they are generous
# enough for a sanitizer build on a busy 2-core machine.
START_TIMEOUT = 15.0
EVENT_TIMEOUT = 10.0


def sluice_bin() -> Path:
    env = os.environ.get("SLUICE_BIN")
    path = Path(env) if env else REPO / "build" / "sluice"
    if not path.is_absolute():
        path = REPO / path
    return path


def sluice_next_bin() -> Path:
    """The same program built under another version string (meson target
    sluice-next, beside the binary under test): what a package upgrade
    installs in the upgrade tests."""
    path = sluice_bin().with_name("sluice-next")
    assert path.exists(), f"{path} is missing: build it (ninja -C {path.parent} sluice-next)"
    return path


class Timeout(AssertionError):
    pass


def wait_until(pred: Callable[[], object], timeout: float = EVENT_TIMEOUT,
               interval: float = 0.02, what: str = "condition"):
    """Polls pred until it returns something truthy; raises Timeout otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise Timeout(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(interval)


# --------------------------------------------------------------------------
# TOML rendering (just what our configs need)
# --------------------------------------------------------------------------

# splice mode for every listener the tests write ("off", "pipe", "auto"), or
# empty for the default.
SPLICE_MODE = os.environ.get("SLUICE_TEST_SPLICE", "")


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") \
            .replace("\r", "\\r").replace("\t", "\\t") + '"'
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot render {v!r} as TOML")


def render_config(global_: dict | None = None, listeners: Iterable[dict] = (),
                  upstreams: dict[str, dict] | None = None) -> str:
    out = []
    if global_:
        out.append("[global]")
        out += [f"{k} = {_toml_value(v)}" for k, v in global_.items()]
        out.append("")
    for lst in listeners:
        out.append("[[listener]]")
        out += [f"{k} = {_toml_value(v)}" for k, v in lst.items()]
        out.append("")
    for name, up in (upstreams or {}).items():
        out.append(f"[upstream.{name}]")
        for k, v in up.items():
            if k == "servers":
                out.append("servers = [")
                out += [f"  {_toml_value(s)}," for s in v]
                out.append("]")
            else:
                out.append(f"{k} = {_toml_value(v)}")
        out.append("")
    return "\n".join(out)


def listener(name="main", upstream="up", listen="127.0.0.1:0", **kw) -> dict:
    d = {"name": name, "listen": listen}
    if upstream is not None:
        d["upstream"] = upstream
    # The suite runs a second time with every listener splicing (see
    # tools/test.sh): the byte-moving mode must not change any behaviour.
    if SPLICE_MODE:
        d["splice"] = SPLICE_MODE
    d.update(kw)
    return d


def upstream(*backends_or_addrs, balance=None, weights=None, **kw) -> dict:
    """An upstream table from Backend objects or "host:port" strings."""
    servers = []
    for i, b in enumerate(backends_or_addrs):
        s = {"address": b if isinstance(b, str) else b.address}
        if weights:
            s["weight"] = weights[i]
        servers.append(s)
    d = {}
    if balance:
        d["balance"] = balance
    d.update(kw)
    d["servers"] = servers
    return d


# --------------------------------------------------------------------------
# Process output capture
# --------------------------------------------------------------------------

class LineLog:
    """Collects the lines a process writes and lets tests wait on them."""

    def __init__(self, stream):
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream):
        try:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                with self._cond:
                    self._lines.append(line)
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()

    @property
    def lines(self) -> list[str]:
        with self._cond:
            return list(self._lines)

    def text(self) -> str:
        return "\n".join(self.lines)

    def matches(self, pattern: str) -> list[re.Match]:
        rx = re.compile(pattern)
        return [m for m in (rx.search(l) for l in self.lines) if m]

    def wait_for(self, pattern: str, timeout: float = EVENT_TIMEOUT, count: int = 1,
                 start: int = 0) -> re.Match:
        """Waits until `count` lines (from index `start`) match; returns the last."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [m for m in (rx.search(l) for l in self._lines[start:]) if m]
                if len(found) >= count:
                    return found[count - 1]
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    tail = "\n".join(self._lines[-30:])
                    why = "output closed" if self._closed else f"{timeout:.1f}s passed"
                    raise Timeout(f"{why} before {count} line(s) matching {pattern!r}; "
                                  f"last output:\n{tail}")
                self._cond.wait(min(left, 0.5))

    def join(self, timeout: float = 5.0):
        self._thread.join(timeout)


# --------------------------------------------------------------------------
# sluice
# --------------------------------------------------------------------------

LISTENING_RX = r'listener "(?P<name>[^"]+)" listening on (?P<addr>\S+)'


def split_addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port.rstrip(".,;"))


def parse_access_line(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", line))


def _raise_nofile(limit: int):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _cap_nofile(limit: int):
    """Soft and hard limit both `limit`: the process cannot raise it."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def _lower_nofile(limit: int):
    """A low soft limit under the usual hard limit: the process may raise it."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


class Sluice:
    """One running sluice process with its config file and access log."""

    def __init__(self, workdir: Path, config_text: str, listeners: Iterable[str],
                 name: str = "sluice", nofile: int | None = None,
                 access_log: Path | None = None, nofile_cap: int | None = None):
        self.workdir = Path(workdir)
        self.config_path = self.workdir / f"{name}.toml"
        self.config_path.write_text(config_text)
        self.access_log = access_log or self.workdir / f"{name}.access.log"
        self.expected_listeners = list(listeners)
        self.nofile = nofile
        self.nofile_cap = nofile_cap
        self.nofile_soft: int | None = None
        self.env: dict[str, str] | None = None  # extra environment variables
        self.command_prefix: list[str] = []  # runs sluice through this command (e.g. unshare)
        # sluice's standard input: /dev/null, or subprocess.PIPE for one that
        # stays open with nothing to read (a terminal nobody types in).
        self.stdin = subprocess.DEVNULL
        self.proc: subprocess.Popen | None = None
        self.log: LineLog | None = None
        self.addrs: dict[str, tuple[str, int]] = {}

    # lifecycle -------------------------------------------------------------

    def start(self) -> "Sluice":
        binary = sluice_bin()
        if not binary.exists():
            raise AssertionError(f"sluice binary not found at {binary} (set SLUICE_BIN)")
        preexec = (lambda: _raise_nofile(self.nofile)) if self.nofile else None
        if self.nofile_cap:
            preexec = lambda: _cap_nofile(self.nofile_cap)  # noqa: E731
        elif self.nofile_soft:
            preexec = lambda: _lower_nofile(self.nofile_soft)  # noqa: E731
        self.proc = subprocess.Popen(
            [*self.command_prefix, str(binary), "-c", str(self.config_path)],
            stdin=self.stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            cwd=self.workdir, preexec_fn=preexec,
            env={**os.environ, **self.env} if self.env else None)
        self.log = LineLog(self.proc.stdout)
        for name in self.expected_listeners:
            m = self.log.wait_for(LISTENING_RX.replace('(?P<name>[^"]+)', re.escape(name)),
                                  timeout=START_TIMEOUT)
            self.addrs[name] = split_addr(m.group("addr"))
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def port(self, listener: str | None = None) -> int:
        return self.addr(listener)[1]

    def addr(self, listener: str | None = None) -> tuple[str, int]:
        if listener is None:
            listener = self.expected_listeners[0]
        return self.addrs[listener]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int):
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, then SIGKILL if needed. Safe to call twice."""
        if self.proc is None:
            return None
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
            except ProcessLookupError:
                pass
        if self.log:
            self.log.join()
        return self.proc.returncode

    # observation -------------------------------------------------------------

    def rss_kb(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS in /proc status")

    def access_records(self) -> list[dict[str, str]]:
        try:
            text = self.access_log.read_text(errors="replace")
        except FileNotFoundError:
            return []
        # Only complete lines: the writer may be mid-line.
        lines = text.split("\n")[:-1]
        return [parse_access_line(l) for l in lines if "cause=" in l]

    def wait_records(self, count: int, timeout: float = EVENT_TIMEOUT,
                     pred: Callable[[dict], bool] | None = None) -> list[dict[str, str]]:
        """Waits until at least `count` access records (matching pred) exist."""
        def ready():
            recs = [r for r in self.access_records() if pred is None or pred(r)]
            return recs if len(recs) >= count else None
        try:
            return wait_until(ready, timeout=timeout, what=f"{count} access record(s)")
        except Timeout as e:
            raise Timeout(f"{e}; have: {self.access_records()}\nsluice output:\n"
                          f"{self.log.text() if self.log else ''}") from None

    def connect(self, listener: str | None = None, timeout: float = EVENT_TIMEOUT) -> socket.socket:
        host, port = self.addr(listener)
        return connect(host, port, timeout=timeout)

    def reload(self, config_text: str, expect_ok: bool = True, timeout: float = EVENT_TIMEOUT) -> re.Match:
        """Rewrites the config file, sends SIGHUP and waits for the outcome line."""
        assert self.log is not None
        rx = r"reload (succeeded|failed)(.*)"
        before = len(self.log.matches(rx))
        self.config_path.write_text(config_text)
        self.signal(signal.SIGHUP)
        self.log.wait_for(rx, timeout=timeout, count=before + 1)
        m = self.log.matches(rx)[before]
        assert (m.group(1) == "succeeded") == expect_ok, m.group(0)
        return m


def run_check(config_path: Path, timeout: float = 15.0) -> subprocess.CompletedProcess:
    """Runs `sluice -t -c FILE`."""
    return subprocess.run([str(sluice_bin()), "-t", "-c", str(config_path)],
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)


def run_plain(config_path: Path, timeout: float = 15.0) -> subprocess.CompletedProcess:
    """Runs `sluice -c FILE`, expecting it to exit on its own (bad config)."""
    return subprocess.run([str(sluice_bin()), "-c", str(config_path)],
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)


# --------------------------------------------------------------------------
# sockets
# --------------------------------------------------------------------------

def connect(host: str, port: int, timeout: float = EVENT_TIMEOUT, rcvbuf: int | None = None) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(timeout)
    s.connect((host, port))
    return s


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise AssertionError(f"EOF after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def recv_line(sock: socket.socket, limit: int = 4096) -> bytes:
    buf = bytearray()
    while not buf.endswith(b"\n"):
        if len(buf) >= limit:
            raise AssertionError(f"no newline in {limit} bytes: {bytes(buf[:80])!r}")
        chunk = sock.recv(1)
        if not chunk:
            raise AssertionError(f"EOF before end of line, got {bytes(buf)!r}")
        buf += chunk
    return bytes(buf[:-1])


def banner_of(s: Sluice, listener_name: str | None = None) -> bytes:
    """Opens a session, reads the backend's banner (its first line, as
    banner_handler sends it), closes; returns the banner."""
    c = s.connect(listener_name)
    try:
        return recv_line(c)
    finally:
        c.close()


def recv_all(sock: socket.socket, limit: int = 1 << 30) -> bytes:
    """Reads until EOF (the socket's timeout bounds each read)."""
    buf = bytearray()
    while True:
        chunk = sock.recv(1 << 20)
        if not chunk:
            return bytes(buf)
        buf += chunk
        if len(buf) > limit:
            raise AssertionError(f"more than {limit} bytes")


def wait_closed(sock: socket.socket, timeout: float = EVENT_TIMEOUT) -> str:
    """Waits for the peer to close; returns "eof" or "reset". Discards data."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Timeout(f"socket still open after {timeout:.1f}s")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            raise Timeout(f"socket still open after {timeout:.1f}s") from None
        except (ConnectionResetError, BrokenPipeError):
            return "reset"
        if not chunk:
            return "eof"


def seconds_until_closed(sock: socket.socket, timeout: float = EVENT_TIMEOUT) -> float:
    """Waits for the peer to close `sock` (Timeout if it does not), closes our
    end too, and returns how many seconds the wait took."""
    t0 = time.monotonic()
    try:
        wait_closed(sock, timeout=timeout)
    finally:
        sock.close()
    return time.monotonic() - t0


def dead_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on: bound once, then released."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind((host, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def exchange(host: str, port: int, payload: bytes, timeout: float = 60.0) -> bytes:
    """Sends payload (then FIN) from a thread while reading to EOF; returns what came back."""
    s = connect(host, port, timeout=timeout)
    err: list[BaseException] = []

    def send():
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except BaseException as e:  # reported by the caller
            err.append(e)

    t = threading.Thread(target=send, daemon=True)
    t.start()
    try:
        data = recv_all(s, limit=len(payload) * 2 + (1 << 20))
    finally:
        t.join(timeout)
        s.close()
    if err:
        raise err[0]
    return data


# --------------------------------------------------------------------------
# backends
# --------------------------------------------------------------------------

class Backend:
    """A threaded TCP server; `handler(backend, conn)` runs per connection.

    Tracks how many connections were accepted and how many are open now.
    """

    def __init__(self, handler: Callable[["Backend", socket.socket], None],
                 name: str = "backend", host: str = "127.0.0.1", port: int = 0):
        self.name = name
        self.handler = handler
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(1024)
        self.sock.settimeout(0.1)
        self.host = host
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.open = 0
        self.received_sha: list[str] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True)
        self._acceptor.start()

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def _accept_loop(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn.settimeout(60)
            with self._lock:
                self.accepted += 1
                self.open += 1
                self._conns.add(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket):
        try:
            self.handler(self, conn)
        except (ConnectionResetError, BrokenPipeError, socket.timeout, OSError) as e:
            if not self._stop.is_set():
                self.errors.append(e)
        finally:
            with self._lock:
                self._conns.discard(conn)
                self.open -= 1
            try:
                conn.close()
            except OSError:
                pass

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return self.accepted, self.open

    def stop(self):
        self._stop.set()
        self._acceptor.join(2)
        try:
            self.sock.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            t.join(2)



def exchange_concurrently(host: str, port: int, payloads: list[bytes], timeout: float,
                          together: bool = False) -> list[object]:
    """exchange() each payload on its own connection, all at once, one thread
    each; with together=True they wait on a barrier so they overlap for sure.
    Returns the replies in order; an exception takes its session's place."""
    n = len(payloads)
    results: list[object] = [None] * n
    start = threading.Barrier(n, timeout=30) if together else None

    def run(i: int) -> None:
        try:
            if start is not None:
                start.wait()
            results[i] = exchange(host, port, payloads[i], timeout=timeout)
        except BaseException as e:  # the caller reports it
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    assert not any(t.is_alive() for t in threads), "client threads did not finish"
    return results


def echo_handler(backend: Backend, conn: socket.socket):
    """Echoes until EOF, then closes; records sha256 of everything received."""
    h = hashlib.sha256()
    buf = bytearray(1 << 18)
    view = memoryview(buf)
    while True:
        n = conn.recv_into(buf)
        if n == 0:
            break
        h.update(view[:n])
        conn.sendall(view[:n])
    with backend._lock:
        backend.received_sha.append(h.hexdigest())


def banner_handler(backend: Backend, conn: socket.socket):
    """Sends "<name>\\n" at once, then echoes until EOF."""
    conn.sendall(backend.name.encode() + b"\n")
    echo_handler(backend, conn)


def reply_after_eof_handler(backend: Backend, conn: socket.socket):
    """Reads to EOF, then sends sha256(input) hex, a newline, the input reversed; closes."""
    data = bytearray()
    while True:
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    reply = hashlib.sha256(data).hexdigest().encode() + b"\n" + bytes(reversed(data))
    conn.sendall(reply)


def reply_after_eof(data: bytes) -> bytes:
    return hashlib.sha256(data).hexdigest().encode() + b"\n" + bytes(reversed(data))


class StreamSource:
    """Handler state for a backend that sends `total` bytes as fast as it can."""

    def __init__(self, total: int, block: bytes):
        self.total = total
        self.block = block
        self.sent = 0
        self.done = threading.Event()
        self.sha = hashlib.sha256()

    def __call__(self, backend: Backend, conn: socket.socket):
        view = memoryview(self.block)
        conn.setblocking(True)
        try:
            while self.sent < self.total:
                n = min(len(view), self.total - self.sent)
                # send() rather than sendall() so `sent` tracks what the
                # kernel accepted, which is what a stalled writer exposes.
                k = conn.send(view[:n])
                self.sha.update(view[:k])
                self.sent += k
        finally:
            self.done.set()
        conn.shutdown(socket.SHUT_WR)
        # Wait for the peer to finish before closing so nothing is reset.
        conn.settimeout(60)
        while conn.recv(65536):
            pass


def ipv6_available() -> bool:
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.bind(("::1", 0))
        s.close()
        return True
    except OSError:
        return False


def raise_nofile(limit: int) -> int:
    """Raises this process's open-file soft limit; returns the new soft limit."""
    _raise_nofile(limit)
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def ss_timer_seconds(text: str) -> float:
    """The time left on a timer as `ss -o` prints it: "2min", "9min59sec",
    "5.884ms" (seconds and milliseconds), "204ms"."""
    m = re.fullmatch(r"(?:(\d+)min)?(?:(\d+)sec)?(?:(?:(\d+)\.)?(\d+)ms)?", text)
    if not m or not text:
        raise ValueError(f"not an ss timer: {text!r}")
    mins, secs, secs_ms, msecs = m.groups()
    return int(mins or 0) * 60 + int(secs or 0) + int(secs_ms or 0) + int(msecs or 0) / 1000


ADMIN_RX = r"admin API listening on (?P<addr>\S+)"


class AdminClient:
    """A running sluice with an `[admin]` listener on port 0: finds the
    admin address in its log and reads the API."""

    def __init__(self, s: Sluice):
        self.s = s
        m = s.log.wait_for(ADMIN_RX, timeout=START_TIMEOUT)
        self.admin = split_addr(m.group("addr"))

    def get(self, path: str) -> str:
        host, port = self.admin
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=EVENT_TIMEOUT) as r:
            return r.read().decode()

    def status(self) -> dict:
        return json.loads(self.get("/status"))
