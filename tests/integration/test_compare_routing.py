"""Smoke test of tools/compare_routing.py: a quick run through sluice and
nginx prints the per-backend table of both modes, what differs between them
(backends reached per client connection, wall time, and the PostgreSQL pool
when PostgreSQL is installed) and draws those figures in the chart."""

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
BACKENDS = 4      # the quick profile's
CONNECTIONS = 8   # the quick profile's
PG_CLIENTS = 8    # pgbench -c


def section(stdout: str, heading: str) -> str:
    """The text of the `### heading...` section."""
    parts = re.split(r"^### ", stdout, flags=re.M)
    body = next((s for s in parts if s.startswith(heading)), None)
    assert body is not None, f"no '### {heading}' section in:\n{stdout}"
    return body


def table_rows(body: str) -> list[list[str]]:
    """The data rows of the first Markdown table in `body`, cells stripped."""
    rows = [line.strip().strip("|").split("|") for line in body.splitlines()
            if line.startswith("|") and not line.startswith("|---")]
    return [[cell.strip() for cell in row] for row in rows[1:]]


def test_quick_run_charts_what_differs_between_the_modes(tmp_path):
    if not os.access(NGINX, os.X_OK):
        pytest.skip("nginx not installed")
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("python3-matplotlib not installed")
    # The database part runs when PostgreSQL is installed and says so when
    # it is not; both are checked below. The timeout is a deadline only.
    r = subprocess.run(
        [sys.executable, str(TOOL), "--quick", "--out", str(tmp_path),
         "--sluice", str(harness.sluice_bin()), "--nginx", NGINX],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    out = r.stdout

    for mode in ("L4", "L7"):
        body = section(out, mode + ":")
        rows = re.findall(r"^\| b\d+ \| \d+× \| (\d+) \|", body, flags=re.M)
        assert len(rows) == BACKENDS, body
        assert sum(int(n) for n in rows) > 0, body
        assert "imbalance max/mean" in body
        assert re.search(r"client connections finished from [\d.]+ s to [\d.]+ s", body), body
    assert "µs/request" in out

    # Backends reached per client connection: per connection (L4) every
    # client connection stays on the one backend it was given; per request
    # (L7) each one is answered by several.
    reached = table_rows(section(out, "backends reached per client connection"))
    assert [row[0] for row in reached] == [str(k) for k in range(1, BACKENDS + 1)], reached
    l4 = [int(row[1]) for row in reached]
    l7 = [int(row[2]) for row in reached]
    assert l4 == [CONNECTIONS] + [0] * (BACKENDS - 1), reached
    assert sum(l7) == CONNECTIONS and l7[0] == 0, reached

    summary = {row[0]: row[1:] for row in table_rows(section(out, "side by side"))}
    wall = summary.get("wall time, s")
    assert wall is not None and all(float(x) > 0 for x in wall), summary

    svg = (tmp_path / "routing.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg[:2000]
    # The chart keeps its text as text: each panel is there by its title,
    # and the backends' connection counts (the same in both modes) are not.
    for title in ("requests served, per backend", "busy time per backend, s",
                  "backends reached per client connection", "wall time of the HTTP workload, s"):
        assert title in svg, title
    assert "backend connections" not in svg

    if "## Database pool: skipped" in out:
        assert "PostgreSQL pool: not measured" in svg
        return
    assert "share of transactions on server b" in svg
    assert "transactions per second" in svg
    db = re.split(r"^## Database pool", out, flags=re.M)[1]
    runs = {(row[0], row[1]): row for row in table_rows(db)}
    assert set(runs) == {(s, c) for s in ("steady", "scale-out")
                         for c in ("pgbench", "pgbench -C")}, db
    for (scenario, client), row in runs.items():
        xacts_a, xacts_b = int(row[2]), int(row[3])
        sessions_a, sessions_b = (int(x) for x in row[5].split(" / "))
        assert row[8] == "ok", row
        if client == "pgbench":
            # A pool: each of its connections is placed once and keeps its
            # server session for the whole run.
            assert sessions_a + sessions_b == PG_CLIENTS, row
        else:
            # -C: a new connection, hence a new server session, for every
            # transaction (counted as distinct backend PIDs: a PID is not
            # reused within a few seconds).
            assert (sessions_a, sessions_b) == (xacts_a, xacts_b), row
    # A server added while the pool's connections are open gets nothing from
    # them; connecting per transaction reaches it once it is in.
    assert int(runs["scale-out", "pgbench"][3]) == 0, runs
    assert int(runs["scale-out", "pgbench -C"][3]) > 0, runs
    assert int(runs["steady", "pgbench"][2]) > 0 and int(runs["steady", "pgbench"][3]) > 0, runs
