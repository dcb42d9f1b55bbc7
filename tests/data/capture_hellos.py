#!/usr/bin/env python3
"""Capture real TLS ClientHello messages for the preread parser tests.

For each client below: listen on 127.0.0.1 (port chosen by the kernel), start
the client against that port, record what it sends until its ClientHello is
complete (or 2 seconds pass), stop the client and write tests/data/hello_*.bin.
Nothing answers the client, so no handshake ever completes.

Also writes synthetic variants made from a captured hello (the same handshake
message re-framed into several TLS records).

Usage: python3 tests/data/capture_hellos.py [OUTPUT_DIR]
Needs: openssl, curl, python3 (standard library only).
"""

import os
import shutil
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CAPTURE_SECONDS = 2.0
CONNECT_SECONDS = 5.0


def hello_end(buf):
    """Offset just past the record that completes the ClientHello, or None.

    Only walks record framing: the parser under test does the validation."""
    pos = 0
    hs = bytearray()
    while pos + 5 <= len(buf):
        if buf[pos] != 22:
            raise ValueError("client sent a non-handshake record first")
        length = int.from_bytes(buf[pos + 3:pos + 5], "big")
        if pos + 5 + length > len(buf):
            return None
        hs += buf[pos + 5:pos + 5 + length]
        pos += 5 + length
        if len(hs) >= 4 and len(hs) >= 4 + int.from_bytes(hs[1:4], "big"):
            return pos
    return None


def capture(argv_for_port):
    """Runs the client made by argv_for_port(port); returns its hello or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        port = lsock.getsockname()[1]
        proc = subprocess.Popen(argv_for_port(port), stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            conn = accept(lsock, proc)
            if conn is None:
                return None
            with conn:
                return read_hello(conn)
        finally:
            proc.kill()
            proc.wait()


def accept(lsock, proc):
    """Waits for the client to connect; None if it gave up first."""
    deadline = time.monotonic() + CONNECT_SECONDS
    lsock.settimeout(0.1)
    while time.monotonic() < deadline:
        try:
            conn, _ = lsock.accept()
            return conn
        except socket.timeout:
            if proc.poll() is not None:
                return None
    return None


def read_hello(conn):
    buf = bytearray()
    deadline = time.monotonic() + CAPTURE_SECONDS
    while True:
        end = hello_end(buf)
        if end is not None:
            return bytes(buf[:end])
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        conn.settimeout(left)
        try:
            chunk = conn.recv(65536)
        except socket.timeout:
            return None
        if not chunk:
            return None
        buf += chunk


def reframe(hello, size, version=b"\x03\x01"):
    """The handshake bytes of `hello` re-framed into records of `size` bytes."""
    hs = bytearray()
    pos = 0
    while pos < len(hello):
        length = int.from_bytes(hello[pos + 3:pos + 5], "big")
        hs += hello[pos + 5:pos + 5 + length]
        pos += 5 + length
    out = bytearray()
    for i in range(0, len(hs), size):
        part = hs[i:i + size]
        out += bytes([22]) + version + len(part).to_bytes(2, "big") + part
    return bytes(out)


def s_client(*args):
    return lambda port: ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", *args]


PYTHON_CLIENT = r"""
import socket, ssl, sys
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(["h2", "http/1.1"])
with socket.create_connection(("127.0.0.1", int(sys.argv[1]))) as s:
    with ctx.wrap_socket(s, server_hostname="python.example.net") as t:
        pass
"""


def curl(*args, host="curl.example.org"):
    return lambda port: ["curl", "-sk", "--max-time", "5",
                         "--resolve", f"{host}:{port}:127.0.0.1", *args,
                         f"https://{host}:{port}/"]


# name -> (client, required). Names and expected SNI / ALPN are listed in
# README.md beside this script; the unit tests hold the same table.
CLIENTS = {
    "openssl_tls12_sni": (s_client("-tls1_2", "-servername", "tls12.example.com"), True),
    "openssl_tls12_nosni": (s_client("-tls1_2", "-noservername"), True),
    "openssl_tls12_alpn": (s_client("-tls1_2", "-servername", "alpn12.example.com",
                                    "-alpn", "h2,http/1.1"), True),
    "openssl_tls13_sni": (s_client("-tls1_3", "-servername", "tls13.example.com"), True),
    "openssl_tls13_nosni": (s_client("-tls1_3", "-noservername"), True),
    "openssl_tls13_alpn": (s_client("-tls1_3", "-servername", "alpn13.example.com",
                                    "-alpn", "h2,http/1.1"), True),
    # A 1 KiB ffdhe8192 key share: the size class of post-quantum hybrid hellos,
    # from a real client this openssl can run.
    "openssl_large_keyshare": (s_client("-tls1_3", "-groups", "ffdhe8192:x25519",
                                        "-servername", "large.example.com",
                                        "-alpn", "h2,http/1.1"), True),
    "python_ssl": (lambda port: [sys.executable, "-c", PYTHON_CLIENT, str(port)], True),
    "curl": (curl(), True),
    "curl_http11": (curl("--http1.1", host="h1.curl.example.org"), True),
}

# Post-quantum hybrid key shares make hellos of well over 1 KiB. Names differ
# between OpenSSL releases (and providers); the first one this openssl accepts
# is used, and the file is skipped when none is supported.
PQ_GROUPS = ["X25519MLKEM768", "x25519_mlkem768", "X25519Kyber768Draft00", "x25519_kyber768"]


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else HERE
    for tool in ("openssl", "curl"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found (Debian: apt-get install {tool})")

    written = {}
    for name, (client, required) in CLIENTS.items():
        hello = capture(client)
        if hello is None:
            if required:
                sys.exit(f"{name}: no complete ClientHello captured")
            continue
        written[name] = hello

    for group in PQ_GROUPS:
        hello = capture(s_client("-tls1_3", "-groups", group, "-servername", "pq.example.com"))
        if hello is not None:
            written["openssl_pq"] = hello
            print(f"openssl_pq: group {group}")
            break
    else:
        print("openssl_pq: skipped, this openssl supports none of " + ", ".join(PQ_GROUPS))

    # The handshake of a captured hello with SNI and ALPN, split over records
    # of 100 bytes (the way a large hello crosses record boundaries).
    written["multirecord_100"] = reframe(written["openssl_tls13_alpn"], 100)

    for name, data in written.items():
        path = os.path.join(out_dir, f"hello_{name}.bin")
        with open(path, "wb") as f:
            f.write(data)
        print(f"{path}: {len(data)} bytes")


if __name__ == "__main__":
    main()
