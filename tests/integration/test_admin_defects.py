"""The admin API against clients that used to break it: a crowd of idle
connections, a client that sends FIN right after its request, a symbolic
link as the configuration file, `Expect: 100-continue` without a token, a
lower-case `bearer`, HEAD, and a browser logging in with HTTP Basic
(docs/operations.md, "Admin API, metrics and the status page")."""

from __future__ import annotations

import base64
import os
import re
import socket
import time
import urllib.error
import urllib.request

import harness
from harness import listener, upstream
from test_admin import admin_sluice, parse_raw, raw_exchange, request  # noqa: F401  (admin_sluice: a fixture)

TOKEN = "s3cret-Tok3n"


def with_token(admin_sluice, backends, tmp_path, upstreams=None, start=True):
    a = backends(harness.banner_handler, name="A")
    token_file = tmp_path / "admin.token"
    token_file.write_text(TOKEN + "\n")
    s = admin_sluice([listener()], upstreams or {"up": upstream(a)},
                     admin={"listen": "127.0.0.1:0", "token_file": str(token_file)}, start=start)
    return s, a


def head_lines(resp: bytes) -> list[str]:
    """The header lines of a raw answer, as sent (repeated headers kept)."""
    head = resp.partition(b"\r\n\r\n")[0].decode("latin-1")
    return head.split("\r\n")[1:]


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def exchange(s, text: str) -> tuple[int, dict[str, str], bytes]:
    return parse_raw(raw_exchange(s.admin_addr, text.encode()))


# --------------------------------------------------------------------------
# idle connections
# --------------------------------------------------------------------------

def test_idle_connections_never_lock_the_operator_out(admin_sluice, backends, tmp_path):
    s, a = with_token(admin_sluice, backends, tmp_path)

    # An operator in the middle of a request (headers in, with the token, the
    # body still coming) is never the one closed to make room.
    busy = harness.connect(*s.admin_addr, timeout=20)
    path = f"/upstreams/up/servers/{a.address}/weight"
    busy.sendall(f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
                 f"Content-Length: 2\r\n\r\n".encode())
    time.sleep(0.2)

    crowd: list[socket.socket] = []
    try:
        for _ in range(200):
            crowd.append(harness.connect(*s.admin_addr, timeout=5))
        # Five requests with the token, one after the other while the crowd
        # sits there: every one is answered.
        answers = []
        for _ in range(5):
            try:
                answers.append(request(s, "GET", "/status", token=TOKEN).status)
            except OSError as e:
                answers.append(repr(e))
        assert answers == [200] * 5, answers
        s.log.wait_for(r"admin: 64 connections open: closed the oldest one without a request", timeout=5)

        busy.sendall(b"7\n")
        code, _, body = parse_raw(harness.recv_all(busy))
        assert code == 200, (code, body[:300])
    finally:
        busy.close()
        for c in crowd:
            c.close()
    assert request(s, "GET", "/status", token=TOKEN).json()["upstreams"][0]["servers"][0]["weight"] == 7
    assert s.running()


def test_a_client_that_sends_no_headers_is_answered_408_before_the_request_deadline(admin_sluice, backends,
                                                                                  tmp_path):
    s, _ = with_token(admin_sluice, backends, tmp_path)
    c = harness.connect(*s.admin_addr, timeout=20)
    try:
        c.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n")  # and never the end of the headers
        t0 = time.monotonic()
        resp = harness.recv_all(c)
        waited = time.monotonic() - t0
    finally:
        c.close()
    code, _, body = parse_raw(resp)
    assert code == 408, (code, body[:200])
    assert "headers" in body.decode(), body
    # The header deadline (3 s), not the 10 s a whole request may take.
    assert 2.0 <= waited < 9.0, f"408 after {waited:.1f}s"


# --------------------------------------------------------------------------
# a FIN right after the request
# --------------------------------------------------------------------------

def test_fin_after_the_request_still_gets_the_whole_answer(admin_sluice, backends, tmp_path):
    # Many servers make /metrics far larger than what the kernel buffers
    # take at once, so the answer is still being written when the FIN is read.
    a = backends(harness.banner_handler, name="A")
    servers = [a.address] + [f"127.0.0.1:{p}" for p in range(20001, 20200)]
    s, _ = with_token(admin_sluice, backends, tmp_path, upstreams={"up": upstream(*servers)})

    # A remote scraper's segment size (loopback's 64 KiB segments would let
    # the kernel take a whole answer at once) and a small receive window.
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1448)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.settimeout(20)
    c.connect(s.admin_addr)
    try:
        c.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
        c.shutdown(socket.SHUT_WR)
        time.sleep(0.5)  # sluice reads the FIN while the answer is in flight
        resp = bytearray()
        while True:  # a slow reader, as across a slow link
            chunk = c.recv(4096)
            if not chunk:
                break
            resp += chunk
            time.sleep(0.001)
    finally:
        c.close()
    code, headers, body = parse_raw(bytes(resp))
    assert code == 200, (code, body[:200])
    declared = int(headers["content-length"])
    assert declared > 200_000, declared
    assert len(body) == declared, f"{len(body)} of {declared} declared bytes arrived"
    assert body.endswith(b"\n"), body[-200:]


# --------------------------------------------------------------------------
# PUT /config
# --------------------------------------------------------------------------

def test_put_config_writes_through_symbolic_links(admin_sluice, backends, tmp_path):
    s, a = with_token(admin_sluice, backends, tmp_path, start=False)
    b = backends(harness.banner_handler, name="B")
    # sluice.toml -> conf/current.toml -> real.toml (both links relative).
    conf = s.workdir / "conf"
    conf.mkdir()
    real = conf / "real.toml"
    real.write_text(s.config_path.read_text())
    s.config_path.unlink()
    os.symlink("real.toml", conf / "current.toml")
    os.symlink("conf/current.toml", s.config_path)
    s.start()
    entries = (sorted(os.listdir(s.workdir)), sorted(os.listdir(conf)))

    body = "# through the links\n" + s.render([listener()], {"up": upstream(b)})
    r = request(s, "PUT", "/config", body=body, token=TOKEN)
    assert r.status == 200, r
    assert os.readlink(s.config_path) == "conf/current.toml"
    assert os.readlink(conf / "current.toml") == "real.toml"
    assert real.read_text() == body
    assert (sorted(os.listdir(s.workdir)), sorted(os.listdir(conf))) == entries
    c = s.connect(timeout=5)
    try:
        assert harness.recv_line(c) == b"B"
    finally:
        c.close()
    res = harness.run_check(s.config_path)
    assert res.returncode == 0, res.stderr.decode()


def test_put_config_errors_name_the_body(admin_sluice, backends, tmp_path):
    s, a = with_token(admin_sluice, backends, tmp_path)
    before = s.config_path.read_text()
    lines = s.render([listener()], {"up": upstream(a)}).split("\n")
    i = lines.index("workers = 1")
    lines[i] = 'workers = "x"'
    r = request(s, "PUT", "/config", body="\n".join(lines), token=TOKEN)
    assert r.status == 400, r
    err = r.error()
    assert err.startswith(f"PUT /config body:{i + 1}:{len('workers = ') + 1}: "), err
    assert str(s.config_path) not in err, err
    assert s.config_path.read_text() == before

    # A syntax error too.
    r = request(s, "PUT", "/config", body="[global]\nworkers = 1\n[[listener]\n", token=TOKEN)
    assert r.status == 400, r
    assert r.error().startswith("PUT /config body:3:"), r.error()

    # A good body still names the file it was written to.
    r = request(s, "PUT", "/config", body="\n".join(lines).replace('workers = "x"', "workers = 1"), token=TOKEN)
    assert r.status == 200, r
    assert str(s.config_path) in r.json()["message"], r.json()


# --------------------------------------------------------------------------
# HTTP details
# --------------------------------------------------------------------------

def test_expect_continue_needs_the_token_first(admin_sluice, backends, tmp_path):
    s, _ = with_token(admin_sluice, backends, tmp_path)
    head = "PUT /config HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1048576\r\nExpect: 100-continue\r\n"
    for auth in ("", "Authorization: Bearer wrong\r\n"):
        resp = raw_exchange(s.admin_addr, (head + auth + "\r\n").encode())
        assert b"100 Continue" not in resp, resp[:300]
        code, _, body = parse_raw(resp)
        assert code == 401, (auth, code, body[:200])

    # With the token: 100 Continue, then the body, then the answer.
    body = b"[global]\nworkers = true\n"
    c = harness.connect(*s.admin_addr, timeout=10)
    try:
        c.sendall(f"PUT /config HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
                  f"Expect: 100-continue\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
        first = b""
        while b"\r\n\r\n" not in first:
            chunk = c.recv(1)
            assert chunk, first
            first += chunk
        assert first == b"HTTP/1.1 100 Continue\r\n\r\n", first
        c.sendall(body)
        code, _, answer = parse_raw(harness.recv_all(c))
    finally:
        c.close()
    assert code == 400, answer
    assert b"PUT /config body:2:" in answer, answer


def test_the_authorization_scheme_is_case_insensitive(admin_sluice, backends, tmp_path):
    s, _ = with_token(admin_sluice, backends, tmp_path)
    for auth in (f"bearer {TOKEN}", f"BEARER {TOKEN}", f"Bearer  {TOKEN}", "basic" + basic("x", TOKEN)[5:]):
        r = request(s, "GET", "/status", headers={"Authorization": auth})
        assert r.status == 200, (auth, r)
    for auth in (f"bearer {TOKEN.lower()}", f"bearer{TOKEN}", f"Bear {TOKEN}", TOKEN):
        r = request(s, "GET", "/status", headers={"Authorization": auth})
        assert r.status == 401, (auth, r)


def test_head_has_the_headers_and_no_body(admin_sluice, backends, tmp_path):
    s, _ = with_token(admin_sluice, backends, tmp_path)
    auth = f"Authorization: Bearer {TOKEN}\r\n"
    for path, ctype in (("/status", "application/json"), ("/", "text/html"), ("/metrics", "text/plain")):
        code, headers, body = exchange(s, f"HEAD {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n")
        assert code == 200, (path, code, body[:200])
        assert headers["content-type"].startswith(ctype), (path, headers)
        assert int(headers["content-length"]) > 100, (path, headers)
        assert body == b"", (path, body[:200])

    # Same headers as GET, Content-Length included, where the body is fixed.
    g_code, g_headers, g_body = exchange(s, f"GET /nope HTTP/1.1\r\nHost: x\r\n{auth}\r\n")
    h_code, h_headers, h_body = exchange(s, f"HEAD /nope HTTP/1.1\r\nHost: x\r\n{auth}\r\n")
    assert g_code == h_code == 404
    assert g_headers == h_headers
    assert int(g_headers["content-length"]) == len(g_body) > 0
    assert h_body == b""

    # A refused HEAD too.
    code, headers, body = exchange(s, "HEAD /status HTTP/1.1\r\nHost: x\r\n\r\n")
    assert code == 401 and int(headers["content-length"]) > 0 and body == b"", (code, headers, body)


# --------------------------------------------------------------------------
# a browser logs in
# --------------------------------------------------------------------------

def test_a_browser_logs_in_with_basic_and_the_token_as_password(admin_sluice, backends, tmp_path):
    s, a = with_token(admin_sluice, backends, tmp_path)

    # The challenge a browser answers with its login dialog.
    resp = raw_exchange(s.admin_addr, b"GET / HTTP/1.1\r\nHost: x\r\nAccept: text/html\r\n\r\n")
    code, _, _ = parse_raw(resp)
    assert code == 401
    assert 'WWW-Authenticate: Basic realm="sluice"' in head_lines(resp), head_lines(resp)

    # What a browser does with it: asks, then sends the user name and
    # password (any name, the token as the password) on every request.
    url = f"http://{s.admin_addr[0]}:{s.admin_addr[1]}/"
    for user in ("admin", "someone else", ""):
        passwords = urllib.request.HTTPPasswordMgrWithDefaultRealm()
        passwords.add_password(None, url, user, TOKEN)
        opener = urllib.request.build_opener(urllib.request.HTTPBasicAuthHandler(passwords))
        with opener.open(url, timeout=10) as page:
            assert page.status == 200
            assert page.headers["Content-Type"].startswith("text/html")
            assert b"<html" in page.read().lower()

    # Wrong password, the token as the user name, malformed: refused.
    for auth in (basic("admin", "wrong"), basic(TOKEN, ""), basic("admin", TOKEN + "x"), "Basic !!!",
                 "Basic " + base64.b64encode(TOKEN.encode()).decode()):
        r = request(s, "GET", "/", headers={"Authorization": auth})
        assert r.status == 401, (auth, r)

    # The page's actions work with the same login; scripts keep Bearer.
    r = request(s, "POST", f"/upstreams/up/servers/{a.address}/drain", headers={"Authorization": basic("ops", TOKEN)})
    assert r.status == 200 and r.json()["state"] == "drained", r
    r = request(s, "POST", f"/upstreams/up/servers/{a.address}/enable", token=TOKEN)
    assert r.status == 200 and r.json()["state"] == "up", r
    try:
        urllib.request.urlopen(url, timeout=10)
        raise AssertionError("no login, yet the page was served")
    except urllib.error.HTTPError as e:
        assert e.code == 401
        assert any(re.fullmatch(r'Basic realm="sluice"', v) for v in e.headers.get_all("WWW-Authenticate"))
