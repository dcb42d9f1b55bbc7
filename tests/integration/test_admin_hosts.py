"""DNS rebinding against the admin API (docs/operations.md, "Which names may
change things"): a web page whose own name the attacker has pointed at
127.0.0.1 sends requests with `Host` and `Origin` both that foreign name, so
the Origin check alone lets them through. A request that changes something
must name the admin API in `Host`: its own address, `localhost`, a literal
IP, or a name in `[admin] allowed_hosts`; anything else is refused before
it reaches a handler, and nothing changes."""

from __future__ import annotations

import http.client
import json

import harness
from harness import listener, upstream
from test_admin import admin_sluice, parse_raw, raw_exchange, server_path, status  # noqa: F401  (fixture)
from test_admin_defects import TOKEN, with_token

REBOUND = "rebind.attacker.example"


def call(s, method: str, path: str, host: str | None, body: bytes | None = None, origin: str | None = None,
         token: str | None = None) -> tuple[int, dict]:
    """One request with exactly the Host (and Origin) a browser would send."""
    conn = http.client.HTTPConnection(*s.admin_addr, timeout=10)
    headers = {}
    if host is not None:
        headers["Host"] = host
    if origin is not None:
        headers["Origin"] = origin
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
    finally:
        conn.close()
    try:
        doc = json.loads(data)
    except ValueError:
        doc = {"raw": data[:200].decode("latin-1")}
    return r.status, doc


def changes(s, a) -> list[tuple[str, str, bytes | None]]:
    """Every kind of change a page could ask for."""
    config = s.config_path.read_text().encode()
    return [
        ("POST", "/healthcheck/fail", None),
        ("POST", "/reload", None),
        ("PUT", "/config", config),
        ("POST", server_path("up", a.address, "drain"), None),
        ("POST", server_path("up", a.address, "disable"), None),
        ("PUT", server_path("up", a.address, "weight"), b"7"),
        ("POST", "/upgrade", None),
    ]


def test_a_rebound_page_changes_nothing(admin_sluice, backends):
    a = backends(harness.banner_handler, name="A")
    s = admin_sluice([listener()], {"up": upstream(a)})
    port = s.admin_addr[1]
    before = status(s)
    file_before = s.config_path.read_text()
    for host in (f"{REBOUND}:{port}", REBOUND):
        for method, path, body in changes(s, a):
            # The page's own origin: what a browser sends after the rebinding.
            code, doc = call(s, method, path, host, body, origin=f"http://{host}")
            assert code in (421, 403), (method, path, host, code, doc)
            assert "allowed_hosts" in doc.get("error", ""), (method, path, doc)
            # A script (no Origin) with that name is refused the same way.
            code, doc = call(s, method, path, host, body)
            assert code in (421, 403), (method, path, host, code, doc)
    after = status(s)
    assert after["config"]["generation"] == before["config"]["generation"]
    assert after["upgrade"]["state"] == "none", after["upgrade"]
    assert s.config_path.read_text() == file_before
    srv = after["upstreams"][0]["servers"][0]
    assert (srv["state"], srv["weight"]) == ("up", 1), srv
    code, doc = call(s, "GET", "/ready", f"127.0.0.1:{port}")
    assert (code, doc["ready"]) == (200, True), doc
    s.log.wait_for(rf"\[warning\] admin: refused POST /healthcheck/fail from 127\.0\.0\.1:\d+: "
                   rf"Host \"{REBOUND}:{port}\"", timeout=5)
    # Reading changes nothing: answered whatever the name (docs say why).
    code, doc = call(s, "GET", "/status", f"{REBOUND}:{port}")
    assert code == 200 and doc["config"]["generation"] == before["config"]["generation"], doc


def test_the_admin_api_own_names_may_change_things(admin_sluice, backends):
    a = backends(harness.banner_handler, name="A")
    s = admin_sluice([listener()], {"up": upstream(a)},
                     admin={"listen": "127.0.0.1:0", "allowed_hosts": ["LB1.example", "ops.example:8443"]})
    port = s.admin_addr[1]
    allowed = [f"127.0.0.1:{port}", "127.0.0.1", "127.0.0.1:1", "localhost", f"localhost:{port}",
               "LocalHost:8080", "localhost.", f"[::1]:{port}", "[::1]", "10.9.8.7", "[2001:db8::1]:80",
               f"lb1.example:{port}", "lb1.EXAMPLE", "lb1.example.", "ops.example:8443"]
    refused = [f"{REBOUND}:{port}", "lb1.example.attacker.example", "attacker-lb1.example", "ops.example",
               "ops.example:8444", "localhost.attacker.example", "127.0.0.1.attacker.example", "::1",
               "[::1", "10.9.8.7:port", "lb1.example, 127.0.0.1", ""]
    for host in allowed:
        for action in ("fail", "ok"):
            code, doc = call(s, "POST", f"/healthcheck/{action}", host)
            assert code == 200, (host, action, doc)
    for host in refused:
        code, doc = call(s, "POST", "/healthcheck/fail", host)
        assert code in (421, 403, 400), (host, code, doc)
    code, doc = call(s, "GET", "/ready", "localhost")
    assert code == 200, doc  # the refused "fail"s did not take


def test_the_status_page_origin_still_works(admin_sluice, backends):
    """The page's buttons: Host is the address the browser used, Origin the page's."""
    a = backends(harness.banner_handler, name="A")
    s = admin_sluice([listener()], {"up": upstream(a)})
    host = f"127.0.0.1:{s.admin_addr[1]}"
    code, doc = call(s, "POST", server_path("up", a.address, "drain"), host, origin=f"http://{host}")
    assert code == 200 and doc["state"] == "drained", doc
    code, doc = call(s, "POST", server_path("up", a.address, "enable"), host, origin=f"http://{host}")
    assert code == 200 and doc["state"] == "up", doc


def test_a_token_does_not_lift_the_host_check(admin_sluice, backends, tmp_path):
    s, _ = with_token(admin_sluice, backends, tmp_path)
    port = s.admin_addr[1]
    # Without the token: 401 first, whatever the name.
    code, _ = call(s, "POST", "/healthcheck/fail", f"{REBOUND}:{port}")
    assert code == 401
    code, doc = call(s, "POST", "/healthcheck/fail", f"{REBOUND}:{port}", token=TOKEN)
    assert code == 421, doc
    code, doc = call(s, "GET", "/ready", f"127.0.0.1:{port}")
    assert code == 200, doc
    code, doc = call(s, "POST", "/healthcheck/fail", f"127.0.0.1:{port}", token=TOKEN)
    assert code == 200, doc


def test_allowed_hosts_follows_a_reload(admin_sluice, backends):
    a = backends(harness.banner_handler, name="A")
    s = admin_sluice([listener()], {"up": upstream(a)})
    code, _ = call(s, "POST", "/healthcheck/fail", "lb1.example")
    assert code == 421
    s.config_path.write_text(s.render([listener()], {"up": upstream(a)},
                                      admin={"listen": "127.0.0.1:0", "allowed_hosts": ["lb1.example"]}))
    code, doc = call(s, "POST", "/reload", "localhost")
    assert code == 200 and doc["restart_required"] == [], doc
    code, doc = call(s, "POST", "/healthcheck/fail", "lb1.example")
    assert code == 200, doc
    code, doc = call(s, "POST", "/healthcheck/ok", "lb1.example:1234")
    assert code == 200, doc


def test_a_request_without_host(admin_sluice, backends):
    a = backends(harness.banner_handler, name="A")
    s = admin_sluice([listener()], {"up": upstream(a)})
    # HTTP/1.1 requires Host (RFC 9112): 400, for reads too.
    code, _, body = parse_raw(raw_exchange(s.admin_addr, b"GET /status HTTP/1.1\r\n\r\n"))
    assert code == 400 and b"Host" in body, body
    code, _, body = parse_raw(raw_exchange(s.admin_addr, b"GET /status HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"))
    assert code == 400 and b"Host" in body, body
    # HTTP/1.0 may omit it: a read is answered, a change is refused.
    code, _, _ = parse_raw(raw_exchange(s.admin_addr, b"GET /status HTTP/1.0\r\n\r\n"))
    assert code == 200
    code, _, body = parse_raw(raw_exchange(s.admin_addr, b"POST /healthcheck/fail HTTP/1.0\r\n\r\n"))
    assert code == 421, body
    assert call(s, "GET", "/ready", "localhost")[0] == 200


def test_bad_allowed_hosts_name_their_place(tmp_path, backends):
    a = backends(harness.banner_handler, name="A")
    base = harness.render_config({"access_log": "off"}, [listener()], {"up": upstream(a)})
    for value, wanted in (('"lb1.example"', "allowed_hosts"),
                          ('["bad name"]', "allowed_hosts"),
                          ('["*.example.com"]', "allowed_hosts"),
                          ('[""]', "allowed_hosts"),
                          ('["lb1.example:99999"]', "allowed_hosts"),
                          ('["http://lb1.example"]', "allowed_hosts"),
                          ('[7]', "allowed_hosts")):
        path = tmp_path / "bad.toml"
        text = base + f'\n[admin]\nlisten = "127.0.0.1:0"\nallowed_hosts = {value}\n'
        path.write_text(text)
        line = text.split("\n").index(f"allowed_hosts = {value}") + 1
        r = harness.run_check(path)
        err = r.stderr.decode() + r.stdout.decode()
        assert r.returncode != 0, (value, err)
        assert f"{path}:{line}:" in err and wanted in err, (value, err)
    path = tmp_path / "good.toml"
    path.write_text(base + '\n[admin]\nlisten = "127.0.0.1:0"\nallowed_hosts = ["lb1.example", "Ops.Example:8443", "a-b.c_d.example."]\n')
    r = harness.run_check(path)
    assert r.returncode == 0, r.stderr.decode() + r.stdout.decode()
