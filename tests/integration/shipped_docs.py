"""What the installed documentation links to: every relative link of every
shipped page (Markdown links and images) must lead to a file that is
shipped too. Used on a `meson install` destdir and on the Debian package."""

from __future__ import annotations

import re
from pathlib import Path

# [text](target) and ![alt](target); code spans and fenced blocks are not links.
LINK_RX = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE_RX = re.compile(r"^```.*?^```", re.S | re.M)
CODE_RX = re.compile(r"`[^`\n]*`")


def relative_links(page: Path) -> list[str]:
    text = CODE_RX.sub("", FENCE_RX.sub("", page.read_text(encoding="utf-8")))
    out = []
    for m in LINK_RX.finditer(text):
        target = m.group(1)
        if target.startswith("#") or re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue  # an anchor in the page, or http:, https:, mailto:, man:
        out.append(target)
    return out


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub makes them: lower case,
    punctuation dropped, spaces to hyphens."""
    text = FENCE_RX.sub("", page.read_text(encoding="utf-8"))
    out = set()
    for m in re.finditer(r"^#+\s+(.*?)\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        out.add(slug)
    return out


def broken_links(docdir: Path) -> list[str]:
    """"page -> target" for each relative link of a page under `docdir`
    whose target is not a file or directory under `docdir` (or, for a page,
    has no such heading)."""
    docdir = docdir.resolve()
    broken = []
    for page in sorted(docdir.rglob("*.md")):
        for target in relative_links(page):
            file_part, _, anchor = target.partition("#")
            path = (page.parent / file_part).resolve()
            inside = path == docdir or docdir in path.parents
            # A directory (a recipe's files) is shipped when it is there.
            if not inside or not (path.is_file() or path.is_dir()):
                broken.append(f"{page.relative_to(docdir)} -> {target}")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{page.relative_to(docdir)} -> {target} (no such heading)")
    return broken
