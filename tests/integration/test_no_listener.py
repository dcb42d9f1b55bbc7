"""A configuration with no [[listener]] is valid (the package installs one):
sluice says so in one info line, serves its admin API and its checks, takes
no client, and starts serving when a reload brings a listener."""

from __future__ import annotations

import socket

import harness
from harness import listener, upstream

NO_LISTENER_RX = r"no listener configured: "


def refused(addr) -> bool:
    try:
        socket.create_connection(addr, timeout=harness.EVENT_TIMEOUT).close()
    except ConnectionRefusedError:
        return True
    except ConnectionResetError:
        # Queued as the listening socket closed: the kernel resets it. Not
        # yet the refusal of a port nobody listens on; look again.
        return False
    return False


def admin_only(extra: str = "") -> str:
    return ('[global]\nworkers = 1\naccess_log = "off"\n\n[admin]\nlisten = "127.0.0.1:0"\n' + extra)


def test_check_accepts_a_file_without_listener(tmp_path):
    for text in ("", admin_only(), admin_only('\n[upstream.pg]\nservers = [{ address = "127.0.0.1:5432" }]\n'),
                 "listener = []\n"):
        path = tmp_path / "none.toml"
        path.write_text(text)
        res = harness.run_check(path)
        assert res.returncode == 0, res.stderr
        assert b"is valid" in res.stdout


def test_runs_with_admin_api_and_checks_then_a_reload_brings_a_listener(tmp_path, backends):
    be = backends(harness.banner_handler, name="A")
    checked = f'\n[upstream.up]\nservers = [{{ address = "{be.address}" }}]\n[upstream.up.health]\ntype = "tcp"\n' \
              'interval = "200ms"\n'
    s = harness.Sluice(tmp_path, admin_only(checked), [])
    s.start()
    try:
        admin = harness.AdminClient(s)
        line = s.log.wait_for(NO_LISTENER_RX, timeout=harness.START_TIMEOUT)
        assert "[[listener]]" in line.string and "info" in line.string and "warn" not in line.string
        status = admin.status()
        assert status["listeners"] == []
        # The health check runs: the server is checked although no client can come.
        harness.wait_until(lambda: be.counts()[0] >= 2, timeout=harness.EVENT_TIMEOUT, what="health checks")
        assert len(s.log.matches(NO_LISTENER_RX)) == 1

        # A reload brings a listener: it serves at once.
        text = harness.render_config({"workers": 1, "access_log": "off"}, [listener()], {"up": upstream(be)})
        s.reload(text + '\n[admin]\nlisten = "127.0.0.1:0"\n')
        m = s.log.wait_for(harness.LISTENING_RX.replace('(?P<name>[^"]+)', "main"), timeout=harness.EVENT_TIMEOUT)
        addr = harness.split_addr(m.group("addr"))
        c = socket.create_connection(addr, timeout=harness.EVENT_TIMEOUT)
        assert harness.recv_line(c).strip() == b"A"
        c.close()

        # And a reload that takes every listener away says so again.
        s.reload(admin_only(checked))
        harness.wait_until(lambda: len(s.log.matches(NO_LISTENER_RX)) == 2, timeout=harness.EVENT_TIMEOUT,
                           what="a second no-listener line")
        harness.wait_until(lambda: refused(addr), timeout=harness.EVENT_TIMEOUT, what="the listener closed")
    finally:
        s.stop()
