"""The Debian package: tools/deb.sh builds it once (dpkg-buildpackage -b) into
a temporary directory, then its contents, conffiles, maintainer scripts and
unit are checked, and lintian must find no error.

Slow (a full compile): tools/test.sh runs it once, on the default build's
stage, not in the sanitizer passes.
    python3 -m pytest -q -p no:cacheprovider tests/package
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "integration"))
import shipped_docs  # noqa: E402
BUILD_TIMEOUT = 3600  # two shared cores; only reached when something hangs


def need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.fail(f"missing {' '.join(missing)}: tools/setup.sh installs them", pytrace=False)


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> dict[str, Path]:
    need("dpkg-buildpackage", "dh", "dpkg-deb", "lintian", "scdoc", "fakeroot")
    out = tmp_path_factory.mktemp("deb")
    res = subprocess.run([str(REPO / "tools" / "deb.sh"), str(out)], capture_output=True, text=True,
                         timeout=BUILD_TIMEOUT)
    assert res.returncode == 0, res.stdout + res.stderr
    debs = sorted(out.glob("sluice_*.deb"))
    changes = sorted(out.glob("sluice_*.changes"))
    assert len(debs) == 1 and len(changes) == 1, sorted(p.name for p in out.iterdir())
    root = out / "root"
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(root)], check=True, timeout=120)
    control = out / "control"
    subprocess.run(["dpkg-deb", "-e", str(debs[0]), str(control)], check=True, timeout=120)
    return {"deb": debs[0], "changes": changes[0], "root": root, "control": control}


def contents(deb: Path) -> dict[str, str]:
    """path -> the `dpkg-deb -c` line (mode, owner, size, ...)."""
    out = subprocess.run(["dpkg-deb", "-c", str(deb)], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    files = {}
    for line in out.splitlines():
        path = line.split()[5]
        files[path.lstrip(".").rstrip("/") or "/"] = line
    return files


def info(deb: Path, field: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), field], check=True, capture_output=True, text=True,
                          timeout=60).stdout.strip()


def test_package_installs_the_operators_files(package):
    files = contents(package["deb"])
    for path in ["/usr/sbin/sluice",
                 "/etc/sluice/sluice.toml",
                 "/lib/systemd/system/sluice.service",
                 "/etc/logrotate.d/sluice",
                 "/usr/lib/sysusers.d/sluice.conf",
                 "/usr/lib/tmpfiles.d/sluice.conf",
                 "/usr/share/man/man8/sluice.8.gz",
                 "/usr/share/man/man5/sluice.toml.5.gz",
                 "/usr/share/doc/sluice/copyright",
                 "/usr/share/doc/sluice/README.md",
                 "/usr/share/doc/sluice/configuration.md",
                 "/usr/share/doc/sluice/operations.md",
                 "/usr/share/doc/sluice/health.md",
                 "/usr/share/doc/sluice/discovery.md",
                 "/usr/share/doc/sluice/scale-out.md",
                 "/usr/share/doc/sluice/recipes/patroni.md",
                 "/usr/share/doc/sluice/examples/sluice.toml"]:
        assert path in files, f"{path} is not in the package"
    assert files["/usr/sbin/sluice"].startswith("-rwxr-xr-x root/root")
    # Nothing under /usr/local, and no test or benchmark binary.
    assert not [p for p in files if p.startswith("/usr/local")]
    assert not [p for p in files if re.search(r"/(test_\w+|loadgen|bench_balance|syscall_cost)$", p)]


def test_installed_configuration_starts_no_listener(package):
    """The demo (listeners on 7000/7001, the admin API on Prometheus's 9090)
    stays an example: the conffile starts no listener and puts the admin API
    on 127.0.0.1:8489."""
    text = (package["root"] / "etc/sluice/sluice.toml").read_text()
    assert not re.search(r"^\s*\[\[listener\]\]", text, re.M), text
    assert re.search(r'^\[admin\]\nlisten = "127\.0\.0\.1:8489"$', text, re.M), text
    assert "/usr/share/doc/sluice/examples" in text
    demo = (package["root"] / "usr/share/doc/sluice/examples/sluice.toml").read_text()
    assert demo == (REPO / "conf" / "sluice.toml").read_text()


def test_every_link_of_the_shipped_docs_is_shipped(package):
    docdir = package["root"] / "usr/share/doc/sluice"
    assert shipped_docs.broken_links(docdir) == []


def test_description_lists_every_check_type(package):
    description = info(package["deb"], "Description")
    for name in ("PostgreSQL", "MySQL", "Redis", "DNS"):
        assert name in description, description


def test_configuration_and_logrotate_are_conffiles(package):
    conffiles = (package["control"] / "conffiles").read_text().split()
    assert "/etc/sluice/sluice.toml" in conffiles
    assert "/etc/logrotate.d/sluice" in conffiles


def test_dependencies_come_from_the_shared_libraries(package):
    depends = info(package["deb"], "Depends")
    # ${shlibs:Depends}: one entry per library the binary links.
    for lib in ("libuv1", "libspdlog", "libhiredis", "libpq5", "libsystemd0", "libhttp-parser", "libxxhash0",
                "libc6", "libstdc++6"):
        assert lib in depends, f"{lib} not in Depends: {depends}"
    # The postinst runs systemd-sysusers.
    assert "systemd | systemd-standalone-sysusers" in depends, depends
    assert info(package["deb"], "Package") == "sluice"


def test_postinst_creates_the_user_before_the_directory_needs_its_group(package):
    postinst = (package["control"] / "postinst").read_text()
    sysusers = postinst.find("systemd-sysusers")
    tmpfiles = postinst.find("systemd-tmpfiles")
    assert sysusers >= 0, postinst
    assert tmpfiles > sysusers, "the tmpfiles rule gives /etc/sluice to group sluice: the user must exist first"
    assert re.search(r"systemd-sysusers .*sluice\.conf", postinst), postinst
    # Enabled and started at installation, stopped at removal, never
    # stopped or restarted by an upgrade (a restart ends every live
    # session: the operator decides when).
    assert re.search(r"deb-systemd-helper enable 'sluice.service'", postinst), postinst
    assert re.search(r"deb-systemd-invoke start 'sluice.service'", postinst), postinst
    assert "restart" not in postinst, postinst
    control = package["control"]
    preinst = (control / "preinst").read_text() if (control / "preinst").exists() else ""
    assert "stop" not in preinst, preinst
    prerm = (control / "prerm").read_text()
    assert re.search(r'"\$1" = remove .*\n\s*deb-systemd-invoke stop .sluice.service', prerm), prerm
    root = package["root"]
    sysusers_conf = (root / "usr/lib/sysusers.d/sluice.conf").read_text()
    assert re.search(r"^u sluice\b", sysusers_conf, re.M), sysusers_conf
    tmpfiles_conf = (root / "usr/lib/tmpfiles.d/sluice.conf").read_text()
    assert re.search(r"^d /etc/sluice 2775 root sluice\b", tmpfiles_conf, re.M), tmpfiles_conf


def test_unit_runs_the_packaged_binary_and_may_rewrite_its_configuration(package):
    root = package["root"]
    unit = (root / "lib/systemd/system/sluice.service").read_text()
    assert "ExecStart=/usr/sbin/sluice -c /etc/sluice/sluice.toml\n" in unit
    assert "ReadWritePaths=/etc/sluice\n" in unit
    assert "User=sluice\n" in unit and "DynamicUser" not in unit
    docs = re.search(r"^Documentation=(.*)$", unit, re.M).group(1).split()
    assert "file:/usr/share/doc/sluice/operations.md" in docs, docs
    assert (root / "usr/share/doc/sluice/operations.md").is_file(), "Documentation= must not point at a .gz"
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    # Pointed at the extracted binary (verify checks that ExecStart= names an
    # executable) and man pages (it runs man for Documentation=man:...).
    copy = root.parent / "sluice.service"
    copy.write_text(unit.replace("/usr/sbin/sluice ", f"{root}/usr/sbin/sluice "))
    res = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "MANPATH": str(root / "usr/share/man")})
    assert res.returncode == 0 and "sluice.service" not in res.stdout + res.stderr, res.stdout + res.stderr


def test_packaged_binary_accepts_the_packaged_configuration(package):
    root = package["root"]
    binary = root / "usr/sbin/sluice"
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    assert version.returncode == 0 and version.stdout.startswith("sluice "), version
    assert info(package["deb"], "Version").startswith(version.stdout.split()[1])
    res = subprocess.run([str(binary), "-t", "-c", str(root / "etc/sluice/sluice.toml")],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr


def test_man_pages_render(package):
    root = package["root"]
    for page, title in (("usr/share/man/man8/sluice.8.gz", "sluice - layer-4 TCP load balancer"),
                        ("usr/share/man/man5/sluice.toml.5.gz", "sluice.toml - the configuration file")):
        res = subprocess.run(["man", "--warnings", "-l", str(root / page)], capture_output=True, text=True,
                             env={"MANWIDTH": "100", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, timeout=60)
        assert res.returncode == 0 and "warning" not in res.stderr, res.stderr
        assert title in res.stdout, res.stdout[:500]


def test_lintian_finds_no_error(package):
    res = subprocess.run(["lintian", "--fail-on", "error", "--tag-display-limit", "0", str(package["changes"])],
                         capture_output=True, text=True, timeout=1800)
    errors = [line for line in res.stdout.splitlines() if line.startswith("E:")]
    assert res.returncode == 0 and not errors, res.stdout + res.stderr
