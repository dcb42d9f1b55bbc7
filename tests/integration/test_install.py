"""`meson install` puts the same set as the Debian package in place (binary,
unit, sysusers and tmpfiles files, logrotate file, configuration, man pages,
docs), at the installation's own paths; the unit passes `systemd-analyze
verify`, and under the permissions it gets PUT /config can rewrite the
configuration."""

from __future__ import annotations

import http.client
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

import harness
import shipped_docs
from harness import listener, upstream

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    tomllib = None


def build_dir() -> Path:
    """The meson build directory of the binary under test."""
    d = harness.sluice_bin().parent
    if not (d / "meson-info").is_dir():
        pytest.skip(f"{harness.sluice_bin()} is not in a meson build directory: nothing to install")
    return d


def build_options(build: Path) -> dict[str, object]:
    out = subprocess.run(["meson", "introspect", "--buildoptions", str(build)], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    return {o["name"]: o["value"] for o in json.loads(out)}


class Layout:
    """Where this build's files go, absolute (as on the target system)."""

    def __init__(self, opts: dict[str, object]):
        prefix = Path(str(opts["prefix"]))
        self.prefix = prefix
        self.sbin = prefix / str(opts["sbindir"])
        self.etc = prefix / str(opts["sysconfdir"])
        self.man = prefix / str(opts["mandir"])
        self.doc = prefix / str(opts["datadir"]) / "doc" / "sluice"
        self.unitdir = Path(str(opts.get("systemdunitdir") or prefix / "lib" / "systemd" / "system"))


def install(build: Path, destdir: Path) -> subprocess.CompletedProcess:
    # --no-rebuild: the build under test is installed as it is, never rebuilt
    # (and never compiled) by a test.
    res = subprocess.run(["meson", "install", "-C", str(build), "--no-rebuild", "--destdir", str(destdir)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def inside(destdir: Path, path: Path) -> Path:
    return destdir / path.relative_to("/")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    build = build_dir()
    layout = Layout(build_options(build))
    destdir = tmp_path_factory.mktemp("destdir")
    install(build, destdir)
    return build, layout, destdir


def unit_settings(text: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"([A-Za-z]+)=(.*)", line)
        if m:
            settings.setdefault(m.group(1), []).append(m.group(2))
    return settings


def test_install_puts_every_file_in_place(installed):
    _, lay, dest = installed
    expected = [
        lay.sbin / "sluice",
        lay.unitdir / "sluice.service",
        lay.prefix / "lib" / "sysusers.d" / "sluice.conf",
        lay.prefix / "lib" / "tmpfiles.d" / "sluice.conf",
        lay.etc / "logrotate.d" / "sluice",
        lay.etc / "sluice" / "sluice.toml",
        lay.man / "man8" / "sluice.8",
        lay.man / "man5" / "sluice.toml.5",
        lay.doc / "README.md",
        lay.doc / "configuration.md",
        lay.doc / "operations.md",
        lay.doc / "health.md",
        lay.doc / "discovery.md",
        lay.doc / "scale-out.md",
        lay.doc / "recipes" / "patroni.md",
        lay.doc / "examples" / "sluice.toml",
        lay.doc / "examples" / "sni.toml",
        lay.doc / "examples" / "postgres.toml",
    ]
    missing = [str(p) for p in expected if not inside(dest, p).is_file()]
    assert not missing, f"not installed: {missing}"
    assert os.access(inside(dest, lay.sbin / "sluice"), os.X_OK)
    # The installed binary runs and accepts the installed configuration.
    binary = inside(dest, lay.sbin / "sluice")
    res = subprocess.run([str(binary), "-t", "-c", str(inside(dest, lay.etc / "sluice" / "sluice.toml"))],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr


def test_installed_configuration_starts_nothing_by_surprise(installed, tmp_path):
    """/etc/sluice/sluice.toml as installed: no listener, the admin API on
    loopback port 8489 (no common service's default), examples commented
    out; the demo only under the docs' examples/."""
    _, lay, dest = installed
    config = inside(dest, lay.etc / "sluice" / "sluice.toml")
    text = config.read_text()
    if tomllib is not None:
        parsed = tomllib.loads(text)
        assert "listener" not in parsed, parsed
        assert parsed["admin"]["listen"] == "127.0.0.1:8489", parsed
    assert not re.search(r"^\s*\[\[listener\]\]", text, re.M)
    assert re.search(r"^# \[\[listener\]\]", text, re.M), "no commented example listener"
    assert "9090" not in re.sub(r"^#.*$", "", text, flags=re.M)
    # Paths in its comments are this installation's.
    assert str(lay.doc) in text and str(lay.etc / "sluice" / "sluice.toml") in text
    demo = inside(dest, lay.doc / "examples" / "sluice.toml").read_text()
    assert demo == (harness.REPO / "conf" / "sluice.toml").read_text()
    binary = inside(dest, lay.sbin / "sluice")
    # Run as installed (but on a free port): one info line, no listener.
    running = tmp_path / "installed.toml"
    running.write_text(text.replace('listen = "127.0.0.1:8489"', 'listen = "127.0.0.1:0"'))
    proc = subprocess.Popen([str(binary), "-c", str(running)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd=tmp_path)
    log = harness.LineLog(proc.stdout)
    try:
        log.wait_for(r"admin API listening on", timeout=harness.START_TIMEOUT)
        log.wait_for(r"\[info\] no listener configured: ", timeout=harness.START_TIMEOUT)
        log.wait_for(r"started: \d+ worker\(s\), 0 listener\(s\)", timeout=harness.START_TIMEOUT)
        assert not log.matches(harness.LISTENING_RX)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def test_every_link_of_the_installed_docs_leads_to_an_installed_file(installed):
    _, lay, dest = installed
    docdir = inside(dest, lay.doc)
    assert shipped_docs.broken_links(docdir) == []
    # Nothing of the man pages' sources among the pages.
    assert not (docdir / "man").exists()


def test_man_pages_name_installed_paths(installed):
    """The man pages name files where this installation put them, never the
    source tree's conf/ or docs/."""
    _, lay, dest = installed
    pages = {}
    for page in (lay.man / "man8" / "sluice.8", lay.man / "man5" / "sluice.toml.5"):
        res = subprocess.run(["man", "--warnings", "-l", str(inside(dest, page))], capture_output=True, text=True,
                             env={"MANWIDTH": "200", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, timeout=60)
        assert res.returncode == 0 and "warning" not in res.stderr, res.stderr
        pages[page.name] = res.stdout
    for name, text in pages.items():
        source = re.findall(r"(?<![\w/.-])(?:conf|docs|tools|src|tests)/[\w./-]*", text)
        assert not source, f"{name} names source-tree paths: {sorted(set(source))}"
    man8 = pages["sluice.8"]
    for path in (lay.etc / "sluice" / "sluice.toml", lay.unitdir / "sluice.service", lay.doc,
                 lay.etc / "logrotate.d" / "sluice"):
        assert str(path) in man8, f"sluice(8) does not name {path}"
    man5 = pages["sluice.toml.5"]
    assert str(lay.etc / "sluice" / "sluice.toml") in man5
    assert str(lay.doc / "examples" / "sluice.toml") in man5


def test_unit_paths_match_the_installation(installed):
    _, lay, dest = installed
    unit = unit_settings(inside(dest, lay.unitdir / "sluice.service").read_text())
    config = lay.etc / "sluice" / "sluice.toml"
    assert unit["ExecStart"] == [f"{lay.sbin / 'sluice'} -c {config}"], unit["ExecStart"]
    assert unit["ExecStartPre"] == [f"{lay.sbin / 'sluice'} -t -c {config}"], unit["ExecStartPre"]
    # The file PUT /config rewrites lives in the one place the unit lets the
    # service write, and the tmpfiles rule gives that directory to its group.
    assert unit["ReadWritePaths"] == [str(config.parent)]
    assert unit["User"] == ["sluice"] and unit["Group"] == ["sluice"]
    assert "DynamicUser" not in unit
    assert unit["ProtectSystem"] == ["strict"]
    tmpfiles = inside(dest, lay.prefix / "lib" / "tmpfiles.d" / "sluice.conf").read_text()
    assert re.search(rf"^d {re.escape(str(config.parent))} 2775 root sluice\b", tmpfiles, re.M), tmpfiles
    sysusers = inside(dest, lay.prefix / "lib" / "sysusers.d" / "sluice.conf").read_text()
    assert re.search(r"^u sluice\b", sysusers, re.M), sysusers
    # Documentation= names pages that are installed.
    docs = unit["Documentation"][0].split()
    assert "man:sluice(8)" in docs and "man:sluice.toml(5)" in docs
    files = [d[len("file:"):] for d in docs if d.startswith("file:")]
    assert files, docs
    for f in files:
        assert inside(dest, Path(f)).is_file(), f"Documentation= names {f}, which is not installed"
    # The logrotate rules rotate what the unit's LogsDirectory holds.
    assert unit["LogsDirectory"] == ["sluice"]
    assert "/var/log/sluice/*.log" in inside(dest, lay.etc / "logrotate.d" / "sluice").read_text()


def test_reinstall_keeps_the_operators_configuration(installed):
    build, lay, dest = installed
    config = inside(dest, lay.etc / "sluice" / "sluice.toml")
    mine = config.read_text().replace('log_level = "info"', 'log_level = "warn"')
    assert mine != config.read_text()
    config.write_text(mine)
    install(build, dest)
    assert config.read_text() == mine


def analyze_can_run() -> str | None:
    """Why systemd-analyze cannot verify units here, or None."""
    if shutil.which("systemd-analyze") is None:
        return "systemd-analyze is not installed (Debian package systemd)"
    res = subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        return f"systemd-analyze does not run here: {res.stderr.strip()}"
    return None


def verifiable_unit(lay: Layout, dest: Path, tmp_path: Path) -> Path:
    """The installed unit with its commands pointing into the destdir, where
    the binary is (verify checks that ExecStart= names an executable)."""
    text = inside(dest, lay.unitdir / "sluice.service").read_text()
    text = text.replace(f"{lay.sbin}/sluice ", f"{inside(dest, lay.sbin)}/sluice ")
    path = tmp_path / "sluice.service"
    path.write_text(text)
    return path


def analyze(args: list[str], lay: Layout, dest: Path) -> subprocess.CompletedProcess:
    # Documentation=man:... is checked by running man: let it find the
    # installed pages.
    env = {**os.environ, "MANPATH": str(inside(dest, lay.man))}
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=120, env=env)


def test_unit_passes_systemd_analyze_verify(installed, tmp_path):
    _, lay, dest = installed
    why = analyze_can_run()
    if why:
        pytest.skip(why)
    res = analyze(["verify", str(verifiable_unit(lay, dest, tmp_path))], lay, dest)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "sluice.service" not in out, out


def test_unit_keeps_its_hardening(installed, tmp_path):
    """systemd's own rating of the sandbox: a unit that loses a protection
    (a writable file system, capabilities, system calls) rates worse."""
    _, lay, dest = installed
    why = analyze_can_run()
    if why:
        pytest.skip(why)
    res = analyze(["security", "--offline=yes", "--no-pager", str(verifiable_unit(lay, dest, tmp_path))], lay, dest)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", res.stdout + res.stderr)
    assert m, res.stdout + res.stderr
    # systemd's scale runs from 0 (safe) to 10 (unsafe); the unit rates 1.5
    # with every protection it has today, and losing one rates worse.
    assert float(m.group(1)) <= 2.0, res.stdout


def run_as_service_user(uid: int, gid: int):
    """What the unit does before sluice runs: User=, Group=, UMask=0027."""
    def preexec():
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        os.umask(0o027)
    return preexec


@pytest.mark.parametrize("dir_mode, writable", [(0o2775, True), (0o755, False)], ids=["tmpfiles-rule", "root-only"])
def test_put_config_under_the_installed_permissions(installed, backends, dir_mode, writable):
    """The configuration directory as the tmpfiles rule leaves it (root,
    group sluice, 2775) and the file as the package installs it (root,
    0644): sluice, running as the service user, can replace the file with
    PUT /config. With the directory root's alone (the unit as it was), the
    write fails with "Permission denied"."""
    _, lay, dest = installed
    if os.geteuid() != 0:
        pytest.skip("needs root, to run sluice as another user")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody to stand in for the service user")
    # Somewhere the service user may reach (a test's own temporary
    # directory is root's alone).
    base = Path(tempfile.mkdtemp(prefix="sluice-perm-"))
    try:
        base.chmod(0o711)
        binary = base / "sluice-bin"
        shutil.copy2(inside(dest, lay.sbin / "sluice"), binary)
        confdir = base / "sluice"
        confdir.mkdir()
        os.chown(confdir, 0, nobody.pw_gid)  # the group stands in for "sluice"
        confdir.chmod(dir_mode)
        be = backends(harness.banner_handler, name="A")
        config = confdir / "sluice.toml"

        def text(level: str) -> str:
            return harness.render_config({"workers": 1, "access_log": "off", "log_level": level},
                                         [listener()], {"up": upstream(be)}) + '\n[admin]\nlisten = "127.0.0.1:0"\n'
        config.write_text(text("info"))
        config.chmod(0o644)
        proc = subprocess.Popen([str(binary), "-c", str(config)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, cwd="/",
                                preexec_fn=run_as_service_user(nobody.pw_uid, nobody.pw_gid))
        log = harness.LineLog(proc.stdout)
        try:
            m = log.wait_for(r"admin API listening on (\S+)", timeout=harness.START_TIMEOUT)
            host, port = harness.split_addr(m.group(1))
            conn = http.client.HTTPConnection(host, port, timeout=harness.EVENT_TIMEOUT)
            new = text("debug")
            conn.request("PUT", "/config", body=new.encode())
            reply = conn.getresponse()
            body = json.loads(reply.read())
            conn.close()
            if writable:
                assert reply.status == 200, body
                assert config.read_text() == new
                st = config.stat()
                assert st.st_uid == nobody.pw_uid and st.st_gid == nobody.pw_gid
                assert st.st_mode & 0o777 == 0o640, oct(st.st_mode)  # 0644 less UMask=0027
                assert sorted(p.name for p in confdir.iterdir()) == ["sluice.toml"]
            else:
                assert reply.status == 400, body
                assert "Permission denied" in body["error"], body
                assert config.read_text() == text("info")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=15) == 0
    finally:
        shutil.rmtree(base)
