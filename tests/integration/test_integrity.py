"""Integrity under backend failures: tools/integrity.py moves 600 MB of
checked sessions through two workers while backends are killed and
restarted; no byte may be wrong and no session the client takes as complete
may be short. The full-size run is `python3 tools/integrity.py` (10 GB).

The checker itself is tested too, through a relay that damages the streams:
a flipped download byte, a flipped upload byte and a clean FIN halfway
through must each be reported, never counted as a complete session."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

import pytest

import harness
import loadgen

INTEGRITY = harness.REPO / "tools" / "integrity.py"


def result_of(stdout: str) -> dict:
    lines = [l for l in stdout.splitlines() if l.startswith("result ")]
    assert lines, stdout
    return json.loads(lines[-1][len("result "):])


def test_killed_backends_never_corrupt_or_silently_truncate_a_session():
    loadgen.path()
    splice = ["--splice", harness.SPLICE_MODE] if harness.SPLICE_MODE else []
    res = subprocess.run(
        [sys.executable, str(INTEGRITY), "--sluice", str(harness.sluice_bin()),
         "--gigabytes", "0.6", "--kills", "3", "--down-ms", "50", "--max-session-mb", "32",
         "--max-seconds", "50", "--stall-seconds", "20", *splice],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    r = result_of(res.stdout)
    assert r["corrupt"] == 0 and r["truncations"] == 0, out
    assert r["kills"] == 3, out
    # The kills hit sessions mid-transfer, and every one of those failed in
    # a way the client saw.
    assert r["failed"] >= 1, out
    assert r["failed"] == r["reset"] + r["short_eof"] + r["error"], out
    assert r["completed"] >= 50, out
    assert r["bytes_moved"] >= 0.45e9, out
    assert r["bytes_verified_completed"] >= 0.3e9, out


# --------------------------------------------------------------------------
# The checker against a relay that breaks the streams on purpose

class DamagingRelay:
    """A harness.Backend handler that relays each connection to `target`,
    damaging it after `at` bytes of one direction: "flip_down" / "flip_up"
    invert that byte, "fin_down" ends both directions cleanly there (a FIN
    to the client, as from a server that stopped early)."""

    def __init__(self, target: tuple[str, int], how: str, at: int):
        self.target, self.how, self.at = target, how, at

    def __call__(self, backend: harness.Backend, client: socket.socket):
        server = socket.create_connection(self.target, timeout=10)
        try:
            ended = threading.Event()  # set once "fin_down" has ended the stream
            down = threading.Thread(target=self._pump, args=(server, client, True, client, server, ended),
                                    daemon=True)
            down.start()
            self._pump(client, server, False, client, server, ended)
            down.join(30)
        finally:
            server.close()

    @staticmethod
    def _drain(client):
        # What the client still uploads after the early FIN is read and
        # dropped until its EOF: closed with unread bytes, the socket would
        # send a reset, and the client would see that instead of the EOF.
        try:
            while client.recv(65536):
                pass
        except OSError:
            pass

    def _pump(self, src, dst, down, client, server, ended):
        seen = 0
        damaged_dir = self.how.endswith("_down") == down
        try:
            while True:
                data = bytearray(src.recv(65536))
                if ended.is_set() and not down:
                    return self._drain(client)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                if damaged_dir and seen <= self.at < seen + len(data):
                    i = self.at - seen
                    if self.how.startswith("flip"):
                        data[i] ^= 0xFF
                    else:
                        dst.sendall(data[:i])
                        ended.set()
                        client.shutdown(socket.SHUT_WR)
                        server.shutdown(socket.SHUT_RDWR)
                        return
                seen += len(data)
                dst.sendall(data)
        except OSError:
            if ended.is_set() and not down:
                return self._drain(client)
            # The other side reset: end both, so that the client is not left
            # waiting.
            for sock in (client, server):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture
def integrity_backend():
    server = loadgen.Server("integrity")
    yield server.port, server.log
    server.stop()


def run_client(port: int) -> tuple[int, dict, list[dict]]:
    res = subprocess.run(
        [str(loadgen.path()), "integrity", "--target", f"127.0.0.1:{port}", "--bytes", "2m",
         "--max-session", "256k", "--concurrency", "4", "--timeout", "30", "--stall", "10"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    lines = res.stdout.splitlines()
    failed = [json.loads(l.split(" ", 1)[1]) for l in lines if l.startswith("failed ")]
    return res.returncode, json.loads(lines[-1]), failed


@pytest.mark.parametrize("how", ["flip_down", "flip_up", "fin_down"])
def test_the_checker_reports_a_damaged_stream(integrity_backend, backends, how):
    port, backend_out = integrity_backend
    at = 5000  # inside the download or the upload of most sessions
    relay = backends(DamagingRelay(("127.0.0.1", port), how, at), name="relay")
    rc, summary, failed = run_client(relay.port)
    assert summary["failed"] >= 1, summary
    # loadgen fails the run for corruption; failures a killed server can
    # cause (resets, early EOFs) are only counted.
    assert rc == (1 if how == "flip_down" else 0), summary
    # Sessions too short to be damaged complete; no damaged one does.
    assert summary["completed"] + summary["failed"] == summary["sessions"], summary
    for f in failed:
        assert f["up"] + f["down"] + 80 > at, f  # 80: header and trailer
    kinds = {f["kind"] for f in failed}
    if how == "flip_down":
        assert kinds == {"corrupt"}, failed
        assert summary["corrupt"] == summary["failed"]
    elif how == "fin_down":
        assert kinds == {"short_eof"}, failed
    else:
        # The backend finds the flipped byte, says so, and resets: the
        # client sees the reset.
        assert kinds <= {"reset", "short_eof"}, failed
        harness.wait_until(lambda: backend_out.matches(r"^corrupt \d+ 4952$"),
                           what="the backend's corrupt line")
