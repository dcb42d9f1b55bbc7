#!/usr/bin/env python3
"""Demo backends for conf/sluice.toml: small TCP servers on 127.0.0.1 that
greet with their name, then echo every line back prefixed with it.

    tools/demo_backends.py 9101 9102 9103
"""
import signal
import socket
import sys
import threading


def serve(port: int) -> None:
    name = f"backend-{port}"
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(128)

    def handle(conn: socket.socket) -> None:
        with conn:
            conn.sendall(f"hello from {name}\n".encode())
            buf = b""
            while True:
                data = conn.recv(65536)
                if not data:
                    break
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    conn.sendall(f"{name}: ".encode() + line + b"\n")
            if buf:
                conn.sendall(f"{name}: ".encode() + buf)

    while True:
        conn, _ = srv.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def main() -> None:
    ports = [int(p) for p in sys.argv[1:]] or [9101, 9102, 9103]
    for port in ports:
        threading.Thread(target=serve, args=(port,), daemon=True).start()
    print("demo backends on " + ", ".join(f"127.0.0.1:{p}" for p in ports), flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    main()
