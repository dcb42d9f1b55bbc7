"""The benchmark's load generator as a test peer: `loadgen serve` backends
(C++, epoll, so that the backend is never what limits a measurement)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import harness


def path() -> Path:
    """loadgen from the build directory of the sluice under test; skips the
    test when it was not built."""
    p = harness.sluice_bin().parent / "tools" / "loadgen"
    if not os.access(p, os.X_OK):
        pytest.skip(f"loadgen not built at {p} (it needs OpenSSL headers)")
    return p


class Server:
    """`loadgen serve --mode MODE` on 127.0.0.1, port chosen by the kernel;
    `log` has its output lines."""

    def __init__(self, mode: str):
        self.proc = subprocess.Popen([str(path()), "serve", "--mode", mode, "--port", "0"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        self.log = harness.LineLog(self.proc.stdout)
        self.port = int(self.log.wait_for(r"^listening (\d+)").group(1))
        self.address = f"127.0.0.1:{self.port}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.log.join()
