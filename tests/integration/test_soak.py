"""A short soak: tools/soak.py drives 20 000 short sessions through two
workers; sluice must end with the descriptors it had after the warm-up and
with at most 5 % more resident memory. The full-size run (a million sessions)
is `python3 tools/soak.py`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import harness

SOAK = harness.REPO / "tools" / "soak.py"


def test_twenty_thousand_sessions_leave_no_descriptor_or_memory_behind():
    binary = harness.sluice_bin()
    loadgen = binary.parent / "tools" / "loadgen"
    if not os.access(loadgen, os.X_OK):
        pytest.skip(f"loadgen not built at {loadgen} (it needs OpenSSL headers)")
    res = subprocess.run(
        [sys.executable, str(SOAK), "--sluice", str(binary), "--sessions", "20000",
         "--max-seconds", "120"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "fd check: PASS" in res.stdout, out
    assert "RSS check: PASS" in res.stdout, out
