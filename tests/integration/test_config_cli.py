"""Command line: -t, --version, -h, and config errors with file:line:column."""

from __future__ import annotations

import re
import subprocess

import pytest

import harness

GOOD = """\
[global]
workers = 1
log_level = "info"
access_log = "off"

[[listener]]
name = "main"
listen = "127.0.0.1:0"
upstream = "pg"
connect_timeout = "250ms"
idle_timeout = "5m"
tries = 2

[upstream.pg]
balance = "least_conn"
max_fails = 3
fail_timeout = "10s"
servers = [
  { address = "127.0.0.1:5432", weight = 2 },
  { address = "127.0.0.1:5433", max_conns = 10 },
  { address = "[::1]:5434", backup = true },
]
"""


def position_of(text: str, needle: str, occurrence: int = 1) -> tuple[int, int]:
    """1-based line and column of the n-th occurrence of needle."""
    idx = -1
    for _ in range(occurrence):
        idx = text.index(needle, idx + 1)
    line = text.count("\n", 0, idx) + 1
    col = idx - (text.rfind("\n", 0, idx) + 1) + 1
    return line, col


def write(tmp_path, text, name="sluice.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def err_lines(res: subprocess.CompletedProcess) -> list[str]:
    return [l for l in res.stderr.decode("utf-8", "replace").splitlines() if l.strip()]


def test_check_accepts_a_good_file(tmp_path):
    p = write(tmp_path, GOOD)
    res = harness.run_check(p)
    assert res.returncode == 0, res.stderr.decode()


def test_bad_weight_gives_exact_message(tmp_path):
    text = GOOD.replace('{ address = "127.0.0.1:5433", max_conns = 10 }',
                        '{ address = "127.0.0.1:5433", weight = 0 }')
    p = write(tmp_path, text)
    line, col = position_of(text, "weight = 0")
    col += len("weight = ")  # the value's position
    expected = f'{p}:{line}:{col}: upstream "pg" server 2: weight must be 1..1000, got 0'

    res = harness.run_check(p)
    assert res.returncode == 1
    assert err_lines(res) == [expected]

    # Running (not just checking) the same file fails the same way.
    res = harness.run_plain(p)
    assert res.returncode == 1
    assert expected in err_lines(res)


def test_weight_too_large_is_rejected(tmp_path):
    text = GOOD.replace("weight = 2", "weight = 1001")
    p = write(tmp_path, text)
    line, col = position_of(text, "1001")
    res = harness.run_check(p)
    assert res.returncode == 1
    assert err_lines(res) == [
        f'{p}:{line}:{col}: upstream "pg" server 1: weight must be 1..1000, got 1001']


# One bad line per case: (replace this, with that, token whose line must be reported,
# words the message must contain).
BAD_CASES = [
    ("tries = 2", "tries = 2\ncolour = \"blue\"", "colour", ["colour"]),
    ('fail_timeout = "10s"', 'fail_timeout = "10 parsecs"', '"10 parsecs"', ["fail_timeout"]),
    ('connect_timeout = "250ms"', "connect_timeout = 250", "250", ["connect_timeout"]),
    ('upstream = "pg"', 'upstream = "nope"', '"nope"', ["nope"]),
    ('balance = "least_conn"', 'balance = "fastest"', '"fastest"', ["balance", "fastest"]),
    ('listen = "127.0.0.1:0"', 'listen = "127.0.0.1"', '"127.0.0.1"', ["listen"]),
    ('listen = "127.0.0.1:0"', 'listen = "127.0.0.1:99999"', '"127.0.0.1:99999"', ["listen"]),
    ("tries = 2", "tries = 0", "tries = 0", ["tries"]),
    ("workers = 1", "workers = 1\nworkerz = 2", "workerz", ["workerz"]),
    ('servers = [', 'servers = [\n  { address = "127.0.0.1:1", wieght = 1 },', "wieght", ["wieght"]),
    ("max_fails = 3", "max_fails = -1", "-1", ["max_fails"]),
    ('log_level = "info"', 'log_level = "loud"', '"loud"', ["log_level"]),
]


@pytest.mark.parametrize("old,new,token,words", BAD_CASES,
                         ids=[c[2].strip('"').split()[0] for c in BAD_CASES])
def test_bad_value_names_file_line_column_and_key(tmp_path, old, new, token, words):
    assert old in GOOD
    text = GOOD.replace(old, new, 1)
    p = write(tmp_path, text)
    line, _ = position_of(text, token)
    res = harness.run_check(p)
    assert res.returncode == 1, "accepted a bad file"
    lines = err_lines(res)
    assert len(lines) == 1, lines
    m = re.match(rf"^{re.escape(str(p))}:(\d+):(\d+): (.+)$", lines[0])
    assert m, f"not FILE:LINE:COLUMN: message: {lines[0]!r}"
    assert int(m.group(1)) == line, lines[0]
    assert int(m.group(2)) >= 1
    for w in words:
        assert w in m.group(3), f"{w!r} missing from {lines[0]!r}"


def test_toml_syntax_error_has_position(tmp_path):
    text = GOOD.replace('name = "main"', 'name = "main')
    p = write(tmp_path, text)
    line, _ = position_of(text, 'name = "main')
    res = harness.run_check(p)
    assert res.returncode == 1
    lines = err_lines(res)
    assert len(lines) == 1, lines
    m = re.match(rf"^{re.escape(str(p))}:(\d+):(\d+): ", lines[0])
    assert m and int(m.group(1)) == line, lines[0]


def test_missing_file_is_an_error(tmp_path):
    p = tmp_path / "absent.toml"
    res = harness.run_check(p)
    assert res.returncode == 1
    lines = err_lines(res)
    assert lines and lines[0].startswith(f"{p}:"), lines


def test_version_and_help():
    version = re.search(r"version\s*:\s*'([^']+)'", (harness.REPO / "meson.build").read_text()).group(1)
    res = subprocess.run([str(harness.sluice_bin()), "--version"], capture_output=True, timeout=10)
    assert res.returncode == 0
    assert version in (res.stdout + res.stderr).decode()

    res = subprocess.run([str(harness.sluice_bin()), "-h"], capture_output=True, timeout=10)
    assert res.returncode == 0
    out = (res.stdout + res.stderr).decode()
    assert "-c" in out and "-t" in out


def test_the_file_may_be_named_without_c_and_with_long_options(tmp_path):
    good = write(tmp_path, GOOD)
    bad = write(tmp_path, GOOD.replace("tries = 2", "tries = 0"), name="bad.toml")
    for args in (["-t", str(good)], [str(good), "-t"], ["--test", "--config", str(good)]):
        res = subprocess.run([str(harness.sluice_bin()), *args], capture_output=True, timeout=10)
        assert res.returncode == 0, (args, res.stderr.decode())
    res = subprocess.run([str(harness.sluice_bin()), "-t", str(bad)], capture_output=True, timeout=10)
    assert res.returncode == 1, res.stderr.decode()
    assert err_lines(res)[0].startswith(f"{bad}:"), err_lines(res)
    # Two files are one too many: nothing is guessed.
    res = subprocess.run([str(harness.sluice_bin()), "-t", str(good), str(bad)], capture_output=True, timeout=10)
    assert res.returncode == 2, res.stderr.decode()
