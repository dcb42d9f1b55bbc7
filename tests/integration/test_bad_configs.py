"""The corpus of broken files in tests/data/bad-configs, and good files that
use every newer key: `sluice -t` must reject each broken one with its
FILE:LINE:COLUMN and accept the good ones."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import harness

CORPUS = harness.REPO / "tests" / "data" / "bad-configs"
BAD_FILES = sorted(CORPUS.glob("*.toml"))


def header(path: Path) -> tuple[str, int, int]:
    lines = path.read_text().splitlines()
    m_expect = re.fullmatch(r"# expect: (.+)", lines[0])
    m_at = re.fullmatch(r"# at: (\d+):(\d+)", lines[1])
    assert m_expect and m_at, f"{path.name}: first lines must be '# expect: ...' and '# at: LINE:COLUMN'"
    return m_expect.group(1), int(m_at.group(1)), int(m_at.group(2))


def test_corpus_is_large_enough():
    assert len(BAD_FILES) >= 40, [p.name for p in BAD_FILES]


@pytest.mark.parametrize("path", BAD_FILES, ids=[p.stem for p in BAD_FILES])
def test_bad_config_is_rejected_at_its_position(path):
    expect, line, column = header(path)
    res = harness.run_check(path)
    err = [l for l in res.stderr.decode("utf-8", "replace").splitlines() if l.strip()]
    assert res.returncode == 1, f"{path.name}: exit {res.returncode}, stderr {err}"
    assert len(err) == 1, err
    prefix = f"{path}:{line}:{column}: "
    assert err[0].startswith(prefix), f"expected position {line}:{column}: {err[0]!r}"
    assert expect in err[0][len(prefix):], f"{expect!r} missing from {err[0]!r}"


def good_files(tmp_path: Path) -> dict[str, str]:
    token = tmp_path / "admin.token"
    token.write_text("0123456789abcdef\n")
    password = tmp_path / "monitor.password"
    password.write_text("secret\n")
    return {
        "everything": f"""\
[global]
error_log = "{tmp_path}/error.log"
log_interval = "1m"
drain_timeout = "30s"

[admin]
listen = "0.0.0.0:0"
token_file = "{token}"

[[listener]]
name = "plain"
listen = "127.0.0.1:0"
upstream = "pg"
tcp_keepalive_idle = "30s"
tcp_keepalive_interval = "5s"
tcp_keepalive_count = 4
accept_proxy = true
trusted_proxies = ["10.0.0.0/8", "::1"]
allow = ["127.0.0.0/8", "2001:db8::/32", "192.0.2.7"]
deny = ["127.0.0.2"]
max_connections = 1000
client_max_connections = 20
client_rate_limit = "6000/m"
splice = "auto"

[[listener]]
name = "pg_tls"
listen = "127.0.0.1:0"
preread = "postgres"
routes = [{{ sni = "db.example.test", upstream = "hashed" }}]
default_upstream = "pg"
tcp_keepalive = false

[upstream.pg]
all_down = "fail_open"
proxy_protocol = "v2"
drain_timeout = "0s"
servers = [{{ address = "127.0.0.1:5432" }}, {{ address = "127.0.0.1:5433" }}]

[upstream.pg.health]
type = "postgres"
role = "primary"
interval = "3s"
timeout = "3s"
rise = 1
fall = 2
jitter = "25%"
initial = "down"
on_down = "close_sessions"
slow_start = "20s"
user = "monitor"
database = "app"
sslmode = "require"
password_file = "{password}"

[upstream.hashed]
balance = "hash"
hash_key = "sni"
servers = [{{ address = "127.0.0.1:5442" }}]
""",
        "http-check": """\
[[listener]]
name = "web"
listen = "127.0.0.1:0"
upstream = "web"

[upstream.web]
servers = [{ address = "127.0.0.1:8080" }]

[upstream.web.health]
type = "http"
port = 8008
path = "/primary"
method = "GET"
host = "patroni.internal"
expect_status = [200, "300-302"]
expect_body = "running"
""",
        "redis-checks": f"""\
[[listener]]
name = "redis"
listen = "127.0.0.1:0"
upstream = "redis"
protocol = "redis"
preread_timeout = "2s"

[upstream.redis]
proxy_protocol = "v1"
servers = [{{ address = "127.0.0.1:6379" }}, {{ address = "127.0.0.1:6380" }}]

[upstream.redis.health]
type = "redis"
role = "master"
password_file = "{password}"

[upstream.resp_ping]
servers = [{{ address = "127.0.0.1:25" }}]

[upstream.resp_ping.health]
type = "send_expect"
send_hex = "2a 31 0d 0a 24 34 0d 0a 50 49 4e 47 0d 0a"
expect = "+PONG"
expect_match = "substring"
""",
        # What the package installs: no listener yet, only the admin API.
        "no-listener": """\
[admin]
listen = "127.0.0.1:0"
""",
    }


@pytest.mark.parametrize("name", ["everything", "http-check", "redis-checks", "no-listener"])
def test_good_config_with_new_keys_passes(tmp_path, name):
    p = tmp_path / f"{name}.toml"
    p.write_text(good_files(tmp_path)[name])
    res = harness.run_check(p)
    assert res.returncode == 0, res.stderr.decode()


@pytest.mark.parametrize("example", ["postgres.toml", "sni.toml", "sluice.toml"])
def test_shipped_examples_pass(example):
    res = harness.run_check(harness.REPO / "conf" / example)
    assert res.returncode == 0, res.stderr.decode()
