"""What the admin API tells people (docs/operations.md, "Admin API, metrics
and the status page"): `curl -d @file` to PUT /config (curl drops the line
breaks) gets a hint to use --data-binary, a browser's first request before
its login is not a warning, and a change names the HTTP Basic user who
asked for it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

import harness
from harness import listener, upstream
from test_admin import admin_sluice, request, server_path, status  # noqa: F401  (fixture)
from test_admin_defects import TOKEN, basic, with_token
CURL = shutil.which("curl")


def basic_auth(user: str, password: str = TOKEN) -> dict[str, str]:
    return {"Authorization": basic(user, password)}


def test_put_config_without_line_breaks_gets_a_hint(admin_sluice, backends):
    a = backends(harness.banner_handler, name="A")
    s = admin_sluice([listener()], {"up": upstream(a)})
    gen = status(s)["config"]["generation"]
    file_before = s.config_path.read_text()
    text = "# sluice, as deployed\n" + file_before
    # What `curl -d @file` sends: the file without its line breaks (here a
    # comment that swallows everything), and the same starting with a table.
    for body in (text.replace("\r", "").replace("\n", ""), file_before.replace("\n", "")):
        r = request(s, "PUT", "/config", body=body)
        assert r.status == 400, r
        doc = r.json()
        assert doc["ok"] is False and doc["error"].startswith("PUT /config body:1:"), doc
        assert "--data-binary" in doc.get("hint", ""), doc
    # A broken body with its line breaks: the error alone.
    r = request(s, "PUT", "/config", body=text.replace("[[listener]]", "[[listenr]]"))
    assert r.status == 400 and "hint" not in r.json(), r
    assert status(s)["config"]["generation"] == gen
    assert s.config_path.read_text() == file_before


@pytest.mark.skipif(CURL is None, reason="curl not installed")
def test_curl_d_gets_the_hint_and_data_binary_works(admin_sluice, backends, tmp_path):
    a = backends(harness.banner_handler, name="A")
    s = admin_sluice([listener()], {"up": upstream(a)})
    gen = status(s)["config"]["generation"]
    conf = tmp_path / "new.toml"
    conf.write_text("# the new configuration\n" + s.config_path.read_text())
    url = f"http://{s.admin_addr[0]}:{s.admin_addr[1]}/config"

    def curl(*args):
        out = subprocess.run([CURL, "-sS", "-X", "PUT", *args, url], capture_output=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    doc = curl("-d", f"@{conf}")
    assert doc["ok"] is False and "--data-binary" in doc.get("hint", ""), doc
    assert status(s)["config"]["generation"] == gen
    doc = curl("--data-binary", f"@{conf}")
    assert doc["ok"] is True and "hint" not in doc, doc
    assert status(s)["config"]["generation"] == gen + 1


def test_a_browser_first_request_is_info_a_wrong_token_a_warning(admin_sluice, backends, tmp_path):
    s, _ = with_token(admin_sluice, backends, tmp_path)
    # What a browser sends before it has asked for the login.
    r = request(s, "GET", "/", headers={"Accept": "text/html"})
    assert r.status == 401
    s.log.wait_for(r"\[info\] admin: a request without credentials from 127\.0\.0\.1:\d+ \(GET /\): "
                   r"answered 401", timeout=5)
    assert not s.log.matches(r"\[warning\] admin: unauthorized")
    r = request(s, "GET", "/", headers=basic_auth("eve", "guess"))
    assert r.status == 401
    s.log.wait_for(r'\[warning\] admin: unauthorized request from 127\.0\.0\.1:\d+ as user "eve" \(GET /\)',
                   timeout=5)


def test_changes_name_the_basic_user(admin_sluice, backends, tmp_path):
    s, a = with_token(admin_sluice, backends, tmp_path)
    addr = re.escape(a.address)
    r = request(s, "POST", server_path("up", a.address, "drain"), headers=basic_auth("alice"))
    assert r.status == 200, r
    s.log.wait_for(rf'server {addr} draining: .*\(by 127\.0\.0\.1:\d+ as user "alice"\)', timeout=5)
    r = request(s, "PUT", server_path("up", a.address, "weight"), body="3", headers=basic_auth("alice"))
    assert r.status == 200, r
    s.log.wait_for(rf'server {addr} weight set to 3 .* by 127\.0\.0\.1:\d+ as user "alice"', timeout=5)
    r = request(s, "POST", "/healthcheck/fail", headers=basic_auth("bob"))
    assert r.status == 200, r
    s.log.wait_for(r'readiness off by POST /healthcheck/fail from 127\.0\.0\.1:\d+ as user "bob"', timeout=5)
    r = request(s, "POST", "/reload", headers=basic_auth("carol"))
    assert r.status == 200, r
    s.log.wait_for(r'admin: POST /reload from 127\.0\.0\.1:\d+ as user "carol"', timeout=5)
    r = request(s, "PUT", "/config", body=s.config_path.read_text(), headers=basic_auth("carol"))
    assert r.status == 200, r
    s.log.wait_for(r'admin: PUT /config from 127\.0\.0\.1:\d+ as user "carol"', timeout=5)
    # Bearer carries no user name: the address alone, as before.
    r = request(s, "POST", server_path("up", a.address, "enable"), token=TOKEN)
    assert r.status == 200, r
    s.log.wait_for(rf"server {addr} enabled \(by 127\.0\.0\.1:\d+\)$", timeout=5)
    # A user name is the client's bytes: it cannot start a line of its own.
    r = request(s, "POST", server_path("up", a.address, "drain"), headers=basic_auth("mallory\n[error] forged"))
    assert r.status == 200, r
    s.log.wait_for(r'draining: .*\(by 127\.0\.0\.1:\d+ as user "mallory\\x0a\[error\]\\x20forged"\)', timeout=5)
    assert not s.log.matches(r"^\[error\] forged")
