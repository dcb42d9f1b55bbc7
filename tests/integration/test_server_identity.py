"""A server is its resolved socket address, not the text that names it
(docs/architecture.md, "Snapshot and Registry"): the same address written
another way keeps its sessions, count and drain across a reload, and a host
name that resolves elsewhere after a reload is checked at its new address."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

import harness
from harness import listener, upstream
from test_admin import admin_sluice, request, server_path, status  # noqa: F401  (admin_sluice is a fixture)


def server_row(s, up: str, *addresses: str) -> dict:
    (u,) = [x for x in status(s)["upstreams"] if x["name"] == up]
    rows = [x for x in u["servers"] if x["address"] in addresses]
    assert len(rows) == 1, f"want one server named one of {addresses}; have {u['servers']}"
    return rows[0]


def echoes(c: socket.socket, msg: bytes) -> bool:
    try:
        c.sendall(msg)
        return harness.recv_exact(c, len(msg)) == msg
    except (OSError, AssertionError):
        return False


@pytest.mark.skipif(not harness.ipv6_available(), reason="no IPv6 loopback")
def test_a_server_written_another_way_keeps_its_sessions_count_and_drain(admin_sluice, backends):  # noqa: F811
    v6 = backends(harness.banner_handler, name="v6", host="::1")
    other = backends(harness.banner_handler, name="other")
    long_form = f"[0:0:0:0:0:0:0:1]:{v6.port}"
    short_form = f"[::1]:{v6.port}"
    s = admin_sluice([listener()], {"up": upstream(long_form, balance="least_conn", drain_timeout="1s")})

    held = s.connect()
    try:
        assert harness.recv_line(held) == b"v6"
        r = request(s, "POST", server_path("up", long_form, "drain", encode=True))
        assert r.status == 200, r

        # The same address, spelled the short way, with a second server.
        s.reload(s.render([listener()], {"up": upstream(short_form, other, balance="least_conn",
                                                           drain_timeout="1s")}))
        row = server_row(s, "up", long_form, short_form)
        assert row["active"] == 1, row  # least_conn still sees the live session
        assert row["admin"] == "drain", row
        assert not s.log.matches(r"server \S+ removed"), "the respelt server was taken as removed"

        # Drained: new sessions go to the other server.
        for _ in range(3):
            assert harness.banner_of(s) == b"other"
        # The server's action still finds it, by its new spelling.
        r = request(s, "POST", server_path("up", short_form, "drain", encode=True))
        assert r.status == 200, r

        # Well past drain_timeout (and its spread), the held session still runs.
        time.sleep(2.5)
        assert echoes(held, b"still here"), "the held session was cut"
        assert server_row(s, "up", long_form, short_form)["active"] == 1
    finally:
        held.close()
    recs = s.wait_records(4)
    assert not [r for r in recs if r["cause"] == "server_drained"], recs


# --------------------------------------------------------------------------
# a host name that resolves elsewhere after a reload
# --------------------------------------------------------------------------

NAME = "sluice-moving-server.test"


def mount_namespace_prefix(hosts: Path) -> list[str] | None:
    """A command prefix that runs a program in a mount namespace of its own
    where `hosts` is bind-mounted over /etc/hosts (this machine's file is
    untouched), or None when this system cannot do that."""
    if shutil.which("unshare") is None or shutil.which("getent") is None:
        return None
    prefix = ["unshare", "--mount"]
    if os.geteuid() != 0:
        prefix.append("--map-root-user")
    prefix += ["sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts)]
    try:
        res = subprocess.run([*prefix, "getent", "hosts", NAME], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return prefix if res.returncode == 0 and NAME in res.stdout else None


def same_port_pair(backends) -> tuple[harness.Backend, harness.Backend]:
    """Backends "old" on 127.0.0.2:P and "new" on 127.0.0.1:P (one port)."""
    for _ in range(20):
        old = backends(harness.banner_handler, name="old", host="127.0.0.2")
        try:
            new = backends(harness.banner_handler, name="new", host="127.0.0.1", port=old.port)
        except OSError:
            old.stop()
            continue
        return old, new
    pytest.skip("no port free on both 127.0.0.1 and 127.0.0.2")


def test_a_name_that_resolves_elsewhere_is_checked_at_its_new_address(sluice, backends, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.2 {NAME}\n")
    prefix = mount_namespace_prefix(hosts)
    if prefix is None:
        pytest.skip("cannot bind-mount a hosts file in a mount namespace here (unshare)")
    old, new = same_port_pair(backends)
    port = old.port
    health = {"type": "tcp", "interval": "100ms", "timeout": "500ms", "rise": 1, "fall": 1, "jitter": "0%"}
    s = sluice([listener()], {"up": upstream(f"{NAME}:{port}", health=health)}, start=False)
    s.command_prefix = prefix
    s.start()
    assert harness.banner_of(s) == b"old"
    harness.wait_until(lambda: old.counts()[0] >= 3, what="checks of the old address")
    assert new.counts()[0] == 0, "nothing should reach 127.0.0.1 yet"

    # The name now resolves to 127.0.0.1 (the file is rewritten in place, so
    # the bind mount shows the new text); the configuration is unchanged.
    hosts.write_text(f"127.0.0.1 {NAME}\n")
    start = len(s.log.lines)
    s.reload(s.config_path.read_text())
    s.log.wait_for(rf'server {NAME}:{port} now resolves to 127\.0\.0\.1:{port} \(was 127\.0\.0\.2:{port}\)',
                   start=start)
    # Checks reach the new address: with no client session there, every
    # connection "new" accepts is a check.
    harness.wait_until(lambda: new.counts()[0] >= 3, what="checks of the new address")

    # The old address goes away: its server is no longer checked, so no
    # check marks the name down, and clients keep reaching the new address.
    old.stop()
    checked = new.counts()[0]
    harness.wait_until(lambda: new.counts()[0] >= checked + 5, what="more checks of the new address")
    assert not s.log.matches(r"marked down"), s.log.text()
    assert harness.banner_of(s) == b"new"
