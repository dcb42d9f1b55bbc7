"""The status page in a real browser: headless Chromium loads GET /, every
configured server has its row, coloured by state, a drain shows at once, and
the page renders on a phone-sized window. Driven through DevTools, the
page's own buttons drain, reweigh and enable servers under authentication,
after a confirmation. Screenshots are kept in each test's output folder."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import time
import urllib.request
import zlib
from pathlib import Path

import pytest

import harness
from fixtures import default_global
from harness import listener, upstream
from status_rows import StatusPageRows

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_TIMEOUT = 90


def chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-dev-shm-usage",
           "--no-first-run", "--no-default-browser-check", "--disable-extensions",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", *args]
    # Its own process group, so that a hung browser is stopped with all its
    # helper processes.
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=BROWSER_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
        raise AssertionError(f"{' '.join(cmd)}: still running after {BROWSER_TIMEOUT}s") from None
    res = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    assert res.returncode == 0, f"{' '.join(cmd)}: exit {res.returncode}\n{res.stderr.decode()[-2000:]}"
    return res


def dump_dom(url: str, profile: Path) -> str:
    return chromium(["--dump-dom", url], profile).stdout.decode()


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decodes an 8-bit RGB or RGBA PNG: (width, height, rows of raw pixels)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    height = depth = ctype = 0
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        chunk = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", chunk[:10])
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + n
    assert depth == 8 and ctype in (2, 6), f"PNG depth {depth} colour type {ctype}"
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up = prev[i]
            ul = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + left) & 0xFF
            elif f == 2:
                line[i] = (line[i] + up) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif f == 4:
                p = left + up - ul
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - ul)
                pred = left if pa <= pb and pa <= pc else (up if pb <= pc else ul)
                line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, rows


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian package chromium)")
def test_status_page_in_headless_chromium(tmp_path, backends):
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    workdir = tmp_path / "sluice"
    workdir.mkdir()
    access_log = workdir / "access.log"
    text = harness.render_config(default_global(access_log), [listener()], {"up": upstream(a, b)})
    text += '\n[admin]\nlisten = "127.0.0.1:0"\n'
    s = harness.Sluice(workdir, text, ["main"], name="sluice", access_log=access_log)
    try:
        s.start()
        m = s.log.wait_for(r"admin API listening on (\S+)", timeout=harness.START_TIMEOUT)
        host, port = harness.split_addr(m.group(1))
        url = f"http://{host}:{port}/"
        # Some traffic, so the page has numbers to show.
        for _ in range(4):
            c = s.connect(timeout=5)
            assert harness.recv_line(c) in (b"A", b"B")
            c.close()

        profile = tmp_path / "chromium-profile"
        dom = dump_dom(url, profile)
        p = StatusPageRows()
        p.feed(dom)
        assert set(p.rows) == {a.address, b.address}, f"server rows {p.rows}; DOM:\n{dom[:2000]}"
        for addr, row in p.rows.items():
            assert "state-up" in row["class"].split(), (addr, row)
        assert not any(t == "script" and "src" in a_ for t, a_ in p.tags), "the page loads a script"
        assert any(t == "meta" and a_.get("name") == "viewport" for t, a_ in p.tags), \
            "no <meta name=viewport>: a phone would render the page at desktop width"
        for t, attrs in p.tags:
            for key in ("src", "href"):
                v = attrs.get(key) or ""
                assert not re.match(r"(https?:)?//", v), f"external asset <{t} {key}={v}>"

        # Drain B through the API: its row says so at the next load.
        req = urllib.request.Request(f"{url}upstreams/up/servers/{b.address}/drain", method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
        dom = dump_dom(url, profile)
        p = StatusPageRows()
        p.feed(dom)
        assert "state-drained" in p.rows[b.address]["class"].split(), p.rows
        assert "drained" in p.rows[b.address]["text"], p.rows
        assert "state-up" in p.rows[a.address]["class"].split(), p.rows

        # A phone-sized screenshot, kept in the test's output folder.
        out = tmp_path / "status_page_phone.png"
        chromium([f"--screenshot={out}", "--window-size=412,915", "--hide-scrollbars", url], profile)
        assert out.exists(), f"no screenshot at {out}"
        data = out.read_bytes()
        assert len(data) > 5000, f"screenshot is only {len(data)} bytes"
        width, height, rows = png_pixels(data)
        assert (width, height) == (412, 915), (width, height)
        # Not blank: many distinct rows, and something drawn in the top half.
        assert len(set(rows)) > 30, f"only {len(set(rows))} distinct pixel rows"
        assert len(set(rows[: height // 2])) > 20

        # One column on a phone: the page itself never scrolls sideways (wide
        # tables scroll inside their own box). Measured on a copy of the page,
        # with a probe script added, in a 412 px wide
        # frame (a headless window is at least 500 px wide).
        with urllib.request.urlopen(url, timeout=10) as r:
            page = r.read().decode()
        probe = """<script>
var d = document.documentElement, top_ = parent.document.documentElement, wide = "";
document.querySelectorAll("body *").forEach(function (e) {
  if (e.getBoundingClientRect().right <= d.clientWidth) return;
  for (var p = e.parentElement; p && p !== d; p = p.parentElement)
    if (getComputedStyle(p).overflowX !== "visible") return;
  wide = "<" + e.tagName.toLowerCase() + "> " + e.textContent.trim().slice(0, 100);
});
top_.setAttribute("data-probe", d.scrollWidth + " " + d.clientWidth);
top_.setAttribute("data-wide", wide);
</script>"""
        (tmp_path / "page.html").write_text(page.replace("</body>", probe + "</body>")
                                            if "</body>" in page else page + probe)
        (tmp_path / "phone.html").write_text(
            '<html><body style="margin:0"><iframe src="page.html" '
            'style="width:412px;height:915px;border:0"></iframe></body></html>')
        dom = chromium(["--allow-file-access-from-files", "--dump-dom", (tmp_path / "phone.html").as_uri()],
                       profile).stdout.decode()
        m = re.search(r'data-probe="(\d+) (\d+)"', dom)
        assert m, f"the probe did not run: {dom[:300]}"
        scroll, client = int(m.group(1)), int(m.group(2))
        assert 300 < client <= 412, (scroll, client)
        wide = re.search(r'data-wide="([^"]*)"', dom)
        assert scroll <= client, (f"in a 412 px wide window the page is {scroll} px wide: it scrolls "
                                  f"sideways; too wide: {html.unescape(wide.group(1)) if wide else '?'}")
    finally:
        rc = s.stop()
    assert rc == 0, "\n".join(s.log.lines[-40:])


# --------------------------------------------------------------------------
# The page's own actions, under authentication, driven through DevTools
# --------------------------------------------------------------------------

TOKEN = "page-t0ken"


def api(base: str, path: str, method: str = "GET", body: bytes | None = None) -> dict:
    req = urllib.request.Request(base + path, method=method, data=body,
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def wait_for(what: str, probe, timeout: float = 30.0):
    """Polls probe() until it returns something true; probes that fail (a page
    being reloaded under them) count as not yet."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = probe()
            if last:
                return last
        except (AssertionError, OSError) as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s; last: {last!r}")
        time.sleep(0.2)


PAGE_STATE = """(() => {
  const cells = tr => Array.from(tr.cells).map(c => c.textContent.trim());
  const tables = Array.from(document.querySelectorAll("table.upstream"));
  const rows = {};
  tables.forEach(t => t.querySelectorAll("tr[data-server]").forEach(tr => {
    rows[t.getAttribute("data-upstream") + " " + tr.getAttribute("data-server")] =
      {cls: tr.className, cells: cells(tr),
       actions: Array.from(tr.querySelectorAll("button")).map(b => b.dataset.action)};
  }));
  return {
    heads: Array.from(tables[0].querySelectorAll("th")).map(th => th.textContent.trim()),
    geometry: tables.map(t => Array.from(t.querySelectorAll("th")).map(th => {
      const r = th.getBoundingClientRect(); return Math.round(r.left) + "+" + Math.round(r.width); })),
    rows: rows,
    listeners: Array.from(document.querySelectorAll("#listeners tr[data-listener]")).map(tr =>
      ({name: tr.dataset.listener, route: tr.dataset.route, cls: tr.className, cells: cells(tr)})),
    uptime: document.getElementById("uptime").textContent,
    msg: document.getElementById("msg").textContent,
  };
})()"""


def click(browser, upstream_name: str, server: str, action: str, accept: bool, prompt: str | None = None) -> dict:
    """Clicks a server's action button and answers its dialog; returns the dialog.
    The click runs from a timer so that this call returns before the dialog
    blocks the page; a page reloading under it is a retry (AssertionError)."""
    expr = (f'(() => {{ const b = document.querySelector(\'table[data-upstream="{upstream_name}"] '
            f'tr[data-server="{server}"] button[data-action="{action}"]\'); '
            f'if (!b) return false; setTimeout(() => b.click(), 0); return true; }})()')
    browser.drop_events("Page.javascriptDialogOpening")
    assert browser.evaluate(expr), f"no {action} button for {server} in {upstream_name}"
    dialog = browser.event("Page.javascriptDialogOpening", timeout=20)
    params = {"accept": accept}
    if prompt is not None:
        params["promptText"] = prompt
    browser.call("Page.handleJavaScriptDialog", **params)
    return dialog


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian package chromium)")
def test_status_page_actions_under_auth(tmp_path, backends):
    from cdp import Browser

    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    workdir = tmp_path / "sluice"
    workdir.mkdir()
    access_log = workdir / "access.log"
    token_file = workdir / "admin.token"
    token_file.write_text(TOKEN + "\n")
    upstreams = {
        "up": upstream(a, b, health={"type": "tcp", "interval": "300ms", "timeout": "3s"}),
        "other": {"servers": [{"address": a.address, "max_conns": 5}, {"address": b.address, "backup": True}]},
    }
    listeners = [listener(),
                 listener(name="tls", upstream=None, preread="tls", default_upstream="up",
                          routes=[{"sni": "db.example.com", "upstream": "up"}])]
    text = harness.render_config(default_global(access_log), listeners, upstreams)
    text += f'\n[admin]\nlisten = "127.0.0.1:0"\ntoken_file = "{token_file}"\n'
    s = harness.Sluice(workdir, text, ["main", "tls"], name="sluice", access_log=access_log)
    browser = None
    try:
        s.start()
        m = s.log.wait_for(r"admin API listening on (\S+)", timeout=harness.START_TIMEOUT)
        host, port = harness.split_addr(m.group(1))
        base = f"http://{host}:{port}"
        # Four sessions on the plain listener, one not-TLS on the preread one
        # (its default route).
        for _ in range(4):
            c = s.connect("main", timeout=5)
            assert harness.recv_line(c) in (b"A", b"B")
            c.close()
        c = s.connect("tls", timeout=5)
        c.sendall(b"plain\n")
        assert harness.recv_line(c) in (b"A", b"B")
        c.close()

        # The page needs a check behind each server and a rate to show.
        wait_for("a check on every server", lambda: all(
            sv["last_check"] and sv["last_check"]["result"] == "pass" for sv in api(base, "/upstreams/up")["servers"]))
        wait_for("a conn/s measured", lambda: all(
            l["conn_per_s"] is not None for l in api(base, "/status")["listeners"]))
        wait_for("sessions closed", lambda: api(base, "/status")["connections"] == 0)

        browser = Browser(tmp_path / "chromium-profile")
        browser.call("Page.enable")
        browser.call("Network.enable")
        # What a script would send; the page's own requests carry it too.
        browser.call("Network.setExtraHTTPHeaders", headers={"Authorization": f"Bearer {TOKEN}"})
        browser.navigate(base + "/")
        state = wait_for("the page", lambda: browser.evaluate(PAGE_STATE))
        browser.screenshot(tmp_path / "status_page.png")
        assert (tmp_path / "status_page.png").stat().st_size > 5000

        heads = state["heads"]
        col = {h: i for i, h in enumerate(heads)}
        for h in ("server", "state", "for", "last check", "bck", "wt", "eff", "cur", "peak", "max", "sess/s",
                  "total", "fail", "downtime", "actions"):
            assert h in col, f"no column {h!r} in {heads}"
        # Columns line up across the upstream tables.
        assert len(state["geometry"]) == 2 and state["geometry"][0] == state["geometry"][1], state["geometry"]

        rows = state["rows"]
        assert set(rows) == {f"up {a.address}", f"up {b.address}", f"other {a.address}", f"other {b.address}"}, rows
        for key, row in rows.items():
            assert "state-up" in row["cls"].split(), (key, row)
            assert re.fullmatch(r"\d+s|\d+m \d+s", row["cells"][col["for"]]), (key, row)
            assert row["cells"][col["cur"]] == "0", (key, row)
            assert sorted(row["actions"]) == ["disable", "drain", "weight"], (key, row)
        for srv in (a, b):
            check = rows[f"up {srv.address}"]["cells"][col["last check"]]
            assert re.fullmatch(r"pass tcp \d+(\.\d)? ms, \d+s ago", check), check
            assert rows[f"other {srv.address}"]["cells"][col["last check"]] == "\u2013"
        sessions = sum(int(rows[f"up {x.address}"]["cells"][col["total"]]) for x in (a, b))
        assert sessions == 5, rows
        peak = sum(int(rows[f"up {x.address}"]["cells"][col["peak"]]) for x in (a, b))
        assert peak >= 1, rows
        assert rows[f"other {b.address}"]["cells"][col["bck"]] == "Y"
        assert "backup" in rows[f"other {b.address}"]["cells"][col["server"]]
        assert rows[f"other {a.address}"]["cells"][col["bck"]] == "\u2013"
        assert rows[f"other {a.address}"]["cells"][col["max"]] == "5"
        assert re.fullmatch(r"\d+s|\d+m \d+s", state["uptime"]), state["uptime"]
        # The preread listener shows its configured routes and the default.
        routes = {l["route"]: l["cells"] for l in state["listeners"] if l["cls"] == "route"}
        assert set(routes) == {"db.example.com", ""}, state["listeners"]
        main = next(l["cells"] for l in state["listeners"] if l["name"] == "main" and l["cls"] != "route")
        assert re.fullmatch(r"\d+\.\d", main[7]), main  # conn/s measured by the server, not "-"

        # The page reloads itself.
        browser.drop_events("Page.loadEventFired")
        browser.event("Page.loadEventFired", timeout=30)

        # Drain B from the page: a confirmation, then the server's state.
        dialog = wait_for("drain clicked", lambda: click(browser, "up", b.address, "drain", accept=True),
                          timeout=90)
        assert dialog["type"] == "confirm" and b.address in dialog["message"] and "Drain" in dialog["message"], dialog
        wait_for("B drained", lambda: api(base, f"/upstreams/up/servers/{b.address}")["state"] == "drained")
        assert api(base, f"/upstreams/other/servers/{b.address}")["state"] == "up"
        wait_for("the page shows B drained", lambda: "state-drained" in
                 browser.evaluate(PAGE_STATE)["rows"][f"up {b.address}"]["cls"].split())
        browser.screenshot(tmp_path / "status_page_drained.png")
        # New sessions go to A only.
        for _ in range(3):
            c = s.connect("main", timeout=5)
            assert harness.recv_line(c) == b"A"
            c.close()

        # A cancelled confirmation changes nothing.
        dialog = wait_for("disable clicked", lambda: click(browser, "up", a.address, "disable", accept=False),
                          timeout=90)
        assert dialog["type"] == "confirm", dialog
        assert api(base, f"/upstreams/up/servers/{a.address}")["admin"] == "enabled"

        # A weight, through a prompt.
        dialog = wait_for("weight clicked", lambda: click(browser, "up", a.address, "weight", accept=True, prompt="7"),
                          timeout=90)
        assert dialog["type"] == "prompt" and dialog.get("defaultPrompt") == "1", dialog
        wait_for("weight 7", lambda: api(base, f"/upstreams/up/servers/{a.address}")["weight"] == 7)
        wait_for("the page shows weight 7", lambda: browser.evaluate(PAGE_STATE)["rows"][f"up {a.address}"]
                 ["cells"][col["wt"]] == "7")

        # And back: enable B from the page.
        state = wait_for("enable offered", lambda: (lambda st: "enable" in st["rows"][f"up {b.address}"]["actions"]
                                                     and st)(browser.evaluate(PAGE_STATE)))
        wait_for("enable clicked", lambda: click(browser, "up", b.address, "enable", accept=True), timeout=90)
        wait_for("B up", lambda: api(base, f"/upstreams/up/servers/{b.address}")["state"] == "up")
        wait_for("the page shows B up", lambda: "state-up" in
                 browser.evaluate(PAGE_STATE)["rows"][f"up {b.address}"]["cls"].split())
        browser.screenshot(tmp_path / "status_page_after.png")
    finally:
        if browser is not None:
            browser.close()
        rc = s.stop()
    assert rc == 0, "\n".join(s.log.lines[-40:])
