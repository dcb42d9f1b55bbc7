"""The man pages: sluice.toml(5) documents every key the parser accepts
(it is made from docs/configuration.md, which must too), and sluice(8) every
command-line option, signal and exit status."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import harness

REPO = harness.REPO
CONFIG_MD = REPO / "docs" / "configuration.md"


def literals(text: str) -> list[str]:
    return re.findall(r'"([^"\\]*)"', text)


def parser_keys() -> dict[str, set[str]]:
    """Every key the parser accepts, read from its key lists in
    src/config/*.cpp: reject_unknown_keys({...}) calls, k...Keys lists and
    the per-type lists of health checks ({"http", HealthType::http, {...}}).
    Returns key -> the files that accept it."""
    keys: dict[str, set[str]] = {}
    for path in sorted((REPO / "src" / "config").glob("*.cpp")):
        src = path.read_text()
        lists = re.findall(r"reject_unknown_keys\(\s*\{([^}]*)\}", src)
        lists += re.findall(r"\bk\w*Keys\s*=\s*\{([^}]*)\}", src)
        lists += re.findall(r'\{\s*"[^"]*"\s*,\s*\w+::\w+\s*,\s*\{([^}]*)\}\s*\}', src)
        for body in lists:
            for key in literals(body):
                keys.setdefault(key, set()).add(path.name)
    return keys


def allowed_lists_from_the_parser(tmp_path: Path) -> set[str]:
    """The keys sluice itself lists after "allowed:" when a table holds an
    unknown one: the parser's answer, to check the reading of its source."""
    base = {
        "top": "zzz_unknown = 1\n",
        "global": "[global]\nzzz_unknown = 1\n",
        "admin": "[admin]\nzzz_unknown = 1\n",
        "listener": '[[listener]]\nname = "a"\nlisten = "127.0.0.1:0"\nupstream = "u"\nzzz_unknown = 1\n',
        "route": ('[[listener]]\nname = "a"\nlisten = "127.0.0.1:0"\npreread = "tls"\n'
                  'routes = [{ sni = "a.example", upstream = "u", zzz_unknown = 1 }]\n'),
        "upstream": '[upstream.u]\nzzz_unknown = 1\nservers = [{ address = "127.0.0.1:1" }]\n',
        "server": '[upstream.u]\nservers = [{ address = "127.0.0.1:1", zzz_unknown = 1 }]\n',
    }
    for t in ("tcp", "http", "send_expect", "postgres", "redis"):
        base[f"health {t}"] = ('[upstream.u]\nservers = [{ address = "127.0.0.1:1" }]\n'
                               f'[upstream.u.health]\ntype = "{t}"\nzzz_unknown = 1\n')
    listener = '[[listener]]\nname = "a"\nlisten = "127.0.0.1:0"\nupstream = "u"\n'
    upstream = '[upstream.u]\nservers = [{ address = "127.0.0.1:1" }]\n'
    found: set[str] = set()
    for name, text in base.items():
        if "[[listener]]" not in text:
            text = listener + text
        if "[upstream.u]" not in text:
            text += upstream
        path = tmp_path / f"{name.replace(' ', '_')}.toml"
        path.write_text(text)
        res = harness.run_check(path)
        out = (res.stdout + res.stderr).decode()
        m = re.search(r'unknown key "zzz_unknown"; allowed: (.*)$', out, re.M)
        assert m, f"{name}: no list of allowed keys in:\n{out}"
        found |= {k.strip() for k in m.group(1).split(",")}
    return found


def documented_terms(markdown: str) -> set[str]:
    """Keys configuration.md describes: the first cell of a table row, the
    start of a list item (`sni`: ...) or a table heading ([global])."""
    terms = set()
    for m in re.finditer(r"^\|\s*`([^`]+)`", markdown, re.M):
        terms.add(m.group(1))
    for m in re.finditer(r"^\s*-\s+`([^`]+)`:", markdown, re.M):
        terms.add(m.group(1))
    for m in re.finditer(r"^#+\s.*?`\[+([a-z_]+)", markdown, re.M):
        terms.add(m.group(1))
    return terms


def man_page(name: str) -> Path:
    build = harness.sluice_bin().parent
    page = build / "docs" / "man" / name
    if not (build / "meson-info").is_dir():
        pytest.skip(f"{harness.sluice_bin()} is not in a meson build directory")
    assert page.is_file(), f"{page} was not built (scdoc missing? tools/setup.sh installs it)"
    return page


def render(page: Path) -> str:
    res = subprocess.run(["man", "--warnings", "-l", str(page)], capture_output=True, text=True,
                         env={"MANWIDTH": "100", "MAN_KEEP_FORMATTING": "", "PATH": "/usr/bin:/bin",
                              "LANG": "C.UTF-8"}, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr, res.stderr
    return res.stdout


def man_terms(roff: str) -> set[str]:
    """Bold words at the start of a line of the page: the key entries."""
    return {re.sub(r"\\(.)", r"\1", m.group(1)) for m in re.finditer(r"^\\fB(.+?)\\fR", roff, re.M)}


def test_the_source_reading_finds_what_the_parser_reports(tmp_path):
    grep = set(parser_keys())
    # If the key lists move or change form, the reading above must follow:
    # the parser's own "allowed:" lists are the check.
    reported = allowed_lists_from_the_parser(tmp_path)
    assert reported - grep == set(), f"keys the parser accepts that src/config/*.cpp's lists did not give: " \
                                     f"{sorted(reported - grep)}"
    assert {"workers", "listen", "servers", "expect_status", "password_file", "sni"} <= grep


def test_configuration_md_documents_every_key():
    missing = sorted(set(parser_keys()) - documented_terms(CONFIG_MD.read_text()))
    assert not missing, f"keys the parser accepts that docs/configuration.md does not describe: {missing}"


def top_level_tables() -> set[str]:
    """The tables at the top of the file ([global], [[listener]], ...)."""
    src = (REPO / "src" / "config" / "config_parser.cpp").read_text()
    m = re.search(r"top\.reject_unknown_keys\(\s*\{([^}]*)\}", src)
    assert m, "config_parser.cpp: the top level's key list was not found"
    return set(literals(m.group(1)))


def test_sluice_toml_5_documents_every_key():
    page = man_page("sluice.toml.5")
    roff = page.read_text()
    tables = top_level_tables()
    assert {"global", "admin", "listener", "upstream"} <= tables
    missing = sorted(set(parser_keys()) - man_terms(roff) - tables)
    assert not missing, f"keys the parser accepts that sluice.toml(5) does not describe: {missing}"
    # A table has a section of its own: [global], [[listener]], [upstream.NAME].
    missing = sorted(t for t in tables if not re.search(rf"^\.S[HS] .*\[+{t}\b", roff, re.M))
    assert not missing, f"tables without a section in sluice.toml(5): {missing}"
    text = render(page)
    assert "sluice.toml - the configuration file of sluice(8)" in text


def test_sluice_toml_5_follows_configuration_md():
    """Text from the reference reaches the page: the page is made from it,
    not a copy that could be left behind."""
    roff = man_page("sluice.toml.5").read_text()
    flat = re.sub(r"\\f[BRI]|\\&|\\", "", roff)
    for sentence in re.findall(r"^\| `\w+` \|[^|]*\|[^|]*\|[^|]*\| ([A-Z][^`|*\[]{30,}?\.)", CONFIG_MD.read_text(),
                               re.M):
        assert sentence in flat.replace("\n", " "), sentence


def test_sluice_8_covers_the_command_line_signals_and_exit_statuses():
    page = man_page("sluice.8")
    text = render(page)
    usage = subprocess.run([str(harness.sluice_bin()), "--help"], capture_output=True, text=True, timeout=30).stdout
    options = set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", usage))
    assert {"-c", "--config", "-t", "--test", "--version", "-h", "--help"} <= options
    missing = sorted(o for o in options if not re.search(rf"(?<![\w-]){re.escape(o)}\b", text))
    assert not missing, f"options of sluice --help missing from sluice(8): {missing}"
    signals = set(re.findall(r"SIG[A-Z0-9]+", usage)) | {"SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1"}
    assert not [s for s in signals if s not in text], signals
    for section in ("SYNOPSIS", "OPTIONS", "SIGNALS", "FILES", "EXIT STATUS"):
        assert re.search(rf"^{section}$", text, re.M), f"no {section} section"
    exits = text[text.index("EXIT STATUS"):]
    for status in ("0", "1", "2"):
        assert re.search(rf"^\s+{status}$", exits, re.M), f"exit status {status} not described"
    # What the binary really does for each status it documents.
    assert subprocess.run([str(harness.sluice_bin()), "--no-such-flag"], capture_output=True,
                          timeout=30).returncode == 2
    assert subprocess.run([str(harness.sluice_bin()), "-t", "-c", "/nonexistent/sluice.toml"], capture_output=True,
                          timeout=30).returncode == 1


def test_every_check_type_is_listed_where_the_types_are():
    """The `type` values the parser accepts, in configuration.md's `type`
    row and in sluice.toml(5), and each check named in sluice(8)."""
    src = (REPO / "src" / "config" / "health_parser.cpp").read_text()
    m = re.search(r'choice<HealthType>\(\s*"type",\s*\{(.*?)\}\)', src, re.S)
    assert m, "health_parser.cpp: the list of check types was not found"
    types = set(re.findall(r'\{"(\w+)",\s*HealthType::', m.group(1)))
    assert {"tcp", "http", "send_expect", "postgres", "redis", "mysql"} <= types
    row = re.search(r"^\| `type` \|.*$", CONFIG_MD.read_text(), re.M).group(0)
    assert not [t for t in types if f'`"{t}"`' not in row], row
    # Words man hyphenated at a line's end are joined again.
    text = re.sub("[\u2010-]\n\\s*", "", render(man_page("sluice.toml.5")))
    at = re.search(r"^\s+type\s*$", text, re.M)
    assert at, "no entry for type in sluice.toml(5)"
    entry = " ".join(text[at.start():at.start() + 600].split())
    assert not [t for t in types if f'"{t}"' not in entry], entry
    man8 = " ".join(render(man_page("sluice.8")).split())
    for name in ("PostgreSQL", "MySQL", "Redis", "send/expect", "HTTP", "TCP"):
        assert name in man8, name
