"""Smoke test of tools/compare_routing.py: a quick run through sluice and
nginx prints the per-backend table of both modes and writes the chart."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

import harness

TOOL = harness.REPO / "tools" / "compare_routing.py"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
BACKENDS = 4  # the quick profile's


def test_quick_run_reports_both_modes_and_draws_the_chart(tmp_path):
    if not os.access(NGINX, os.X_OK):
        pytest.skip("nginx not installed")
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("python3-matplotlib not installed")
    r = subprocess.run(
        [sys.executable, str(TOOL), "--quick", "--no-db", "--out", str(tmp_path),
         "--sluice", str(harness.sluice_bin()), "--nginx", NGINX],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=85)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"

    sections = re.split(r"^### ", r.stdout, flags=re.M)
    for mode in ("L4", "L7"):
        body = next((s for s in sections if s.startswith(mode + ":")), None)
        assert body is not None, f"no {mode} section in:\n{r.stdout}"
        rows = re.findall(r"^\| b\d+ \| \d+× \| (\d+) \|", body, flags=re.M)
        assert len(rows) == BACKENDS, body
        assert sum(int(n) for n in rows) > 0, body
        assert "imbalance max/mean" in body
    assert "µs/request" in r.stdout

    svg = tmp_path / "routing.svg"
    assert svg.exists() and svg.stat().st_size > 1000
    assert "<svg" in svg.read_text()[:2000]
