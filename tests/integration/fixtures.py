"""Fixtures shared by the integration and end-to-end suites."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

import harness


@pytest.fixture
def backends():
    """make(handler=echo_handler, name=..., host=..., port=0) -> Backend."""
    started: list[harness.Backend] = []

    def make(handler=harness.echo_handler, name="backend", host="127.0.0.1", port=0):
        b = harness.Backend(handler, name=name, host=host, port=port)
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


def default_global(access_log: Path) -> dict:
    return {
        "workers": 1,
        "log_level": "info",
        "access_log": str(access_log),
        # Keeps teardown short when a test leaves a session open.
        "shutdown_timeout": "2s",
    }


@pytest.fixture
def sluice(tmp_path):
    """make(listeners=[...], upstreams={...}, global_={...}) -> started Sluice.

    `global_` entries override the defaults above (workers=1, access log in
    the test's temp dir). Pass start=False to get an unstarted instance.
    """
    started: list[harness.Sluice] = []
    counter = itertools.count(1)

    def make(listeners, upstreams, global_=None, name=None, nofile=None, start=True, nofile_cap=None):
        name = name or f"sluice{next(counter)}"
        access_log = tmp_path / f"{name}.access.log"
        g = default_global(access_log)
        g.update(global_ or {})
        text = harness.render_config(g, listeners, upstreams)
        s = harness.Sluice(tmp_path, text, [l["name"] for l in listeners], name=name,
                           nofile=nofile, access_log=access_log, nofile_cap=nofile_cap)
        started.append(s)
        if start:
            s.start()
        return s

    yield make
    stop_all_cleanly(started)


def stop_all_cleanly(started) -> None:
    """Stops every started sluice; fails the test when one did not exit 0."""
    problems = []
    for s in started:
        if s.proc is None:
            continue
        rc = s.stop()
        if rc != 0:
            tail = "\n".join(s.log.lines[-40:]) if s.log else ""
            problems.append(f"{s.config_path.name}: exit status {rc} after SIGTERM "
                            f"(want 0 within 10s)\n{tail}")
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)
