"""A real browser logs in to the status page when the admin API has a token:
headless Chromium answers sluice's `WWW-Authenticate: Basic` challenge with
the user name and password of the URL (any user name, the token as the
password), and gets nowhere with a wrong password."""

from __future__ import annotations

import pytest

import harness
from harness import listener, upstream
from status_rows import StatusPageRows
from test_admin import admin_sluice  # noqa: F401  (fixture)
from test_status_page import CHROMIUM, dump_dom

TOKEN = "s3cret-Tok3n"


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian package chromium)")
def test_chromium_logs_in_with_the_token_as_password(admin_sluice, backends, tmp_path):
    a = backends(harness.banner_handler, name="A")
    token_file = tmp_path / "admin.token"
    token_file.write_text(TOKEN + "\n")
    s = admin_sluice([listener()], {"up": upstream(a)},
                     admin={"listen": "127.0.0.1:0", "token_file": str(token_file)})
    host, port = s.admin_addr

    dom = dump_dom(f"http://operator:{TOKEN}@{host}:{port}/", tmp_path / "profile-good")
    rows = StatusPageRows()
    rows.feed(dom)
    assert set(rows.rows) == {a.address}, f"server rows {rows.rows}; DOM:\n{dom[:2000]}"

    for name, url in (("wrong password", f"http://operator:wrong@{host}:{port}/"),
                      ("no login", f"http://{host}:{port}/")):
        dom = dump_dom(url, tmp_path / f"profile-{name.replace(' ', '-')}")
        rows = StatusPageRows()
        rows.feed(dom)
        assert not rows.rows, f"{name}: the page was served: {dom[:500]}"
    s.log.wait_for(r"admin: unauthorized request from 127\.0\.0\.1:\d+", timeout=5)
