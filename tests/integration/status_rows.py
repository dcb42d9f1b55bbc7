"""Reads the status page as the tests need it: each server row
(data-server -> {"class", "text"}) and every tag with its attributes."""

from __future__ import annotations

import html.parser


class StatusPageRows(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows: dict[str, dict] = {}
        self.tags: list[tuple[str, dict]] = []
        self._cur: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "tr" and "data-server" in a:
            self._cur = {"class": a.get("class") or "", "text": ""}
            self.rows[a["data-server"]] = self._cur

    def handle_endtag(self, tag):
        if tag == "tr":
            self._cur = None

    def handle_data(self, data):
        if self._cur is not None:
            self._cur["text"] += data
