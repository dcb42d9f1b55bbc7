"""The status page in a real browser: headless Chromium loads GET /, every
configured server has its row, coloured by state, a drain shows at once, and
the page renders on a phone-sized window. Driven through DevTools, the
page's own buttons drain, reweigh and enable servers under authentication,
after a confirmation. Screenshots are kept in each test's output folder."""

from __future__ import annotations

import base64
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


def start_with_admin(s: harness.Sluice) -> str:
    """Starts `s` (its file has an [admin] table); returns the API's base URL."""
    s.start()
    m = s.log.wait_for(r"admin API listening on (\S+)", timeout=harness.START_TIMEOUT)
    host, port = harness.split_addr(m.group(1))
    return f"http://{host}:{port}"


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
        url = start_with_admin(s) + "/"
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
    being reloaded under them, whose table has no rows yet) count as not yet."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = probe()
            if last:
                return last
        except (AssertionError, OSError, LookupError) as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s; last: {last!r}")
        time.sleep(0.2)


PAGE_STATE = """(() => {
  const cells = tr => Array.from(tr.cells).map(c => c.textContent.trim());
  const tables = Array.from(document.querySelectorAll("table.upstream"));
  const rows = {};
  tables.forEach(t => t.querySelectorAll("tr[data-server]").forEach(tr => {
    const chk = tr.querySelector(".chk");
    rows[t.getAttribute("data-upstream") + " " + tr.getAttribute("data-server")] =
      {cls: tr.className, cells: cells(tr), for: tr.querySelector(".for").textContent.trim(),
       chk: chk ? chk.textContent.trim() : "\u2013",
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


def click(browser, upstream_name: str, server: str, action: str, accept: bool, prompt: str | None = None,
          row: str = "data-server") -> dict:
    """Clicks a server's action button and answers its dialog; returns the dialog.
    The click runs from a timer so that this call returns before the dialog
    blocks the page; a page reloading under it is a retry (AssertionError).
    `row`: the attribute that names the row's server (data-retired: a retired one)."""
    expr = (f'(() => {{ const b = document.querySelector(\'table[data-upstream="{upstream_name}"] '
            f'tr[{row}="{server}"] button[data-action="{action}"]\'); '
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
        base = start_with_admin(s)
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
        for h in ("server", "state", "reason", "wt", "cur", "peak", "max", "sess/s", "total", "fail", "chk fail",
                  "dn", "downtime", "in", "out", "actions"):
            assert h in col, f"no column {h!r} in {heads}"
        # Columns line up across the upstream tables.
        assert len(state["geometry"]) == 2 and state["geometry"][0] == state["geometry"][1], state["geometry"]

        rows = state["rows"]
        assert set(rows) == {f"up {a.address}", f"up {b.address}", f"other {a.address}", f"other {b.address}"}, rows
        for key, row in rows.items():
            assert "state-up" in row["cls"].split(), (key, row)
            assert re.fullmatch(r"\d+s|\d+m \d+s", row["for"]), (key, row)
            assert row["cells"][col["cur"]] == "0", (key, row)
            assert sorted(row["actions"]) == ["disable", "drain", "weight"], (key, row)
        for srv in (a, b):
            check = rows[f"up {srv.address}"]["chk"]
            assert re.fullmatch(r"pass tcp \d+(\.\d)? ms, \d+s ago", check), check
            assert rows[f"other {srv.address}"]["chk"] == "\u2013"
        sessions = sum(int(rows[f"up {x.address}"]["cells"][col["total"]]) for x in (a, b))
        assert sessions == 5, rows
        peak = sum(int(rows[f"up {x.address}"]["cells"][col["peak"]]) for x in (a, b))
        assert peak >= 1, rows
        assert "backup" in rows[f"other {b.address}"]["cells"][col["server"]]
        assert "backup" not in rows[f"other {a.address}"]["cells"][col["server"]]
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


# --------------------------------------------------------------------------
# A laptop's window: every column visible, nothing cut, nothing scrolls
# --------------------------------------------------------------------------

# Measured in the page: every table and every cell, against the window.
LAYOUT = """(() => {
  const vw = document.documentElement.clientWidth, out = {vw: vw, wide: [], cut: [], scrolls: [],
    page: document.documentElement.scrollWidth, heads: 0};
  const name = e => (e.closest("table").id || e.closest("table").dataset.upstream) + ": " +
    e.textContent.trim().slice(0, 60);
  document.querySelectorAll(".wrap").forEach(w => {
    if (w.scrollWidth > w.clientWidth) out.scrolls.push(w.firstElementChild.id ||
      w.firstElementChild.dataset.upstream);
  });
  document.querySelectorAll("table").forEach(t => {
    if (t.getBoundingClientRect().right > vw + 0.5) out.wide.push("table " + (t.id || t.dataset.upstream));
  });
  document.querySelectorAll("th, td").forEach(c => {
    if (c.offsetParent === null) return;  /* hidden by "hide down" */
    if (c.tagName === "TH") out.heads++;
    if (c.getBoundingClientRect().right > vw + 0.5) out.wide.push(name(c));
    if (c.scrollWidth > c.clientWidth + 1) out.cut.push(name(c));
    const cr = c.getBoundingClientRect();
    c.querySelectorAll("*").forEach(e => {
      const r = e.getBoundingClientRect();
      if (r.width > 0 && (r.right > cr.right + 1 || r.left < cr.left - 1)) out.cut.push(name(c) + " <" + e.tagName + ">");
    });
  });
  return out;
})()"""

TEXTS = """(() => {
  const rows = {};
  document.querySelectorAll("table.upstream").forEach(t => t.querySelectorAll("tr[data-server], tr[data-retired]")
    .forEach(tr => {
      const c = Array.from(tr.cells).map(x => x.innerText.trim());
      rows[t.dataset.upstream + " " + (tr.dataset.server || tr.dataset.retired)] = {
        cls: tr.className, cells: c, shown: tr.offsetParent !== null,
        reason: (tr.querySelector(".reason") || tr.cells[2]).innerText.trim(),
        from: (tr.querySelector(".from") || {}).innerText || ""};
    }));
  const sums = {};
  document.querySelectorAll("tr.summary").forEach(tr => { sums[tr.dataset.summary] = tr.innerText; });
  const lst = {};
  document.querySelectorAll("#listeners tr[data-listener]:not(.route)").forEach(tr => {
    lst[tr.dataset.listener] = {cls: tr.className, text: tr.innerText,
      bg: getComputedStyle(tr.cells[0]).backgroundColor};
  });
  return {rows: rows, sums: sums, listeners: lst, header: document.getElementById("header").innerText,
          title: document.querySelector("h1").innerText, hide: document.getElementById("hide-down").checked};
})()"""


def shoot(browser, path: Path, width: int | None = None) -> Path:
    """A screenshot of the window, or with `width` of the whole page laid out
    that wide (the window's width: the page as one scrolls through it)."""
    params = {"format": "png"}
    if width is not None:
        m = browser.call("Page.getLayoutMetrics")
        height = (m.get("cssContentSize") or m["contentSize"])["height"]
        params.update(captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1})
    path.write_bytes(base64.b64decode(browser.call("Page.captureScreenshot", **params)["data"]))
    print(f"screenshot: {path}")
    return path


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian package chromium)")
def test_status_page_fits_a_laptop(tmp_path, backends):
    from cdp import Browser

    from test_probes import http_handler, line_handler

    web_ok = backends(http_handler(body=b"role=primary state=ready"), name="web-ok")
    web_bad = backends(http_handler(body=b"role=replica state=catching-up"), name="web-bad")
    pong = backends(line_handler(b"+PONG\r\n"), name="pong")
    err = backends(line_handler(b"-ERR role is replica, replication is not running (Seconds_Behind_Master "
                                 b"is NULL)\r\n"), name="err")
    a = backends(harness.banner_handler, name="A")
    b = backends(harness.banner_handler, name="B")
    dead = harness.dead_port()
    http_check = {"type": "http", "path": "/health", "expect_body": "role=primary state=ready",
                  "interval": "300ms", "timeout": "2s", "rise": 1, "fall": 1}
    ping_check = {"type": "send_expect", "send": "PING\r\n", "expect": "+PONG", "interval": "300ms",
                  "timeout": "2s", "rise": 1, "fall": 1}

    def upstreams(with_a: bool) -> dict:
        return {
            "pg": {"servers": [{"address": web_ok.address, "weight": 1000},
                               {"address": web_bad.address, "weight": 10},
                               {"address": f"127.0.0.1:{dead}", "backup": True}], "health": http_check},
            "cache": {"queue": 10, "servers": [{"address": pong.address},
                                               {"address": err.address, "max_conns": 100}],
                      "health": ping_check},
            "app": {"balance": "round_robin",
                    "servers": ([{"address": a.address}] if with_a else []) + [{"address": b.address}]},
            "orders": {"fallback": "pg", "servers": [{"address": a.address}, {"address": b.address}]},
        }

    listeners = [listener(), listener(name="pg", upstream="pg"), listener(name="cache", upstream="cache"),
                 listener(name="orders", upstream="orders")]
    workdir = tmp_path / "sluice"
    workdir.mkdir()
    access_log = workdir / "access.log"

    def text(with_a: bool) -> str:
        t = harness.render_config(default_global(access_log), [dict(l, **({"upstream": "app"} if l["name"] == "main"
                                                                        else {})) for l in listeners],
                                  upstreams(with_a))
        return t + '\n[admin]\nlisten = "127.0.0.1:0"\n'

    s = harness.Sluice(workdir, text(True), [l["name"] for l in listeners], name="sluice", access_log=access_log)
    browser = None
    try:
        base = start_with_admin(s)

        def get(path):
            with urllib.request.urlopen(base + path, timeout=10) as r:
                return json.load(r)

        def post(path):
            req = urllib.request.Request(base + path, method="POST", data=b"")
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.load(r)

        want = {f"pg {web_ok.address}": "up", f"pg {web_bad.address}": "down", f"pg 127.0.0.1:{dead}": "down",
                f"cache {pong.address}": "up", f"cache {err.address}": "down"}
        wait_for("checks decided", lambda: {f"{u['name']} {sv['address']}": sv["state"]
                                            for u in get("/status")["upstreams"] for sv in u["servers"]
                                            if u["name"] in ("pg", "cache")} == want)
        # orders: nothing eligible (one drained, one disabled): its clients go to pg.
        post(f"/upstreams/orders/servers/{a.address}/drain")
        post(f"/upstreams/orders/servers/{b.address}/disable")
        c = s.connect("orders", timeout=5)
        c.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert b"200 OK" in harness.recv_all(c)
        c.close()
        # Two live sessions on app: one on each server, bytes moving on both.
        held = {}
        for _ in range(2):
            c = s.connect("main", timeout=5)
            held[harness.recv_line(c).decode()] = c
        assert set(held) == {"A", "B"}, held
        for c in held.values():
            c.sendall(b"z" * 50000)
            assert harness.recv_exact(c, 50000) == b"z" * 50000
        # A reload takes A out of app while its session goes on: a retired row.
        s.reload(text(False))
        wait_for("live bytes", lambda: all(sv["bytes_in"] >= 50000 for u in get("/status")["upstreams"]
                                           if u["name"] == "app" for sv in u["servers"] + u["retired"]))
        doc = get("/status")
        (app,) = [u for u in doc["upstreams"] if u["name"] == "app"]
        assert [r["address"] for r in app["retired"]] == [a.address], app
        reasons = {f"{u['name']} {sv['address']}": sv["reason"] for u in doc["upstreams"] for sv in u["servers"]}
        assert "lacks" in reasons[f"pg {web_bad.address}"], reasons
        assert "unexpected reply" in reasons[f"cache {err.address}"], reasons

        browser = Browser(tmp_path / "chromium-profile", window="1366,768")
        browser.call("Page.enable")
        for width, height in ((1366, 768), (1920, 1080)):
            browser.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                         mobile=False)
            browser.navigate(base + "/")
            layout = wait_for("the page", lambda: browser.evaluate(LAYOUT))
            assert layout["vw"] <= width and layout["heads"] >= 16 * 4 + 11, layout
            assert layout["page"] <= layout["vw"], f"the page scrolls sideways at {width}: {layout}"
            assert layout["scrolls"] == [], f"tables that scroll sideways at {width}: {layout['scrolls']}"
            assert layout["wide"] == [], f"wider than the {width} px window: {layout['wide']}"
            assert layout["cut"] == [], f"cut at {width}: {layout['cut']}"
            page = browser.evaluate(TEXTS)
            rows = page["rows"]
            # Reasons whole, the role's words too: what /status says, no ellipsis.
            for key, reason in reasons.items():
                assert rows[key]["reason"] == reason, (key, rows[key])
            assert "\u2026" not in json.dumps(rows)
            assert rows[f"pg {web_ok.address}"]["cells"][3].startswith("1000"), rows[f"pg {web_ok.address}"]
            assert rows[f"app {b.address}"]["from"] == "file"
            assert "state-retired" in rows[f"app {a.address}"]["cls"].split()
            assert rows[f"app {a.address}"]["cells"][4] == "1"
            # Live bytes: the held sessions' 50 000 bytes, before they end.
            assert rows[f"app {b.address}"]["cells"][13] == "48.8 KiB", rows[f"app {b.address}"]
            assert rows[f"app {a.address}"]["cells"][13] != "0 B", rows[f"app {a.address}"]
            # A summary per upstream: states, sessions, queue, fallback, balance.
            assert set(page["sums"]) == {"pg", "cache", "app", "orders"}, page["sums"]
            assert "1 up, 2 down of 3" in page["sums"]["pg"], page["sums"]["pg"]
            assert "1 disabled, 1 drained of 2" in page["sums"]["orders"], page["sums"]["orders"]
            assert "fallback \u2192 pg: 1 taken" in page["sums"]["orders"], page["sums"]["orders"]
            assert "queue 0 of 10" in page["sums"]["cache"] and "round_robin" in page["sums"]["app"]
            assert "1 retired" in page["sums"]["app"]
            # The header: host, pid, version, max_connections, uptime.
            assert doc["hostname"] in page["title"] and doc["version"] in page["title"], page["title"]
            assert f"pid {doc['pid']}" in page["header"] and "max_connections 100000" in page["header"], page
            assert re.search(r"up \d+s", page["header"]), page["header"]
            # The listener whose upstream has no server is red; the others are not.
            assert "no-server" in page["listeners"]["orders"]["cls"].split(), page["listeners"]
            assert page["listeners"]["orders"]["bg"] != page["listeners"]["pg"]["bg"], page["listeners"]
            assert "no server available" in page["listeners"]["orders"]["text"]
            assert "no-server" not in page["listeners"]["pg"]["cls"].split()
            shoot(browser, tmp_path / f"status_page_{width}x{height}.png")
            shoot(browser, tmp_path / f"status_page_{width}_full.png", width=width)

        # "hide down": down rows go, and stay gone across the page's own reloads.
        assert rows[f"pg {web_bad.address}"]["shown"]
        browser.evaluate('document.getElementById("hide-down").click()')
        page = browser.evaluate(TEXTS)
        assert not page["rows"][f"pg {web_bad.address}"]["shown"] and page["rows"][f"pg {web_ok.address}"]["shown"]
        browser.drop_events("Page.loadEventFired")
        browser.event("Page.loadEventFired", timeout=30)
        page = wait_for("the reloaded page", lambda: browser.evaluate(TEXTS))
        assert page["hide"] and not page["rows"][f"pg {web_bad.address}"]["shown"], page["rows"]
        layout = browser.evaluate(LAYOUT)
        assert layout["wide"] == [] and layout["cut"] == [], layout

        # The retired row's button closes its session (cause admin).
        browser.call("Page.navigate", url=base + "/")
        dialog = wait_for("retired close clicked", lambda: click(browser, "app", a.address, "close", accept=True,
                                                                 row="data-retired"), timeout=60)
        assert dialog["type"] == "confirm" and a.address in dialog["message"], dialog
        assert harness.wait_closed(held["A"]) in ("eof", "reset")
        wait_for("the retired row gone", lambda: all(u["retired"] == [] for u in get("/status")["upstreams"]))
        held["B"].close()
    finally:
        if browser is not None:
            browser.close()
        rc = s.stop()
    assert rc == 0, "\n".join(s.log.lines[-40:])
    records = [r for r in s.access_records() if r.get("server") == a.address and r["cause"] != "interim"]
    assert any(r["cause"] == "admin" for r in records), records

