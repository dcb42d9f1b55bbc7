"""Per-test certificates and `openssl s_server` backends."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from fixtures import backends, sluice  # noqa: E402,F401  (pytest fixtures)
from tlspeers import OPENSSL, Cert, TlsServer, make_cert, make_key  # noqa: E402


@pytest.fixture(scope="session")
def rsa_key(tmp_path_factory):
    if OPENSSL is None:
        pytest.skip("openssl not installed")
    return make_key(tmp_path_factory.mktemp("key"))


@pytest.fixture
def certs(tmp_path, rsa_key):
    """certs(cn) -> Cert, generated for this test only (cached within it)."""
    made: dict[str, Cert] = {}
    d = tmp_path / "certs"
    d.mkdir()

    def get(cn: str) -> Cert:
        if cn not in made:
            made[cn] = make_cert(d, cn, rsa_key)
        return made[cn]

    return get


@pytest.fixture
def tls_servers(certs):
    """tls_servers(cn, alpn=...) -> TlsServer with its own certificate for cn."""
    started: list[TlsServer] = []

    def make(cn: str, alpn: str | None = "h2,http/1.1") -> TlsServer:
        srv = TlsServer(certs(cn), alpn=alpn)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()
