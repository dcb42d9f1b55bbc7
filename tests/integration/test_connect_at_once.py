"""A connect to a server on loopback is over when connect(2) returns.

The kernel runs a loopback connect's SYN, SYN-ACK and ACK before the call
returns, so sluice asks the socket (TCP_INFO) at once instead of waiting
for the EPOLLOUT of its next epoll_wait, and a client whose first bytes are
already there has them sent to the server in the loop turn that accepted
it. That is one loop turn less for every short connection to a local
server (docs/decisions.md, "Where a slow short connection's time goes").

Traced with strace, one file per thread: after the worker's accept4()
returns a client, the client's bytes must go to the server (a send on
another descriptor) before the worker's next wait. Before this change no
connection could do that: the connect was learned from a wait.
"""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess

import pytest

import harness
from harness import listener, upstream

CONNECTIONS = 20
ACCEPTED = re.compile(r"^accept4\(.*\)\s+= (\d+)")
SENT = re.compile(r'^sendto\((\d+), "at-once-')
WAIT = re.compile(r"^epoll_p?wait\(")


def sent_before_the_next_wait(trace_lines: list[str]) -> tuple[int, int]:
    """(accepted, sent on to the server before the next wait) in one
    thread's trace."""
    accepted = at_once = 0
    client = None
    for line in trace_lines:
        if m := ACCEPTED.match(line):
            accepted += 1
            client = m.group(1)
        elif WAIT.match(line):
            client = None
        elif (m := SENT.match(line)) and client is not None and m.group(1) != client:
            at_once += 1
            client = None
    return accepted, at_once


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_client_bytes_reach_a_loopback_server_in_the_turn_that_accepted_them(sluice, backends, tmp_path, host):
    if shutil.which("strace") is None:
        pytest.fail("strace is not installed (tools/setup.sh installs it)")
    if host == "::1" and not harness.ipv6_available():
        pytest.skip("no IPv6 on loopback")
    backend = backends(host=host)
    # The copy path: a spliced session moves its bytes with splice(2), not send.
    s = sluice([listener(splice="off")], {"up": upstream(backend.address)}, global_={"access_log": "off"})
    addr = s.addr()
    assert harness.exchange(*addr, b"warm-up\n") == b"warm-up\n"

    prefix = tmp_path / "trace"
    tracer = subprocess.Popen(["strace", "-ff", "-s", "16", "-e", "trace=accept4,sendto,epoll_wait,epoll_pwait",
                               "-o", str(prefix), "-p", str(s.pid)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log = harness.LineLog(tracer.stderr)
    try:
        # "Process N attached with K threads": printed once every thread is.
        log.wait_for(r"attached")
        for i in range(CONNECTIONS):
            payload = b"at-once-%02d\n" % i
            with socket.create_connection(addr, timeout=harness.EVENT_TIMEOUT) as c:
                c.sendall(payload)  # right after the connect, as a client program does
                assert harness.recv_exact(c, len(payload)) == payload
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=30)
        log.join()

    accepted = at_once = 0
    for trace in tmp_path.glob("trace.*"):
        a, n = sent_before_the_next_wait(trace.read_text(errors="replace").splitlines())
        accepted += a
        at_once += n
    assert accepted == CONNECTIONS, f"strace saw {accepted} accepts for {CONNECTIONS} connections"
    # Whether a client's bytes are there when sluice accepts it depends on
    # timing (the client sends just after its connect); a traced sluice is
    # slow to accept, so nearly every one finds them. One is enough to show
    # the connect was not waited for.
    assert at_once >= 1, f"no client's bytes went to the server before the worker's next wait ({accepted} accepted)"


def test_sent_before_the_next_wait_reads_a_trace():
    trace = [
        "epoll_wait(5, [{events=EPOLLIN, data={u32=1, u64=1}}], 256, -1) = 1",
        "accept4(7, {sa_family=AF_INET, sin_port=htons(40000)}, [16], SOCK_CLOEXEC|SOCK_NONBLOCK) = 12",
        'sendto(13, "at-once-00\\n", 11, MSG_NOSIGNAL, NULL, 0) = 11',
        "accept4(7, 0x7ffd, [128], SOCK_CLOEXEC|SOCK_NONBLOCK) = -1 EAGAIN (Resource temporarily unavailable)",
        "accept4(7, {sa_family=AF_INET, sin_port=htons(40002)}, [16], SOCK_CLOEXEC|SOCK_NONBLOCK) = 14",
        "epoll_wait(5, [{events=EPOLLOUT, data={u32=2, u64=2}}], 256, -1) = 2",
        'sendto(15, "at-once-01\\n", 11, MSG_NOSIGNAL, NULL, 0) = 11',
        'sendto(14, "at-once-01\\n", 11, MSG_NOSIGNAL, NULL, 0) = 11',
    ]
    assert sent_before_the_next_wait(trace) == (2, 1)
