"""debian/control's Build-Depends against what the build looks for: every
library meson.build requires (outside the tests and tools, which the
package build leaves out) and every program the package build runs must
come from a package that Build-Depends names, or one such a package
depends on. A build in a clean chroot would find a missing one too, but
takes many minutes; this asks meson and dpkg what the build would use.

Each dependency is traced to its Debian package through the file meson
finds (the pkg-config file, the header of a plain library, the program's
path) and `dpkg -S`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

import harness

REPO = harness.REPO

pytestmark = pytest.mark.skipif(shutil.which("dpkg") is None or shutil.which("meson") is None,
                                reason="needs dpkg and meson")


def build_depends() -> set[str]:
    text = (REPO / "debian" / "control").read_text()
    m = re.search(r"^Build-Depends:(.*?)^\S", text, re.M | re.S)
    assert m, "no Build-Depends in debian/control"
    names = set()
    for entry in m.group(1).split(","):
        entry = entry.strip()
        if entry:
            names.add(re.split(r"[\s(:]", entry)[0])
    return names


def owner(path: str) -> str:
    """The Debian package that installed `path` (dpkg -S), without arch."""
    res = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        # Through a symbolic link of the usr merge (/lib -> /usr/lib) dpkg knows the other name.
        alt = path.replace("/usr/", "/", 1) if path.startswith("/usr/") else "/usr" + path
        res = subprocess.run(["dpkg", "-S", alt], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"no package owns {path}: {res.stderr.strip()}"
    return res.stdout.split(":", 1)[0].split(",")[0].strip()


def depends_of(package: str) -> set[str]:
    res = subprocess.run(["dpkg-query", "-W", "-f=${Depends},${Pre-Depends}", package], capture_output=True,
                         text=True, timeout=60)
    if res.returncode != 0:
        return set()
    return {re.split(r"[\s(:]", d.strip())[0] for d in re.split(r"[,|]", res.stdout) if d.strip()}


def provided_by(package: str, names: set[str]) -> bool:
    """`package` is one of `names`, or a dependency of one (one level: a
    -dev package's own -dev dependencies, python3 for python3-minimal)."""
    return package in names or any(package in depends_of(n) for n in names)


def meson_dependencies() -> list[dict]:
    out = subprocess.run(["meson", "introspect", "--dependencies", "meson.build"], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_every_library_the_build_requires_is_a_build_dependency():
    names = build_depends()
    deps = [d for d in meson_dependencies() if d["required"] and not d["conditional"] and d["name"] != "threads"]
    # The reading must find what the build is known to need.
    assert {"libuv", "libcares", "libpq", "libmariadb"} <= {d["name"] for d in deps}
    missing = []
    for d in deps:
        res = subprocess.run(["pkg-config", "--path", d["name"]], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, f"pkg-config does not know {d['name']} (is its -dev package installed?)"
        package = owner(res.stdout.strip())
        if not provided_by(package, names):
            missing.append(f"{d['name']} ({package})")
    assert not missing, f"libraries meson.build requires that Build-Depends does not name: {missing}"


def test_plain_libraries_and_programs_are_build_dependencies():
    """cpp.find_library(..., has_headers) and find_program(): not in meson's
    dependency list, read from the build files the package build uses."""
    names = build_depends()
    files = [REPO / "meson.build", *sorted((REPO / "src").rglob("meson.build")), REPO / "docs" / "man" / "meson.build"]
    text = "\n".join(p.read_text() for p in files)
    headers = re.findall(r"find_library\(\s*'[^']+'\s*,\s*has_headers\s*:\s*\[\s*'([^']+)'", text)
    programs = re.findall(r"find_program\(\s*'([^']+)'", text)
    assert "http_parser.h" in headers and {"scdoc", "python3"} <= set(programs)
    missing = []
    for header in headers:
        package = owner(f"/usr/include/{header}")
        if not provided_by(package, names):
            missing.append(f"{header} ({package})")
    for program in programs:
        # The system's, as the package build finds it (not a user's own python3).
        path = shutil.which(program, path="/usr/bin:/bin")
        assert path, f"{program} is not installed"
        package = owner(path)
        if not provided_by(package, names):
            missing.append(f"{program} ({package})")
    assert not missing, f"what the package build uses that Build-Depends does not name: {missing}"


def test_the_version_meson_wants_is_the_one_build_depends_asks():
    text = (REPO / "debian" / "control").read_text()
    for d in meson_dependencies():
        if not d["required"] or d["conditional"] or not d["version"] or d["name"] == "threads":
            continue
        package = owner(subprocess.run(["pkg-config", "--path", d["name"]], capture_output=True, text=True,
                                       timeout=60).stdout.strip())
        for want in d["version"]:
            version = want.lstrip(">=")
            if package.startswith(("libspdlog", "libtomlplusplus")):
                continue  # their Debian versions are not their upstream versions' (epoch, soname)
            assert re.search(rf"{re.escape(package)} \(>= {re.escape(version)}\)", text), \
                f"meson.build wants {d['name']} {want}: Build-Depends should say {package} (>= {version})"
