"""A client process that holds many idle connections and records when each
one is closed by the far end (docs/operations.md, close_spread).

    python3 conn_holder.py HOST PORT COUNT SECONDS

Raises its own descriptor limit, opens COUNT connections (each sends one
line and waits for its echo, so that sluice has connected it to its
server), prints `held COUNT`, then waits, at most SECONDS, for the far end
to close each one (EOF or reset), and prints one JSON line: the
CLOCK_MONOTONIC time of every close (the same clock as the test's
time.monotonic()) and how many were still open at the deadline. Every
loop is bounded in count and time."""

from __future__ import annotations

import json
import resource
import selectors
import socket
import sys
import time


def main() -> int:
    host, port, count, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = count + 64
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    conns: list[socket.socket] = []
    for _ in range(count):
        c = socket.create_connection((host, port), timeout=10)
        conns.append(c)
    for c in conns:
        c.sendall(b"hello\n")
    for c in conns:
        got = b""
        while len(got) < 6:
            chunk = c.recv(6 - len(got))
            if not chunk:
                print(json.dumps({"error": "closed before its echo came back"}), flush=True)
                return 1
            got += chunk
        c.setblocking(False)
    print(f"held {len(conns)}", flush=True)

    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c, selectors.EVENT_READ)
    closed: list[float] = []
    deadline = time.monotonic() + seconds
    while len(closed) < count and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=max(0.0, min(0.5, deadline - time.monotonic()))):
            c = key.fileobj
            try:
                data = c.recv(4096)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            except BlockingIOError:
                continue
            if data:
                continue  # nothing is expected; whatever comes is not a close
            closed.append(time.monotonic())
            sel.unregister(c)
            c.close()
    still_open = count - len(closed)
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    print(json.dumps({"closed": closed, "open": still_open}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
