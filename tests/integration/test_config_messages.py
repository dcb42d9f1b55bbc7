"""What sluice says when a configuration cannot be used: a reload refused
because another program holds a new listener's address names that listener
and says the address is taken, without guessing who holds it."""

from __future__ import annotations

import socket

import harness
from fixtures import default_global
from harness import listener, upstream


def test_reload_onto_an_address_another_program_holds_names_the_listener(sluice, backends):
    be = backends(harness.banner_handler, name="A")
    s = sluice([listener("main")], {"up": upstream(be)})
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        host, port = taken.getsockname()
        text = harness.render_config(default_global(s.access_log),
                                     [listener("main"), listener("extra", listen=f"{host}:{port}")],
                                     {"up": upstream(be)})
        m = s.reload(text, expect_ok=False)
        line = m.group(0)
        assert f'listener "extra": cannot listen on {host}:{port}' in line, line
        assert "the address is taken" in line, line
        assert "second sluice" not in line, line
    finally:
        taken.close()
    # The running configuration stays, and serves.
    assert harness.banner_of(s, "main") == b"A"
