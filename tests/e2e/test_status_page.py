"""The status page in a real browser: headless Chromium loads GET /, every
configured server has its row, coloured by state, a drain shows at once, and
the page renders on a phone-sized window (the screenshot is kept with the
build for people to look at)."""

from __future__ import annotations

import html
import os
import re
import shutil
import signal
import struct
import subprocess
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
    cmd = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
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
        assert not any(t == "script" for t, _ in p.tags), "the page must not carry a script"
        assert any(t == "meta" and (a_.get("http-equiv") or "").lower() == "refresh"
                   and (a_.get("content") or "").strip().startswith("5") for t, a_ in p.tags), \
            "no <meta http-equiv=refresh content=5>"
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

        # A phone-sized screenshot, kept beside the binary.
        out = Path(os.environ.get("SLUICE_BIN") or harness.sluice_bin()).resolve().parent / "artifacts" / \
            "status_page.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            out.unlink()
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
        # with a probe script added (the page has none), in a 412 px wide
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
