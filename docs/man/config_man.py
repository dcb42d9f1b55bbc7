#!/usr/bin/env python3
"""Writes the scdoc source of sluice.toml(5) from docs/configuration.md.

docs/configuration.md is the one description of the file; the man page is
made from it at build time so the two cannot drift apart. Only the Markdown
that page uses is understood: headings, paragraphs, lists, fenced code,
tables, `code`, **bold** and links. A table whose last column is "meaning"
(the key tables) becomes one entry per row: the key in bold, then its
other columns on one line, then the meaning.

The page names the files where an installation puts them: the source
tree's `conf/` (the examples) and `docs/` (the guides) become DOCDIR's
`examples/` and DOCDIR, and the configuration file is SYSCONFDIR's.

Usage: config_man.py docs/configuration.md OUTPUT.scd [DOCDIR [SYSCONFDIR]]
"""

from __future__ import annotations

import re
import sys

# Inline Markdown: `code`, **bold**, [text](target).
INLINE_RX = re.compile(r"(`+)(?P<code>.+?)\1|\*\*(?P<bold>.+?)\*\*|\[(?P<text>[^\]]+)\]\((?P<target>[^)]+)\)")


def escape(text: str) -> str:
    """scdoc reads *, _ and \\ as markup; a backslash makes them literal."""
    return re.sub(r"([\\*_])", r"\\\1", text)


def inline(text: str) -> str:
    out = []
    pos = 0
    for m in INLINE_RX.finditer(text):
        out.append(escape(text[pos:m.start()]))
        if m.group("code") is not None:
            out.append("*" + escape(m.group("code").strip()) + "*")
        elif m.group("bold") is not None:
            # scdoc does not nest: code inside bold is just bold.
            out.append("*" + escape(m.group("bold").replace("`", "")) + "*")
        else:
            label = inline(m.group("text"))
            target = m.group("target")
            # Anchors and files of this source tree mean nothing in a man
            # page; addresses on the web are kept.
            out.append(f"{label} ({escape(target)})" if re.match(r"https?://", target) else label)
        pos = m.end()
    out.append(escape(text[pos:]))
    return "".join(out)


def split_row(line: str) -> list[str]:
    """Cells of a Markdown table row; a | inside `code` is not a separator."""
    cells, cell, in_code = [], "", False
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body) and body[i + 1] == "|":
            cell += "|"
            i += 2
            continue
        if c == "`":
            in_code = not in_code
        if c == "|" and not in_code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += c
        i += 1
    cells.append(cell.strip())
    return cells


def safe_line_start(text: str) -> str:
    """A paragraph must not start with what scdoc reads as a list, a table
    or a comment."""
    if text[:1] in "-.|:[;#" or text.startswith("\t"):
        return "\\" + text
    return text


def table(rows: list[str]) -> list[str]:
    header = [h.lower() for h in split_row(rows[0])]
    out = []
    for row in rows[2:]:
        cells = split_row(row)
        cells += [""] * (len(header) - len(cells))
        term, rest = cells[0], list(zip(header[1:], cells[1:]))
        body = ""
        if header[-1] in ("meaning", "effect", "answer"):
            body = rest.pop()[1]
        facts = [f"{name.capitalize()}: {inline(value)}" for name, value in rest if value]
        out.append(safe_line_start(inline(term)))
        lines = []
        if facts:
            lines.append(". ".join(facts) + ".")
        if body:
            lines.append(inline(body))
        # A blank line between two indented lines keeps the indent.
        out.append("\n\n".join("\t" + line for line in lines))
        out.append("")
    return out


def convert(markdown: str) -> str:
    lines = markdown.splitlines()
    out: list[str] = []
    i = 0
    skipping = False
    paragraph: list[str] = []

    def flush():
        if paragraph:
            out.append(safe_line_start(inline(" ".join(p.strip() for p in paragraph))))
            out.append("")
            paragraph.clear()

    while i < len(lines):
        line = lines[i]
        heading = re.match(r"(#+)\s+(.*)", line)
        if heading:
            flush()
            level, title = len(heading.group(1)), heading.group(2).strip()
            i += 1
            if level == 1:
                continue  # the page's own title: NAME says it
            # The table of contents links within the page: not for man.
            skipping = level == 2 and title.lower() == "contents"
            if skipping:
                continue
            text = inline(title).replace("*", "") if "`" in title else inline(title).upper()
            out += ["#" * (level - 1) + " " + text, ""]
            continue
        if skipping:
            i += 1
            continue
        if line.startswith("```"):
            flush()
            i += 1
            out.append("```")
            while i < len(lines) and not lines[i].startswith("```"):
                out.append(lines[i].replace("\\", "\\\\"))
                i += 1
            out += ["```", ""]
            i += 1
            continue
        if line.startswith("|"):
            flush()
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(lines[i])
                i += 1
            out += table(rows)
            continue
        item = re.match(r"(\s*)([-*]|\d+\.)\s+(.*)", line)
        if item and not paragraph:
            # A list: one item per marker; deeper markers nest, other
            # indented lines continue the item before them.
            while i < len(lines):
                m = re.match(r"(\s*)([-*]|\d+\.)\s+(.*)", lines[i])
                if m:
                    depth = len(m.group(1)) // 2
                    marker = "-" if m.group(2) in "-*" else "."
                    text = [m.group(3)]
                    i += 1
                    while i < len(lines) and lines[i].startswith(" ") and lines[i].strip() \
                            and not re.match(r"\s*([-*]|\d+\.)\s", lines[i]):
                        text.append(lines[i].strip())
                        i += 1
                    out.append("\t" * depth + marker + " " + inline(" ".join(text)))
                else:
                    break
            out.append("")
            continue
        if not line.strip():
            flush()
            i += 1
            continue
        paragraph.append(line)
        i += 1
    flush()
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


PREAMBLE = """\
sluice.toml(5)

; Made from docs/configuration.md by docs/man/config_man.py: edit that page.

# NAME

sluice.toml - the configuration file of *sluice*(8)

# SYNOPSIS

*{sysconfdir}/sluice/sluice.toml*

# DESCRIPTION

"""

SEE_ALSO = """
# SEE ALSO

*sluice*(8). The same text, with the operations guide (signals, the admin
API, logs, termination causes), the health check and DNS discovery guides,
is in {docdir}, with example files under {docdir}/examples.
"""


def installed_paths(markdown: str, docdir: str, sysconfdir: str) -> str:
    """Source-tree paths as an installation has them."""
    markdown = re.sub(r"(?<![\w/.])conf/", docdir + "/examples/", markdown)
    markdown = re.sub(r"(?<![\w/.])docs/", docdir + "/", markdown)
    return markdown.replace("/etc/sluice/", sysconfdir + "/sluice/")


def main() -> int:
    if len(sys.argv) not in (3, 4, 5):
        print(__doc__, file=sys.stderr)
        return 2
    docdir = sys.argv[3] if len(sys.argv) > 3 else "/usr/share/doc/sluice"
    sysconfdir = sys.argv[4] if len(sys.argv) > 4 else "/etc"
    with open(sys.argv[1], encoding="utf-8") as f:
        body = convert(installed_paths(f.read(), docdir, sysconfdir))
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        f.write(PREAMBLE.format(sysconfdir=sysconfdir) + body + SEE_ALSO.format(docdir=docdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
