"""A `type = "mysql"` check against a server that picks a dangerous
authentication plugin (docs/health.md, "mysql"): the server is the hostile
peer here, so it is a few lines of Python that speak the handshake. After
the greeting it answers the check's login with an AuthSwitchRequest to
`mysql_clear_password` (the password would go in clear text) or `dialog`
(the password in clear, or a question that Connector/C's own prompt reads
from standard input, holding the control thread). The check must fail at
once with a reason that names the plugin, the password must never arrive,
and the admin API must keep answering meanwhile."""

from __future__ import annotations

import socket
import struct
import subprocess
import threading

import pytest

import harness
from harness import listener, upstream
from test_admin import admin_sluice, request, status  # noqa: F401  (fixture)

PASSWORD = "Hunter2-not-for-strangers"
PROMPT = "SLUICE-PROMPT-MUST-NOT-BE-PRINTED: "

CLIENT_LONG_PASSWORD = 0x1
CLIENT_LONG_FLAG = 0x4
CLIENT_PROTOCOL_41 = 0x200
CLIENT_TRANSACTIONS = 0x2000
CLIENT_SECURE_CONNECTION = 0x8000
CLIENT_MULTI_RESULTS = 0x20000
CLIENT_PLUGIN_AUTH = 0x80000
CAPS = (CLIENT_LONG_PASSWORD | CLIENT_LONG_FLAG | CLIENT_PROTOCOL_41 | CLIENT_TRANSACTIONS |
        CLIENT_SECURE_CONNECTION | CLIENT_MULTI_RESULTS | CLIENT_PLUGIN_AUTH)


def packet(seq: int, payload: bytes) -> bytes:
    return struct.pack("<I", len(payload))[:3] + bytes([seq]) + payload


def greeting(plugin: str = "mysql_native_password") -> bytes:
    """A MySQL 8-style HandshakeV10 (no TLS offered)."""
    salt = b"0123456789abcdefghij"
    p = b"\x0a" + b"8.0.36-hostile\x00" + struct.pack("<I", 7) + salt[:8] + b"\x00"
    p += struct.pack("<H", CAPS & 0xFFFF) + b"\x21" + struct.pack("<H", 2) + struct.pack("<H", CAPS >> 16)
    p += bytes([len(salt) + 1]) + b"\x00" * 10 + salt[8:] + b"\x00" + plugin.encode() + b"\x00"
    return packet(0, p)


def read_packet(conn: socket.socket, got: bytearray) -> bytes:
    head = harness.recv_exact(conn, 4)
    body = harness.recv_exact(conn, int.from_bytes(head[:3], "little"))
    got += head + body
    return body


class HostileMysql:
    """Greets, takes the login, asks for `plugin` with `data`; records every
    byte the client sends on every connection."""

    def __init__(self, backends, plugin: str, data: bytes):
        self.plugin = plugin
        self.data = data
        self.received: list[bytes] = []
        self.switched = threading.Event()
        self._lock = threading.Lock()
        self.backend = backends(self.handle, name=f"hostile-{plugin}")

    def handle(self, backend, conn):
        got = bytearray()
        try:
            conn.sendall(greeting())
            read_packet(conn, got)  # HandshakeResponse41
            conn.sendall(packet(2, b"\xfe" + self.plugin.encode() + b"\x00" + self.data))
            self.switched.set()
            conn.settimeout(10)
            while True:  # whatever the client sends next, until it hangs up
                chunk = conn.recv(4096)
                if not chunk:
                    break
                got += chunk
        except (AssertionError, OSError):  # recv_exact's EOF, or a reset
            pass
        finally:
            with self._lock:
                self.received.append(bytes(got))

    def everything_received(self) -> bytes:
        with self._lock:
            return b"".join(self.received)


def mysql_health(tmp_path, **extra):
    pw = tmp_path / "monitor-password"
    pw.write_text(PASSWORD + "\n")
    return {"type": "mysql", "user": "monitor", "password_file": str(pw), "interval": "300ms", "timeout": "4s",
            "rise": 1, "fall": 1, "jitter": "0%", "initial": "up", **extra}


CASES = {
    # The password in clear text is the whole of what this plugin sends.
    "clear_password": ("mysql_clear_password", b""),
    # A "password" question (type 4): the password in clear text.
    "dialog_password": ("dialog", b"\x04Password: "),
    # An ordinary question (type 2): Connector/C's prompt prints it and reads
    # the answer from standard input.
    "dialog_question": ("dialog", b"\x02" + PROMPT.encode()),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_server_that_asks_for_a_dangerous_plugin_fails_the_check_at_once(admin_sluice, backends, tmp_path,
                                                                         case):
    plugin, data = CASES[case]
    server = HostileMysql(backends, plugin, data)
    s = admin_sluice([listener()], {"up": upstream(server.backend, health=mysql_health(tmp_path))}, start=False)
    s.stdin = subprocess.PIPE  # a terminal nobody types in: a read would wait for ever
    s.start()
    addr = server.backend.address
    m = s.log.wait_for(rf"server {addr} marked down \(active check\): (.*) \(detected", timeout=20)
    reason = m.group(1)
    assert "not allowed" in reason and "timeout" not in reason, reason
    # Named when the check saw the switch, as it does when it waits for it.
    assert f'plugin "{plugin}"' in reason or "such as mysql_clear_password or dialog" in reason, reason
    # The control thread is free: the admin API answers, with the same reason.
    r = request(s, "GET", "/status", timeout=5)
    assert r.status == 200, r
    srv = r.json()["upstreams"][0]["servers"][0]
    assert srv["reason"].endswith(reason), srv
    # Several checks later, the password has never been sent...
    harness.wait_until(lambda: server.backend.counts()[0] >= 3, timeout=15, what="three checks")
    assert request(s, "GET", "/ready", timeout=5).status == 200
    assert PASSWORD.encode() not in server.everything_received()
    # ...and nothing was printed for the server or read from the terminal.
    assert not s.log.matches(r"SLUICE-PROMPT-MUST-NOT-BE-PRINTED|Password: ")


def test_a_greeting_that_names_a_dangerous_plugin_fails_too(admin_sluice, backends, tmp_path):
    """The plugin may come in the greeting itself rather than in a switch."""
    received = []

    def handle(backend, conn):
        got = bytearray()
        try:
            conn.sendall(greeting("mysql_clear_password"))
            conn.settimeout(10)
            while True:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                got += chunk
        except OSError:
            pass
        received.append(bytes(got))

    server = backends(handle, name="hostile-greeting")
    s = admin_sluice([listener()], {"up": upstream(server, health=mysql_health(tmp_path))})
    m = s.log.wait_for(rf"server {server.address} marked down \(active check\): (.*) \(detected", timeout=20)
    assert "not allowed" in m.group(1) and "timeout" not in m.group(1), m.group(0)
    harness.wait_until(lambda: len(received) >= 2, timeout=15, what="two checks")
    assert all(PASSWORD.encode() not in r for r in received)
