"""Routes on ALPN as well as SNI (docs/configuration.md, "TLS and PostgreSQL
preread, SNI routes"), with real handshakes: openssl s_client -alpn in front,
one openssl s_server per pool behind, each known by its certificate."""

from __future__ import annotations

import pytest

from harness import upstream
from test_tls import s_client, tls_listener
from tlspeers import subject_cn


@pytest.fixture
def alpn_routes(sluice, tls_servers):
    servers = {
        "db_pg": tls_servers("db-pg.test", alpn="postgresql"),
        "db": tls_servers("db.test", alpn=None),  # takes any ALPN list
        "h2": tls_servers("h2.test", alpn="h2"),
        "h1": tls_servers("h1.test", alpn="http/1.1"),
        "other": tls_servers("default.test", alpn=None),
    }
    routes = [
        {"sni": "db.test", "alpn": "postgresql", "upstream": "db_pg"},
        {"sni": "db.test", "upstream": "db"},
        {"alpn": "h2", "upstream": "h2"},
        {"alpn": "http/1.1", "upstream": "h1"},
    ]
    s = sluice([tls_listener(routes=routes, default_upstream="other")],
               {name: upstream(srv.address) for name, srv in servers.items()})
    return s, servers


CASES = [
    # (sni, client's ALPN list, pool): sni+alpn, then sni, then alpn, then the default.
    ("db.test", "postgresql", "db_pg"),
    ("db.test", "h2", "db"),
    ("db.test", None, "db"),
    ("web.test", "h2", "h2"),
    ("web.test", "http/1.1", "h1"),
    ("web.test", "http/1.1,h2", "h1"),  # the client's first choice with a route
    ("web.test", "spdy/1,h2", "h2"),
    (None, "h2", "h2"),
    ("web.test", None, "other"),
    ("web.test", "postgresql", "other"),  # postgresql is routed only for db.test
]


def test_routes_on_sni_and_alpn_most_specific_first(alpn_routes):
    s, servers = alpn_routes
    for i, (sni, alpn, pool) in enumerate(CASES):
        out, reversed_line = s_client(s.port(), sni, alpn=alpn)
        assert subject_cn(out) == servers[pool].cn, f"{sni} {alpn}: {out[-2000:]}"
        recs = s.wait_records(i + 1)  # one at a time keeps the log in order
        assert (recs[-1]["upstream"], recs[-1]["alpn"]) == (pool, alpn or "-"), recs[-1]


def test_postgresql_alpn_is_negotiated_with_the_routed_server(alpn_routes):
    s, servers = alpn_routes
    out, _ = s_client(s.port(), "db.test", alpn="postgresql")
    assert "ALPN protocol: postgresql" in out, out[-2000:]
    assert subject_cn(out) == servers["db_pg"].cn
