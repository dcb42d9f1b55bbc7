"""A small client for Chromium's DevTools protocol over its WebSocket,
standard library only: start a headless browser, send commands, wait for
events, answer dialogs. Every wait has a deadline."""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import socket
import struct
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-dev-shm-usage",
         "--no-first-run", "--no-default-browser-check", "--disable-extensions",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


class WebSocket:
    """Client side of RFC 6455, text frames only (what DevTools speaks)."""

    def __init__(self, url: str, timeout: float):
        u = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {u.path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise AssertionError(f"WebSocket handshake: EOF after {head!r}")
            head += chunk
        status = head.split(b"\r\n", 1)[0]
        assert b" 101 " in status, f"WebSocket handshake refused: {status!r}"
        self.buf = head.split(b"\r\n\r\n", 1)[1]

    def send(self, text: str):
        data = text.encode()
        n = len(data)
        head = bytes([0x81])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _need(self, n: int, deadline: float):
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            r, _, _ = select.select([self.sock], [], [], left)
            if not r:
                raise TimeoutError
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise AssertionError("DevTools closed the WebSocket")
            self.buf += chunk

    def recv(self, deadline: float) -> str:
        """One whole message; TimeoutError when none arrives by `deadline`."""
        parts = b""
        while True:
            self._need(2, deadline)
            b0, b1 = self.buf[0], self.buf[1]
            n, pos = b1 & 0x7F, 2
            if n == 126:
                self._need(4, deadline)
                n, pos = struct.unpack(">H", self.buf[2:4])[0], 4
            elif n == 127:
                self._need(10, deadline)
                n, pos = struct.unpack(">Q", self.buf[2:10])[0], 10
            self._need(pos + n, deadline)
            payload, self.buf = self.buf[pos:pos + n], self.buf[pos + n:]
            opcode = b0 & 0x0F
            if opcode == 0x8:
                raise AssertionError("DevTools closed the WebSocket")
            if opcode in (0x9, 0xA):  # ping, pong
                continue
            parts += payload
            if b0 & 0x80:
                return parts.decode()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Browser:
    """A headless Chromium with one page, driven through DevTools."""

    def __init__(self, profile: Path, timeout: float = 60.0, window: str = "1600,1000"):
        self.timeout = timeout
        profile.mkdir(parents=True, exist_ok=True)
        port_file = profile / "DevToolsActivePort"
        if port_file.exists():
            port_file.unlink()
        chromium = next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if os.path.exists(p)), None)
        assert chromium, "chromium not installed"
        self.proc = subprocess.Popen(
            [chromium, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
             f"--window-size={window}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        self.ws = None
        self.events: list[dict] = []
        self.next_id = 0
        try:
            deadline = time.monotonic() + timeout
            while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
                assert self.proc.poll() is None, f"chromium exited {self.proc.returncode}: " \
                                                 f"{self.proc.stderr.read().decode()[-2000:]}"
                assert time.monotonic() < deadline, "chromium did not open its DevTools port"
                time.sleep(0.1)
            port = int(port_file.read_text().split("\n")[0])
            page = None
            while page is None:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as r:
                    page = next((t for t in json.load(r) if t.get("type") == "page"), None)
                assert page or time.monotonic() < deadline, "no page target"
                if page is None:
                    time.sleep(0.1)
            self.ws = WebSocket(page["webSocketDebuggerUrl"], timeout)
        except BaseException:
            self.close()
            raise

    def _deadline(self) -> float:
        return time.monotonic() + self.timeout

    def send(self, method: str, **params) -> int:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        return self.next_id

    def result(self, msg_id: int) -> dict:
        """Waits for the answer to command `msg_id`, keeping events that come first."""
        deadline = self._deadline()
        while True:
            msg = json.loads(self.ws.recv(deadline))
            if msg.get("id") == msg_id:
                assert "error" not in msg, f"DevTools error: {msg['error']}"
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def call(self, method: str, **params) -> dict:
        return self.result(self.send(method, **params))

    def event(self, method: str, timeout: float | None = None) -> dict:
        """Waits for (and takes) the next event `method`, kept or new."""
        for i, e in enumerate(self.events):
            if e["method"] == method:
                return self.events.pop(i)["params"]
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            try:
                msg = json.loads(self.ws.recv(deadline))
            except TimeoutError:
                raise AssertionError(f"no {method} within {timeout or self.timeout}s") from None
            if msg.get("method") == method:
                return msg["params"]
            if "method" in msg:
                self.events.append(msg)

    def drop_events(self, method: str):
        self.events = [e for e in self.events if e["method"] != method]

    def navigate(self, url: str):
        self.drop_events("Page.loadEventFired")
        self.call("Page.navigate", url=url)
        self.event("Page.loadEventFired")

    def evaluate(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in r, f"{expression}: {r['exceptionDetails']}"
        return r["result"].get("value")

    def screenshot(self, path: Path):
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self):
        if self.ws is not None:
            self.ws.close()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        if self.proc.stderr:
            self.proc.stderr.close()
